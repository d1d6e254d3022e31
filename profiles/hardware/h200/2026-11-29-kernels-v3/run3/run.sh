#!/bin/bash
cd "$(dirname "$0")"
R=/tmp/r5; mkdir -p $R
for r in 1 2 3; do for v in P0 P3 P4; do
  timeout 40 ./$v bench kernels --loopback 8 --backend two_stage_push --sizes 4M:64M --json > $R/tsp-$v-$r.json 2> $R/tsp-$v-$r.err
  python3 -c "
import json,sys
d=json.load(open('$R/tsp-$v-$r.json'))
print('$v $r', 'peak %.0f'%d['copy_peak_gbps'], ' '.join('%s/%s %.1fus %.1f%%'%(x['bytes_per_rank']>>20, x['mode'][0], x['us_per_call'], 100*x['efficiency']) for x in d['results']))
" 2>&1 | tail -1
done; done
tar czf $OUT/r5.tgz -C /tmp r5
