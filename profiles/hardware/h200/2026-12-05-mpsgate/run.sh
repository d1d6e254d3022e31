#!/bin/bash
# The busy check under MPS and the exit of a refused command (lead, 2026-12-05).
# An exploration that morning found: under MPS, `tune` refused at once, naming the MPS server
# (pid of nvidia-cuda-mps) as a neighbour; and the refused process then died of SIGSEGV (exit
# 139) after its sentence, while the kernels compiled ahead were still in NVRTC. Steps, each
# with the binary before the fix ($OLD, optional: 65427d6) and after ($C/artune):
#   1. under MPS, nothing else on the GPU: a short loopback tune must run (exit 0);
#   2. a neighbour holding the GPU (torch, 25 s), empty kernel cache: the refusal must exit 2.
# From the repository root: C=<carry folder> [OLD=<old artune>] bash .../run.sh
# Results: $OUT/mpsgate.tgz. Loopback on one GPU: nothing here is multi-GPU evidence.
set -u
W=/tmp/mpsgate; rm -rf $W; mkdir -p $W
PY=/opt/torch/.venv/bin/python
pack() { (cd $W && tar czf $OUT/mpsgate.tgz --exclude ./mps --exclude ./kc* .); }
run() { n=$1; t=$2; shift 2; ( time timeout -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $C/artune --version; } > $W/env.txt 2>&1
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1
T="tune --loopback 8 --tp 8 --mode graph --sizes 4K:64K --no-contention"
[ -n "${OLD:-}" ] && run mps-old 40 env ARTUNE_CACHE_DIR=$W/kc-old $OLD $T --out $W/old.json
run mps-new 90 env ARTUNE_CACHE_DIR=$W/kc-new $C/artune $T --out $W/new.json
echo quit | nvidia-cuda-mps-control; sleep 2
$PY -c "import torch,time; x=torch.ones(1<<28,device='cuda'); torch.cuda.synchronize(); time.sleep(25)" &
HOLD=$!; sleep 8
[ -n "${OLD:-}" ] && run busy-old 20 env ARTUNE_CACHE_DIR=$W/kc-old2 $OLD $T --out $W/old2.json
run busy-new 20 env ARTUNE_CACHE_DIR=$W/kc-new2 $C/artune $T --out $W/new2.json
kill $HOLD 2>/dev/null; wait $HOLD 2>/dev/null
grep -h "^exit\|^error\|^real" $W/*.txt > $W/summary.txt; pack
