#!/bin/bash
# Run 4: the GPU tests on the final tree; a second fast and a second exhaustive tune (the
# reference against itself); check --measure on both fast profiles; bench kernels; NCCL's
# eager drift with and without the processes pinned to four CPUs.
B=$PWD/.carry/r4
export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/artune-cache
R3=$PWD/profiles/hardware/h200/2026-12-01-tuning-time/run3
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $OUT/env.txt 2>&1
cd /tmp
( time timeout -s INT 120 $B/artune tune --loopback 8 --out $OUT/fast.json ) > $OUT/tune-fast.txt 2>&1; echo "exit $?" >> $OUT/tune-fast.txt
( time timeout -s INT 200 $B/artune tune --loopback 8 --exhaustive --out $OUT/exhaustive.json ) > $OUT/tune-exhaustive.txt 2>&1; echo "exit $?" >> $OUT/tune-exhaustive.txt
( time timeout -s INT 60 $B/artune check $OUT/fast.json --measure --loopback 8 ) > $OUT/check-measure-run4.txt 2>&1; echo "exit $?" >> $OUT/check-measure-run4.txt
( time timeout -s INT 60 $B/artune check $R3/fast.json --measure --loopback 8 ) > $OUT/check-measure-run3.txt 2>&1; echo "exit $?" >> $OUT/check-measure-run3.txt
for pin in none 4-7; do for i in 1 2; do
  if [ $pin = none ]; then P=""; else P="taskset -c $pin"; fi
  ( time timeout 60 $P $B/artune tune --loopback 8 --tp 8 --mode eager --sizes 32K:1M --no-contention --out $OUT/eager-$pin-$i.json ) > $OUT/eager-$pin-$i.txt 2>&1
done; done
echo "bench $(date -u +%T)" >> $OUT/env.txt
( time timeout 100 $B/artune bench kernels --loopback 8 ) > $OUT/bench-kernels.txt 2>&1; echo "exit $?" >> $OUT/bench-kernels.txt
echo "tests $(date -u +%T)" >> $OUT/env.txt
timeout 230 $B/gpu --test-threads=1 --nocapture > $OUT/gpu-tests.log 2>&1; echo "exit $?" >> $OUT/gpu-tests.log
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $OUT/env.txt
