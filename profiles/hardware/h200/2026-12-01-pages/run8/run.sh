#!/bin/bash
# Run 8: with buffers of whole 2 MiB pages: bench kernels, the default tune, check --measure,
# the GPU tests. Packed into one archive.
B=$PWD/.carry/r7
export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/artune-cache
W=/tmp/run8; mkdir -p $W
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $W/env.txt 2>&1
cd /tmp
( time timeout 100 $B/artune bench kernels --loopback 8 ) > $W/bench-kernels.txt 2>&1; echo "exit $?" >> $W/bench-kernels.txt
( time timeout -s INT 120 $B/artune tune --loopback 8 --out $W/fast.json ) > $W/tune-fast.txt 2>&1; echo "exit $?" >> $W/tune-fast.txt
( time timeout -s INT 60 $B/artune check $W/fast.json --measure --loopback 8 ) > $W/check-measure.txt 2>&1; echo "exit $?" >> $W/check-measure.txt
timeout 200 $B/gpu --test-threads=1 --nocapture > $W/gpu-tests.log 2>&1; echo "exit $?" >> $W/gpu-tests.log
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $W/env.txt
cd $W && tar czf $OUT/run8.tgz .
