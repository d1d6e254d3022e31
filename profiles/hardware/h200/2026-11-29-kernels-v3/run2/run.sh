#!/bin/bash
# v4 run: GPU tests with PDL launches; two_stage_push 16M/64M round-robin over variants;
# the full kernel benchmark of P0 (baseline kernels + PDL).
cd "$(dirname "$0")"
R=/tmp/r4; mkdir -p $R
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; } > $R/env.txt 2>&1
timeout 100 ./gpu-tests-pdl --test-threads=4 --nocapture > $R/gpu-tests-pdl.log 2>&1; echo "tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests-pdl.log | cut -c1-200 | head -20
for r in 1 2 3; do for v in V0 V1 V2 P0 P1 P2; do
  timeout 40 ./$v bench kernels --loopback 8 --backend two_stage_push --sizes 16M:64M --json > $R/tsp-$v-$r.json 2> $R/tsp-$v-$r.err
  python3 -c "
import json,sys
d=json.load(open('$R/tsp-$v-$r.json'))
print('$v $r', 'peak %.0f'%d['copy_peak_gbps'], ' '.join('%s/%s %.1fus %.1f%%'%(x['bytes_per_rank']>>20, x['mode'][0], x['us_per_call'], 100*x['efficiency']) for x in d['results']))
" 2>&1 | tail -1
done; done
timeout 90 ./P0 bench kernels --loopback 8 --out $R/bench-P0.json > $R/bench-P0.txt 2>&1; echo "full P0 rc=$?"
grep -A9 "^targets" $R/bench-P0.txt
grep -E " 4K " $R/bench-P0.txt
date -u >> $R/env.txt
tar czf $OUT/r4.tgz -C /tmp r4
