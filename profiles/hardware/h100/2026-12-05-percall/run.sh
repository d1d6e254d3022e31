#!/bin/bash
# Issue 48 after a8245ad: the channel sweep sets each count per call through the tuner, as the
# plugin sets a profile's, and the profile records the count set. Shows, with NCCL 2.32.6 and
# K ranks on GPU 0 under MPS (loopback: not multi-GPU evidence): the switch's GPU tests (every
# cell of the sweep set per call, read back no more than set); K = 2 eager and K = 4 graph
# tunes, each then audited (`check --nccl-audit`): NCCL runs each pinned size with the
# channels it ran when timed. About 110 s.
#   C=<unpacked carry> END=150 bash profiles/hardware/h100/2026-12-05-percall/run.sh
set -u
END=${END:-150}
C=${C:?set C}; C=$(cd "$C" && pwd); R=$PWD; N=/tmp/nccl232; W=/tmp/percall
rm -rf $W; mkdir -p $W/bin; cp $C/artune $C/libartune.so $C/gpu $W/bin/
export ARTUNE_CACHE_DIR=$W/kc
pack() { (cd $W && tar czf $OUT/percall.tgz --exclude=./bin --exclude=./kc --exclude=./mps .); }
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS - 5)); [ $t -gt $left ] && t=$left
  [ $t -lt 5 ] && { echo "$n: skipped" >> $W/summary.txt; return; }
  s=$SECONDS; ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; e=$?
  echo "$n: exit $e in $((SECONDS - s)) s (limit $t)" >> $W/summary.txt; pack; }
X="env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2"
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1' EXIT
nvidia-cuda-mps-control -d; cd /tmp
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat $C/commit.txt; } > $W/env.txt
A=$W/bin/artune
step switch 30 $X ARTUNE_BIN=$A $W/bin/gpu gpu_nccl::switch:: --nocapture --test-threads 1
tune() { k=$1; mode=$2; sizes=$3; lim=$4; out=tune$k$mode
  step $out $lim $X RUST_LOG=artune=info $A tune --loopback $k --tp $k --mode $mode \
    --sizes $sizes --out $W/$out.json
  grep -a "channel table: \|channel sweep" $W/$out.txt | sed 's/.*INFO[^ ]* [^ ]* //' > $W/channels-$out.txt
  [ -f $W/$out.json ] || return
  step audit-$out 20 $X ARTUNE_MODE=$mode ARTUNE_ALLOW_INVALID=1 $A check $W/$out.json \
    --nccl-audit --tp $k; }
tune 2 eager 16K:64K 35
tune 4 graph 16K:64K 40
pack
