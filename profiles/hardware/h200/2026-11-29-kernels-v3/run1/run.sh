#!/bin/bash
# v3 run: GPU tests on variant B, then the kernel benchmark round-robin over A (HEAD kernels),
# B (evict-first outputs + discard of read slot lines), C (evict-first outputs only).
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; } > $OUT/date.txt 2>&1
timeout 90 ./gpu-tests --test-threads=4 --nocapture > $OUT/gpu-tests-v3.log 2>&1; echo "tests rc=$?"
grep -E "test result|panicked|FAILED|error" $OUT/gpu-tests-v3.log | cut -c1-200 | head -20
for r in 1 2; do for v in B A C; do
  timeout 70 ./$v/artune bench kernels --loopback 8 --out $OUT/bench-$v-$r.json > $OUT/bench-$v-$r.txt 2>&1; echo "bench $v $r rc=$?"
  grep -E "^two_stage_push .* (4K|16M|64M) " $OUT/bench-$v-$r.txt; grep -E "copy ceiling" $OUT/bench-$v-$r.txt
done; done
date -u >> $OUT/date.txt
