#!/bin/bash
# Run 19: the tree in `tree` (release after a failed setup, one deadline per exchange, bounded kill): the GPU
# tests, then a default tune and check --measure. Packed after each step.
B=$PWD/.carry/r19
export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/artune-cache
W=/tmp/run19; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run19.tgz .); }
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $W/env.txt 2>&1
cd /tmp
timeout 200 $B/gpu --test-threads=1 --nocapture > $W/gpu-tests.log 2>&1; echo "exit $?" >> $W/gpu-tests.log
pack
step() { # name timeout args...
  n=$1; t=$2; shift 2
  ( time timeout -s INT $t $B/artune "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack
}
step tune-fast-1 60 tune --loopback 8 --out $W/fast1.json
step check-measure-1 30 check $W/fast1.json --measure --loopback 8
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $W/env.txt
pack
