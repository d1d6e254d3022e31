#!/bin/bash
# Exploration: NCCL 2.32.6 K ranks on one GPU with and without MPS.
set -u
D=/tmp/nccl232; W=/tmp/mpsx; rm -rf $W; mkdir -p $W
cd $D && cat part0 part1 part2 part3 part4 part5 part6 > libnccl.so.2 && sha256sum libnccl.so.2 > $W/sha.txt; cd - >/dev/null
PY=/opt/torch/.venv/bin/python; TR="$PY -m torch.distributed.run --standalone"
export LD_PRELOAD=$D/libnccl.so.2 NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0
pack() { (cd $W && tar czf $OUT/mpsx.tgz --exclude ./mps .); }
step() { n=$1; t=$2; shift 2; ( time timeout -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi; which nvidia-cuda-mps-control; } > $W/env.txt 2>&1
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1
step mps2 45 $TR --nproc-per-node 2 .carry/mpsx/ar.py
step mps4 60 $TR --nproc-per-node 4 .carry/mpsx/ar.py
step mps8 75 env NCCL_MAX_CTAS=8 $TR --nproc-per-node 8 .carry/mpsx/ar.py
step mps2dbg 40 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING $TR --nproc-per-node 2 .carry/mpsx/ar.py
# artune's own K-rank path (binaries from 65427d6) under MPS
mkdir -p $W/bin; xz -dc .carry/g48/bin/artune.xz > $W/bin/artune; chmod +x $W/bin/artune
export ARTUNE_NCCL_LIB=$D/libnccl.so.2 ARTUNE_CACHE_DIR=/tmp/mpsx-kc
step atune2g 90 $W/bin/artune tune --loopback 2 --tp 2 --mode graph --sizes 16K:64K --out $W/t2g.json
step atune4e 90 $W/bin/artune tune --loopback 4 --tp 4 --mode eager --sizes 16K:64K --out $W/t4e.json
echo quit | nvidia-cuda-mps-control; sleep 1; cp -r $W/mps/log $W/mpslog 2>/dev/null; pack
