#!/bin/bash
# v7: where kernels trigger the next programmatic launch. a: at the start of every kernel
# (the v6 binary); b: at the end of every kernel; d: at the start of LL kernels, at the end
# of bandwidth kernels. GPU tests for b and d; full kernel benchmark a, b, d, b, d.
cd "$(dirname "$0")"
R=/tmp/r7; mkdir -p $R
{ date -u; nvidia-smi --query-gpu=name,driver_version,pci.bus_id,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; } > $R/env.txt 2>&1
for v in b d; do
  timeout 80 ./$v/gpu-tests --test-threads=4 --nocapture > $R/gpu-tests-$v.log 2>&1; echo "tests $v rc=$?" | tee -a $R/gpu-tests-$v.log
  grep -E "test result|panicked|FAILED" $R/gpu-tests-$v.log | cut -c1-200
done
date -u >> $R/env.txt
run() { timeout 80 $2 bench kernels --loopback 8 --out $R/bench-$1.json > $R/bench-$1.txt 2>&1; echo "bench $1 rc=$?"; grep -E "two_stage_push .*(16M)|worst|4K graph" $R/bench-$1.txt | head -9; }
run a1 ./a-artune; run b1 ./b/artune; run d1 ./d/artune; run b2 ./b/artune; run d2 ./d/artune
date -u >> $R/env.txt
tar czf $OUT/r7.tgz -C /tmp r7
