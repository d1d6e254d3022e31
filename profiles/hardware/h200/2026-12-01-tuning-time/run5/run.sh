#!/bin/bash
# Run 5 (final tree): the fast default and the exhaustive reference of `tune --loopback 8`,
# check --measure on the new and on run 3's profile, bench kernels, the GPU tests, and NCCL's
# eager drift with and without pinning to four CPUs. Everything is packed into one archive.
B=$PWD/.carry/r4
export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/artune-cache
R3=$PWD/profiles/hardware/h200/2026-12-01-tuning-time/run3
W=/tmp/run5; mkdir -p $W
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,persistence_mode,clocks.sm,clocks.max.sm --format=csv; nproc; } > $W/env.txt 2>&1
cd /tmp
echo "fast $(date -u +%T)" >> $W/env.txt
( time RUST_LOG=artune=info timeout -s INT 120 $B/artune tune --loopback 8 --out $W/fast.json ) > $W/tune-fast.txt 2>&1; echo "exit $?" >> $W/tune-fast.txt
$B/artune show $W/fast.json > $W/show-fast.txt 2>&1
echo "exhaustive $(date -u +%T)" >> $W/env.txt
( time timeout -s INT 200 $B/artune tune --loopback 8 --exhaustive --out $W/exhaustive.json ) > $W/tune-exhaustive.txt 2>&1; echo "exit $?" >> $W/tune-exhaustive.txt
echo "check $(date -u +%T)" >> $W/env.txt
for i in 1 2; do
( time RUST_LOG=artune=info timeout -s INT 60 $B/artune check $W/fast.json --measure --loopback 8 ) > $W/check-measure-$i.txt 2>&1; echo "exit $?" >> $W/check-measure-$i.txt
done
( time timeout -s INT 60 $B/artune check $R3/fast.json --measure --loopback 8 ) > $W/check-measure-run3-profile.txt 2>&1; echo "exit $?" >> $W/check-measure-run3-profile.txt
for pin in none 4-7; do for i in 1 2; do
  if [ $pin = none ]; then P=""; else P="taskset -c $pin"; fi
  ( time timeout 60 $P $B/artune tune --loopback 8 --tp 8 --mode eager --sizes 32K:1M --no-contention --out $W/eager-pin-$pin-$i.json ) > $W/eager-pin-$pin-$i.txt 2>&1
done; done
echo "bench $(date -u +%T)" >> $W/env.txt
( time timeout 100 $B/artune bench kernels --loopback 8 ) > $W/bench-kernels.txt 2>&1; echo "exit $?" >> $W/bench-kernels.txt
echo "tests $(date -u +%T)" >> $W/env.txt
timeout 230 $B/gpu --test-threads=1 --nocapture > $W/gpu-tests.log 2>&1; echo "exit $?" >> $W/gpu-tests.log
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $W/env.txt
cd $W && tar czf $OUT/run5.tgz .
