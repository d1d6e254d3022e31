#!/bin/bash
# Run 3: the fast default and the exhaustive reference of `tune --loopback 8`, then
# check --measure on the fast profile; -v and worker logs for where start-up goes.
B=$PWD/.carry/r3
export ARTUNE_CACHE_DIR=/tmp/artune-cache
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,persistence_mode,clocks.sm,clocks.max.sm --format=csv; } > $OUT/env.txt 2>&1
cd /tmp
echo "fast $(date -u +%T)" >> $OUT/env.txt
( time RUST_LOG=artune=info timeout -s INT 120 $B/artune tune --loopback 8 --out $OUT/fast.json ) > $OUT/tune-fast.txt 2>&1; echo "exit $?" >> $OUT/tune-fast.txt
echo "exhaustive $(date -u +%T)" >> $OUT/env.txt
( time timeout -s INT 330 $B/artune tune --loopback 8 --exhaustive --out $OUT/exhaustive.json ) > $OUT/tune-exhaustive.txt 2>&1; echo "exit $?" >> $OUT/tune-exhaustive.txt
echo "check $(date -u +%T)" >> $OUT/env.txt
for i in 1 2; do
( time RUST_LOG=artune=info timeout -s INT 60 $B/artune check $OUT/fast.json --measure --loopback 8 ) > $OUT/check-measure-$i.txt 2>&1; echo "exit $?" >> $OUT/check-measure-$i.txt
done
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $OUT/env.txt
