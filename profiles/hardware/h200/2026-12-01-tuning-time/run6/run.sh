#!/bin/bash
# Run 6 (the final tree): the GPU tests, the default loopback tune and check --measure on it.
B=$PWD/.carry/r6
export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/artune-cache
W=/tmp/run6; mkdir -p $W
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; git log -1 --format=%h 2>/dev/null; } > $W/env.txt 2>&1
cd /tmp
( time timeout -s INT 120 $B/artune tune --loopback 8 --out $W/fast.json ) > $W/tune-fast.txt 2>&1; echo "exit $?" >> $W/tune-fast.txt
( time timeout -s INT 60 $B/artune check $W/fast.json --measure --loopback 8 ) > $W/check-measure.txt 2>&1; echo "exit $?" >> $W/check-measure.txt
timeout 230 $B/gpu --test-threads=1 --nocapture > $W/gpu-tests.log 2>&1; echo "exit $?" >> $W/gpu-tests.log
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $W/env.txt
cd $W && tar czf $OUT/run6.tgz .
