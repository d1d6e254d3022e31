#!/bin/bash
# Issue 47, loopback on one GPU (nothing here is multi-GPU evidence): does a one-call graph
# cost NCCL more per replay than it costs a custom kernel whose ranks also wait for each
# other? benches/nccl_graph_calls.py with --artune (the op forced to one_stage_pull, its
# captured calls registered), 2 then 4 ranks under MPS with each process held to its share
# of the SMs, NCCL 2.32.6 by LD_PRELOAD, graph mixing off then on.
#   C=.carry/s64 WC=.carry/s64w END=300 bash profiles/hardware/h200/2026-12-06-graph-calls/run2.sh
set -u
R=$PWD; C=${C:?}; WC=${WC:?}; W=/tmp/gc2; S=$(date +%s); END=${END:-300}
rm -rf $W; mkdir -p $W/py
pack() { (cd $W && tar czf $OUT/run2.tgz --exclude ./py --exclude ./bin --exclude ./kc --exclude ./mps .); }
. $R/profiles/hardware/lib.sh
bash $C/unpack.sh $W/bin > $W/unpack.txt 2>&1 || { cat $W/unpack.txt; exit 1; }
A=$W/bin/artune; N=/tmp/nccl232/libnccl.so.2
PY=/opt/torch/.venv/bin/python
export ARTUNE_CACHE_DIR=$W/kc ARTUNE_BIN=$A PYTHONPATH=$W/py
describe
$PY -m pip install -q --no-deps --target $W/py $WC/artune-*.whl >> $W/env.txt 2>&1
cd /tmp
for k in 2 4; do
  step tune$k 40 $A tune --loopback $k --tp $k --sizes 1K:1M --no-contention --out $W/profile$k.json
done
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1
for k in 2 4; do
  G="env LD_PRELOAD=$N NCCL_MULTI_RANK_GPU_ENABLE=1 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / k))"
  T="$PY -m torch.distributed.run --standalone --nproc-per-node $k $R/benches/nccl_graph_calls.py"
  step graph$k-op-nomix 70 $G NCCL_GRAPH_MIXING_SUPPORT=0 $T --artune $W/profile$k.json --out $W/graph$k-op-nomix.json
  step graph$k-op 70 $G $T --artune $W/profile$k.json --out $W/graph$k-op.json
done
echo "end after $(( $(date +%s) - S )) s" >> $W/env.txt
pack
