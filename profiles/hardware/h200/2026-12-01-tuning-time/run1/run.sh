#!/bin/bash
# Run 1 of this session: full default loopback tune with GPU-side verification and racing,
# check --measure on its profile, then the GPU tests.
B=$PWD/.carry/r1
export ARTUNE_BIN=$B/artune
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $OUT/env.txt 2>&1
cd /tmp
echo "tune start $(date -u +%T)" >> $OUT/env.txt
( time timeout -s INT 250 $B/artune tune --loopback 8 --out $OUT/full.json ) > $OUT/tune-full.txt 2>&1; echo "exit $?" >> $OUT/tune-full.txt
$B/artune show $OUT/full.json > $OUT/show-full.txt 2>&1
echo "check start $(date -u +%T)" >> $OUT/env.txt
( time timeout -s INT 60 $B/artune check $OUT/full.json --measure --loopback 8 ) > $OUT/check-measure.txt 2>&1; echo "exit $?" >> $OUT/check-measure.txt
echo "tests start $(date -u +%T)" >> $OUT/env.txt
timeout 230 $B/gpu --test-threads=1 --nocapture > $OUT/gpu-tests.log 2>&1; echo "exit $?" >> $OUT/gpu-tests.log
echo "end $(date -u +%T)" >> $OUT/env.txt
echo "workers left: $(ps aux | grep __worker | grep -vc grep)" >> $OUT/env.txt
