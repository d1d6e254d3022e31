#!/bin/bash
# Issue 42: one_stage_push's LL form reading its status at the start instead of after its polls
# (b0ccda9), A/B on one machine: `bench kernels --sizes 4K:16K` alternating the binary before
# (artune-old, 3085e4a) and after, five times each; then the GPU tests that run that kernel,
# its fault path included (139c1d6: a peer that never arrives). Loopback: 8 virtual ranks on one
# GPU; the op tests two processes. Nothing here is multi-GPU evidence.
#   bash .carry/s62/unpack.sh /tmp/s62 && C=/tmp/s62 END=400 bash profiles/hardware/h200/2026-12-05-ab11/run.sh
set -u
R=$PWD; C=${C:?set C}; END=${END:-400}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/ab11; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/ab11-cache
pack() { (cd $W && tar czf $OUT/ab11.tgz .); }
. $R/profiles/hardware/lib.sh
describe
pack
cd /tmp || exit 1
# Each binary compiles its own kernels once before the timed runs (the cache holds both).
step warm-old 30 $C/artune-old bench kernels --loopback 8 --sizes 4K:4K --backend one_stage_push
step warm-new 30 $A bench kernels --loopback 8 --sizes 4K:4K --backend one_stage_push
for i in 1 2 3 4 5; do
  step old$i 15 $C/artune-old bench kernels --loopback 8 --sizes 4K:16K --backend one_stage_push --backend one_stage_pull --out $W/old$i.json
  step new$i 15 $A bench kernels --loopback 8 --sizes 4K:16K --backend one_stage_push --backend one_stage_pull --out $W/new$i.json
done
summary() { { for v in old new; do for i in 1 2 3 4 5; do [ -f $W/$v$i.json ] || continue
    printf '%s%s ' $v $i; python3 -c "
import json,sys
d=json.load(open('$W/$v$i.json'))
rows=[r for r in d['results'] if r['mode']=='graph']
print('  '.join('%s %s %.2f us'%(r['backend'],r['bytes_per_rank'],r['us_per_call']) for r in rows))" 2>&1; done; done; } > $W/summary.txt; pack; }
summary
export ARTUNE_BIN=$A
step gpu 240 $C/gpu --test-threads 1 gpu_an_op_ll_call gpu_an_op_copy_call gpu_one_stage_push_ll gpu_custom_kernels_verify gpu_repeated_calls gpu_flat_kernels_replay gpu_hung_kernel
grep -h "^test \|test result\|rank 0:" $W/gpu.txt >> $W/summary.txt; date -u >> $W/env.txt; pack
