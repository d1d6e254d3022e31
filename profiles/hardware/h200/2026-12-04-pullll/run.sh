#!/bin/bash
# two_stage_pull's LL form with both phases pulled in lines (no staging, no barrier) on the
# H200. Loopback: virtual ranks on one GPU; nothing here is multi-GPU evidence.
# From the repository root, with .carry/pl/ (or $C) holding artune and gpu (release binary and
# GPU test binary of this tree):
#   bash profiles/hardware/h200/2026-12-04-pullll/run.sh   (about 3 minutes)
# Results: $OUT/pl.tgz, re-packed after each step.
# Look for: gpu-verify, gpu-replay and gpu-workers "test result: ok" (two_stage_pull_ll bit-exact
# at K = 2, 4, 8, over repeated calls and graph replays, and across worker processes); bench
# "4K graph" line for two_stage_pull (target <= 5 us; 5.35 us with staging, 3.65 before it);
# gpu-memory's two_stage_pull line (its signal allocation grew from 80 KiB to 320 KiB at K = 8,
# which the model does not count: measured against the last run's figure).
set -u
R=$PWD; C=${C:-$R/.carry/pl}; A=$C/artune; G=$C/gpu; W=/tmp/pl; rm -rf $W; mkdir -p $W
export ARTUNE_CACHE_DIR=/tmp/pl-kcache ARTUNE_BIN=$A
pack() { (cd $W && tar czf $OUT/pl.tgz .); }
END=${END:-570}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 15 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 15 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  echo "tree $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; } > $W/env.txt 2>&1
step gpu-verify 150 $G --test-threads 1 --exact gpu_custom_kernels_verify_bit_exactly_in_loopback_2_4_8_or_skip
step gpu-replay 90 $G --test-threads 1 --exact gpu_repeated_calls_and_graph_replay_stay_correct_or_skip
step gpu-workers 90 $G --test-threads 1 --exact gpu_each_worker_launching_its_own_rank_verifies_or_skip
step gpu-memory 60 $G --test-threads 1 --nocapture --exact gpu_memory_is_measured_beside_the_model_or_skip
step bench 90 $A bench kernels --loopback 8
pack
