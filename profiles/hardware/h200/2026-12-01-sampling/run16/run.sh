#!/bin/bash
# Run 16: the final tree (see tree): a default tune, a reference, a second default tune,
# check --measure on the first, then the GPU tests. Packed after each step.
B=$PWD/.carry/r16
export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/artune-cache
W=/tmp/run16; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run16.tgz .); }
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $W/env.txt 2>&1
cd /tmp
step() { # name timeout args...
  n=$1; t=$2; shift 2
  ( time timeout -s INT $t $B/artune "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack
}
step tune-fast-1 60 tune --loopback 8 --out $W/fast1.json
step tune-exhaustive-1 140 tune --loopback 8 --exhaustive --out $W/exhaustive1.json
step tune-fast-2 60 tune --loopback 8 --out $W/fast2.json
step check-measure-1 30 check $W/fast1.json --measure --loopback 8
timeout 150 $B/gpu --test-threads=1 --nocapture > $W/gpu-tests.log 2>&1; echo "exit $?" >> $W/gpu-tests.log
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $W/env.txt
pack
