#!/bin/bash
# Issues 47 and 42 in one call, loopback on one GPU (nothing here is multi-GPU evidence):
#   1. benches/nccl_graph_calls.py: what a CUDA graph around NCCL costs per call by how many
#      calls it holds (1, 10, 100), with NCCL 2.32.6 (several ranks on the one GPU need >= 2.30
#      and NCCL_MULTI_RANK_GPU_ENABLE=1) under MPS, 2 then 4 ranks, graph mixing on (NCCL's
#      default) and off (NCCL_GRAPH_MIXING_SUPPORT=0): `nccl_per_replay_us` is the fixed cost of
#      one replay that MODEL-ERROR.md's candidate mechanism for R1's NCCL column would price.
#   2. benches/op_pieces.py and benches/op_overhead.py, one rank, without MPS: where the op's
#      eager call spends its host time, beside the raw launch; then both again pinned to one
#      core (taskset -c 2).
# From the repository root, with C holding the carry (.carry/s64: unpack.sh, binaries, NCCL)
# and W_C the wheel's folder (.carry/s64w):
#   C=.carry/s64 WC=.carry/s64w END=540 bash profiles/hardware/h200/2026-12-06-graph-calls/run1.sh
# Results: $OUT/run.tgz (unpacked into run1/), re-packed after each step.
set -u
R=$PWD; C=${C:?}; WC=${WC:?}; W=/tmp/gc; S=$(date +%s); END=${END:-540}
rm -rf $W; mkdir -p $W/py
pack() { (cd $W && tar czf $OUT/run.tgz --exclude ./py --exclude ./bin --exclude ./kc --exclude ./mps .); }
. $R/profiles/hardware/lib.sh
bash $C/unpack.sh $W/bin > $W/unpack.txt 2>&1 || { cat $W/unpack.txt; exit 1; }
A=$W/bin/artune; N=/tmp/nccl232/libnccl.so.2
PY=/opt/torch/.venv/bin/python
export ARTUNE_CACHE_DIR=$W/kc ARTUNE_BIN=$A PYTHONPATH=$W/py
describe
{ cat /proc/cpuinfo | grep -m1 "model name"; sha256sum $WC/artune-*.whl
  $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  LD_PRELOAD=$N $PY -c "import torch; print('preloaded nccl', torch.cuda.nccl.version())"
} >> $W/env.txt 2>&1
$PY -m pip install -q --no-deps --target $W/py $WC/artune-*.whl >> $W/env.txt 2>&1
cd /tmp
# 1 under MPS.
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1
G="env LD_PRELOAD=$N NCCL_MULTI_RANK_GPU_ENABLE=1"
for k in 2 4; do
  step graph$k 60 $G $PY -m torch.distributed.run --standalone --nproc-per-node $k \
    $R/benches/nccl_graph_calls.py --out $W/graph$k.json
  step graph$k-nomix 60 $G NCCL_GRAPH_MIXING_SUPPORT=0 $PY -m torch.distributed.run --standalone \
    --nproc-per-node $k $R/benches/nccl_graph_calls.py --out $W/graph$k-nomix.json
done
echo quit | nvidia-cuda-mps-control; trap - EXIT; sleep 1
# 2, without MPS: the op's host pieces.
step tune 40 $A tune --loopback 2 --tp 2 --sizes 4K:1M --no-contention --out $W/profile.json
T="$PY -m torch.distributed.run --standalone --nproc-per-node 1"
step pieces 50 $T $R/benches/op_pieces.py --profile $W/profile.json --out $W/pieces.json
step overhead 40 $T $R/benches/op_overhead.py --profile $W/profile.json --out $W/overhead.json
step pieces-core2 50 taskset -c 2 $T $R/benches/op_pieces.py --profile $W/profile.json --out $W/pieces-core2.json
step overhead-core2 40 taskset -c 2 $T $R/benches/op_overhead.py --profile $W/profile.json --out $W/overhead-core2.json
echo "end after $(( $(date +%s) - S )) s" >> $W/env.txt
pack
