#!/bin/bash
# Run 9 (final tree, whole 2 MiB pages in DevBuf::alloc): the default tune, check --measure,
# the exhaustive reference, a second check, then the GPU tests. Packed after each step.
B=$PWD/.carry/r9
export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/artune-cache
W=/tmp/run9; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run9.tgz .); }
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $W/env.txt 2>&1
cd /tmp
( time timeout -s INT 60 $B/artune tune --loopback 8 --out $W/fast.json ) > $W/tune-fast.txt 2>&1; echo "exit $?" >> $W/tune-fast.txt
( time timeout -s INT 30 $B/artune check $W/fast.json --measure --loopback 8 ) > $W/check-measure-1.txt 2>&1; echo "exit $?" >> $W/check-measure-1.txt
pack
( time timeout -s INT 100 $B/artune tune --loopback 8 --exhaustive --out $W/exhaustive.json ) > $W/tune-exhaustive.txt 2>&1; echo "exit $?" >> $W/tune-exhaustive.txt
( time timeout -s INT 30 $B/artune check $W/fast.json --measure --loopback 8 ) > $W/check-measure-2.txt 2>&1; echo "exit $?" >> $W/check-measure-2.txt
pack
timeout 115 $B/gpu --test-threads=1 --nocapture > $W/gpu-tests.log 2>&1; echo "exit $?" >> $W/gpu-tests.log
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $W/env.txt
pack
