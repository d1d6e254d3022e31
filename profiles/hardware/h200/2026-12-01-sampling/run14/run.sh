#!/bin/bash
# Run 14: is NCCL's eager drift the 8 workers on 16 CPUs? Eager-only references with 2 ranks
# (--loopback 2) and with TP2 among 8 ranks (--loopback 8 --tp 2), twice each, plus default tunes.
B=$PWD/.carry/r14
export ARTUNE_CACHE_DIR=/tmp/artune-cache
W=/tmp/run14; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run14.tgz .); }
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; nproc; } > $W/env.txt 2>&1
cd /tmp
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT $t $B/artune "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
for i in 1 2; do
  step l2-fast-$i 60 tune --loopback 2 --mode eager --out $W/l2-fast$i.json
  step l2-exhaustive-$i 90 tune --loopback 2 --mode eager --exhaustive --out $W/l2-exhaustive$i.json
  step l8tp2-exhaustive-$i 90 tune --loopback 8 --tp 2 --mode eager --exhaustive --out $W/l8tp2-exhaustive$i.json
done
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $W/env.txt
pack
