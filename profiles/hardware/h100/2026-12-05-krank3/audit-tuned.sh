#!/bin/bash
# Issue 48: the audit of profiles a K-rank tune wrote (this folder's tune4graph-mps.json and
# tune2eager-mps.json, from ../../h100/2026-12-05-krank3), whose NCCL pins carry the channel
# count read back in the sweep: does NCCL 2.32.6 run each pinned size as pinned, channels
# included? Under MPS, ranks on GPU 0: loopback, not multi-GPU evidence. About 30 s.
#   C=<unpacked carry> END=60 bash profiles/hardware/h100/2026-12-05-krank3/audit-tuned.sh
set -u
END=${END:-60}
C=${C:?set C}; C=$(cd "$C" && pwd); R=$PWD; N=/tmp/nccl232; W=/tmp/audtuned
H=$R/profiles/hardware/h100/2026-12-05-krank3
rm -rf $W; mkdir -p $W/bin $W/log; cp $C/artune $C/libartune.so $W/bin/
pack() { (cd $W && tar czf $OUT/audtuned.tgz --exclude=./bin --exclude=./mps .); }
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS - 5)); [ $t -gt $left ] && t=$left
  [ $t -lt 5 ] && { echo "$n: skipped" >> $W/summary.txt; return; }
  s=$SECONDS; ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; e=$?
  echo "$n: exit $e in $((SECONDS - s)) s (limit $t)" >> $W/summary.txt; pack; }
X="env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2"
X="$X ARTUNE_ALLOW_SIMULATED=1 ARTUNE_ALLOW_INVALID=1"
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1' EXIT
nvidia-cuda-mps-control -d; cd /tmp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/env.txt
step graph4 25 $X ARTUNE_MODE=graph $W/bin/artune check $H/tune4graph-mps.json --nccl-audit --tp 4
step eager2 25 $X ARTUNE_MODE=eager $W/bin/artune check $H/tune2eager-mps.json --nccl-audit --tp 2
pack
