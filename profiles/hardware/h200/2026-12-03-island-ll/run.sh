#!/bin/bash
# Issue 33 on the H200: the island kernels' LL forms (kernels/island.cu, island_one_shot_ll and
# island_two_shot_ll), which serve messages up to 32 KiB per rank without barriers. Loopback:
# one GPU, 8 virtual ranks in worker processes with CUDA IPC, islands given by --islands; it
# shows that the LL forms verify and what a call costs in flag round trips on one GPU, not any
# island speed-up on a multi-GPU box.
#   bash profiles/hardware/h200/2026-12-03-island-ll/run.sh
# Carried: .carry/ll/artune (stripped `cargo build --release --locked`) and .carry/ll/gpu (the
# GPU test binary: `cargo test --release --locked --test gpu --no-run`, stripped).
# Results: $OUT/island-ll.tgz, packed after every step.
set -u
R=$PWD; A=$R/.carry/ll/artune; G=$R/.carry/ll/gpu
W=/tmp/island-ll; rm -rf $W; mkdir -p $W
pack() { (cd $W && tar czf $OUT/island-ll.tgz .); }
END=${END:-570}; START=${START:-0}
step() { n=$1; t=$2; shift 2; left=$((END - START - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 15 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt
  for i in $(seq 20); do pgrep -f __worker >/dev/null || break; sleep 0.5; done
  pkill -9 -f __worker; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version; } > $W/env.txt 2>&1
export ARTUNE_CACHE_DIR=/tmp/llcache ARTUNE_BIN=$A
# Verification apart from timing: both island kernels x 3 dtypes x 4 orientations x 9 sizes
# (1 to 262147 elements: the LL forms up to 32 KiB), eager x25 and graph x10 at 4 KiB/4098 B,
# each worker launching its own rank at 4 KiB and 64 KiB.
step gpu-islands 150 $G --test-threads 1 --nocapture gpu_island
# Kernel speed, graph and eager, beside the flat kernels: the 4 KiB target is 1.5x one_stage's.
step bench44 90 $A bench kernels --loopback 8 --islands 4,4
step bench2222 90 $A bench kernels --loopback 8 --islands 2,2,2,2
# Every other GPU test (allreduce.cu's LL helpers moved to common.cuh).
step gpu-all 220 $G --test-threads 1 --skip gpu_island
echo "end $(date -u +%T) after $SECONDS s; workers left: $(pgrep -fc __worker)" >> $W/env.txt
pack
