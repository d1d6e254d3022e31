#!/bin/bash
# Issue 35 on the H200: artune.allreduce, the kernels the profile timed run inside torch
# processes. A loopback tune records its kernels; then the op in 1, 2, 4 and 8 processes on the
# one GPU (a gloo group; CUDA IPC between the processes), eager and graph-captured, every
# result checked; timings beside the tune's; launch overhead; memory against the profile's;
# refusals (no kernel record, another image); a peer that dies mid-call. Several processes run
# their kernels at once on one GPU only under MPS, so 2, 4 and 8 processes run under a private
# MPS daemon (started here, stopped at the end); 2 processes also run without it (time slices).
# From the repository root, with .carry/op/ built by build-carry.sh beside this file:
#   bash profiles/hardware/h200/2026-12-03-op/run.sh
# Everything lands in $OUT/op-run.tgz, re-packed after each step (a cut run keeps what ran).
set -u
R=$PWD; C=$R/.carry/op; A=$C/artune; PY=/opt/torch/.venv/bin/python
W=/tmp/op-run; rm -rf $W; mkdir -p $W/py
export PYTHONPATH=$W/py ARTUNE_CACHE_DIR=$W/kcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
pack() { (cd $W && tar czf $OUT/op-run.tgz --exclude ./py --exclude ./kcache --exclude ./mps .); }
# torchrun stops its workers on SIGTERM (timeout's first signal); the workers also die with
# torchrun if it is killed (op_proof.py and op_overhead.py ask for that at start).
# Each step gets at most its limit and never past 570 s in all (the device tool's command limit
# is 600 s, and the MPS daemon must be stopped before it): a step with no time left is skipped.
# END and START (seconds used before this script began, in the same call) move that bound.
END=${END:-570}; START=${START:-0}
step() { n=$1; t=$2; shift 2; left=$((END - START - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 20 ]; then echo "skipped: no time left" > $W/$n.txt; return; fi
  ( time timeout -k 15 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
TR="$PY -m torch.distributed.run --standalone"
P=benches/op_proof.py
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.used --format=csv
  $PY -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
  $A --version; which nvidia-cuda-mps-control; nproc; } > $W/env.txt 2>&1
# The wheel's extension; the Python files are this tree's (the wheel may predate them).
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
cp python/artune/*.py $W/py/artune/ && echo "python files from $(git rev-parse --short HEAD 2>/dev/null || echo this tree)" >> $W/env.txt
step tune 150 $A tune --loopback 8 --tp 2,4,8 --islands 4,4 --sizes 4K:16M --no-contention --out $W/profile.json
$PY - "$W" >> $W/env.txt 2>&1 <<'PYEOF'
import json, sys
w = sys.argv[1]
p = json.load(open(f"{w}/profile.json"))
print("kernels recorded:", json.dumps(p.get("kernels")))
old = dict(p); old.pop("kernels", None)
json.dump(old, open(f"{w}/old.json", "w"))
t = json.loads(json.dumps(p))
img = t["kernels"][0]["programs"][0]
img["image_sha256"] = ("0" if img["image_sha256"][0] != "0" else "1") + img["image_sha256"][1:]
json.dump(t, open(f"{w}/tampered.json", "w"))
PYEOF
step refuse-tampered 90 $TR --nproc-per-node 2 $P --refusal --profile $W/tampered.json --out $W/refuse-tampered.json
step refuse-old 90 $TR --nproc-per-node 2 $P --refusal --profile $W/old.json --out $W/refuse-old.json
step refuse-nop2p 90 env ARTUNE_CUDA_FAULTS=noipc=0-1 $TR --nproc-per-node 2 $P --refusal --profile $W/profile.json --out $W/refuse-nop2p.json
step overhead 150 $TR --nproc-per-node 1 benches/op_overhead.py --profile $W/profile.json --out $W/overhead.json
step slice2 180 $TR --nproc-per-node 2 $P --profile $W/profile.json --out $W/slice2.json
# Under MPS: the processes' kernels run together, as ranks on separate GPUs would.
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
if nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; then
  for K in 2 4 8; do
    step mps$K 120 $TR --nproc-per-node $K $P --profile $W/profile.json --out $W/mps$K.json
    [ $K = 2 ] && echo get_server_list | nvidia-cuda-mps-control >> $W/mps-start.txt 2>&1
  done
else echo "MPS did not start: no mps steps" >> $W/mps-start.txt; fi
cp $W/mps/log/*.log $W/ 2>/dev/null
echo quit | nvidia-cuda-mps-control; trap - EXIT; sleep 1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
step nocache 120 env ARTUNE_CACHE_DIR= $TR --nproc-per-node 2 $P --refusal --profile $W/profile.json --out $W/nocache.json
step peer-dies 60 $TR --nproc-per-node 2 $P --peer-dies --profile $W/profile.json --out $W/peer-dies.json
# Without MPS, 4 processes take turns on the GPU: what a barrier then sees.
step slice4 60 $TR --nproc-per-node 4 $P --kernels one_stage_pull --sizes 4K --timing-sizes 4K --calls 2 --samples 2 --profile $W/profile.json --out $W/slice4.json
echo "end $(date -u +%T) after $SECONDS s; processes left: $(pgrep -fc 'op_proof|op_overhead|artune')" >> $W/env.txt
pack
