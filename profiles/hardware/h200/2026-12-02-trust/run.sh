#!/bin/bash
# Run 20 (2026-12-02): the merged tree on the H200, for issue #24's evidence (and #27's GPU
# tests again). Binaries in .carry/final; everything kept under $W and packed after each step.
R=$PWD; B=$R/.carry/final
export ARTUNE_BIN=$B/artune
W=/tmp/run20; mkdir -p $W
PY=/opt/torch/.venv/bin/python
pack() { (cd $W && tar czf $OUT/run20.tgz .); }
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $W/env.txt 2>&1
cd /tmp
step() { # name timeout args... (env set by the caller's `env`)
  n=$1; t=$2; shift 2
  ( time timeout -s INT $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack
}
A=$B/artune
# 1. Tune time: two cold (empty kernel cache) and one warm default tunes.
step cold1 90 env ARTUNE_CACHE_DIR=/tmp/cache1 $A -v tune --loopback 8 --out $W/cold1.json
step cold2 90 env ARTUNE_CACHE_DIR=/tmp/cache2 $A -v tune --loopback 8 --out $W/cold2.json
export ARTUNE_CACHE_DIR=/tmp/cache2
step warm 90 $A tune --loopback 8 --out $W/fresh.json
# 2. 20 back-to-back checks of the fresh profile (both modes).
for i in $(seq -w 1 20); do step check-$i 60 $A check $W/fresh.json --measure --loopback 8; done
# 3. Real changes: a chosen kernel made 3x slower; a changed NCCL variable.
K=$($PY -c "import json,collections;p=json.load(open('$W/fresh.json'));c=collections.Counter(b['choice'] for g in p['groups'] for b in g['buckets'] if not b['choice'].startswith('nccl'));print(c.most_common(1)[0][0])")
echo "slowed: $K" >> $W/env.txt
step check-slow3 60 env ARTUNE_CUDA_FAULTS=slow=$K:3 $A check $W/fresh.json --measure --loopback 8
step check-nccl-env 60 env NCCL_PROTO=Simple $A check $W/fresh.json --measure --loopback 8
# 4. A worker killed 9 s into a tune.
( time timeout 120 $A tune --loopback 8 --out $W/killed.json ) > $W/kill.txt 2>&1 &
T=$!; sleep 9; V=$(pgrep -f '__worker' | head -1); echo "killing worker pid $V at $(date -u +%T)" >> $W/kill.txt
kill -9 $V; wait $T; echo "exit $?" >> $W/kill.txt
step kill-show 20 $A show $W/killed.json
# 5. A matmul neighbour on the GPU: refused, then --allow-busy (recorded), doctor meanwhile.
$PY -c "
import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)
t=time.time()
while time.time()-t<150: a@a
" > $W/neighbour.txt 2>&1 &
N=$!; sleep 8
nvidia-smi > $W/nvidia-smi-busy.txt 2>&1
step busy-refused 60 $A tune --loopback 8 --out $W/busy-refused.json
step busy-doctor 60 $A doctor
step busy-allowed 120 $A tune --loopback 8 --allow-busy --out $W/busy.json
step busy-show 20 $A show $W/busy.json
kill $N; wait $N 2>/dev/null
# 6. NCCL's own log on stdout does not break the worker protocol.
step nccl-info 60 env NCCL_DEBUG=INFO $A tune --loopback 4 --tp 4 --sizes 4K:64K --out $W/nccl-info.json
# 7. The GPU tests (probe growth with each rank launching its own kernels), time allowing.
if [ $SECONDS -lt 380 ]; then
  cd $R
  step gpu-tests-each 170 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1
fi
echo "end $(date -u +%T) after $SECONDS s; workers left: $(pgrep -fc __worker)" >> $W/env.txt
pack
