#!/bin/bash
# Issue 48, after krank2 and the config fix: what NCCL 2.32.6 does with channels forced per communicator
# (minCTAs = maxCTAs) where krank2's read-back saw more than forced (2 forced, 64 read back at
# 16 MiB), and the TP4 audit that printed nothing in 20 s. NCCL's own log (INIT, ENV, TUNING)
# per rank process under MPS. Loopback on one GPU: nothing here is multi-GPU evidence.
#   C=<carry folder, unpacked> END=220 bash profiles/hardware/h100/2026-12-05-chanprobe/run.sh
set -u
END=${END:-240}
C=${C:?set C}; C=$(cd "$C" && pwd); R=$PWD; N=/tmp/nccl232; W=/tmp/chanprobe
rm -rf $W; mkdir -p $W/bin $W/log; cp $C/artune $C/libartune.so $C/gpu $W/bin/
export ARTUNE_CACHE_DIR=$W/kc
pack() { (cd $W && tar czf $OUT/chanprobe.tgz --exclude=./bin --exclude=./kc --exclude=./mps .); }
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS - 8)); [ $t -gt $left ] && t=$left
  [ $t -lt 10 ] && { echo "$n: skipped" >> $W/summary.txt; return; }
  s=$SECONDS; ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; e=$?
  echo "$n: exit $e in $((SECONDS - s)) s (limit $t)" >> $W/summary.txt; pack; }
X="env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2 NCCL_DEBUG=INFO"
X="$X NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING"
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1' EXIT
nvidia-cuda-mps-control -d; cd /tmp
A=$W/bin/artune; G=$W/bin/gpu
step chan 60 $X NCCL_DEBUG_FILE=$W/log/chan.%p.log ARTUNE_BIN=$A $G \
  gpu_nccl::channels::gpu_nccl_times_a_pin_at_forced_channels --nocapture --test-threads 1
# The rest of the K-rank GPU tests (the switch and the sweep's pins in one start among them),
# without NCCL's log.
step gpu-nccl 70 env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2 ARTUNE_BIN=$A \
  ARTUNE_EXPECT_MPS=1 $G gpu_nccl:: --skip gpu_nccl_times_a_pin_at_forced_channels \
  --nocapture --test-threads 1
export ARTUNE_ALLOW_SIMULATED=1 ARTUNE_ALLOW_INVALID=1
step audit4 90 $X NCCL_DEBUG_FILE=$W/log/audit4.%p.log $A check \
  $R/profiles/hardware/h200/2026-12-04-realnccl/sim4.json --nccl-audit --tp 4
{ for f in $W/log/chan.*.log; do echo "== $f"
    grep -a -i "ctas\|nchannels\|channels\|comm 0x" $f | head -40; done; } > $W/chan-grep.txt 2>&1
ls -la $W/log >> $W/summary.txt; pack
