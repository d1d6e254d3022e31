#!/bin/bash
# Issue 46: a second first tune after boot (speed6's was 0.24 s under the goal), on the merged
# tree; then every GPU test: the loopback ones, and the K-rank NCCL ones under MPS with NCCL
# 2.32.6 (the pruned library the carry brings). Loopback: 8 virtual ranks on one GPU; nothing
# here is multi-GPU evidence. The FIRST command on a freshly booted machine:
#   bash .carry/s60/unpack.sh /tmp/s60 && C=/tmp/s60 END=500 bash profiles/hardware/h200/2026-12-05-speed7/run.sh
# Results in $OUT/speed7.tgz, re-packed after each step.
set -u
R=$PWD; C=${C:?set C}; END=${END:-500}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune; N=/tmp/nccl232
S=$(date +%s); W=/tmp/speed7; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed7-cache
rm -rf $ARTUNE_CACHE_DIR
pack() { (cd $W && tar czf $OUT/speed7.tgz --exclude ./mps .); }
. $R/profiles/hardware/lib.sh
describe
pack
cd /tmp || exit 1
step first 45 $A -v tune --loopback 8 --out $W/first.json
step warm 45 $A -v tune --loopback 8 --out $W/warm.json
for i in 1 2 3 4 5; do step check$i 20 $A check $W/warm.json --measure --loopback 8; done
{ for n in first warm check1 check2 check3 check4 check5; do
    printf '%-7s %s  %s\n' $n "$(grep '^exit' $W/$n.txt)" "$(grep -m1 '^real' $W/$n.txt)"; done
  grep -h -e 'ready in' -e 'workers up after' -e 'tuning took' -e 'where it went' $W/first.txt \
    | grep -v 'worker [0-9]' | sed 's/.*INFO[^:]*: //; s/^/  /'; } > $W/summary.txt 2>&1
pack
export ARTUNE_BIN=$A
step gpu 300 $C/gpu --test-threads 1 --skip gpu_nccl::
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1' EXIT
nvidia-cuda-mps-control -d
step gpu-nccl 150 env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2 \
  ARTUNE_EXPECT_MPS=1 $C/gpu gpu_nccl:: --test-threads 1
{ pgrep -fa '__worker' || echo "no artune worker process"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; } > $W/after.txt 2>&1
grep -h "test result" $W/gpu.txt $W/gpu-nccl.txt >> $W/summary.txt
date -u >> $W/env.txt; pack
