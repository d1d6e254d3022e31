#!/bin/bash
# Issue 42, the flat kernels' fixed costs (branch h42e): the registered forms load their slot
# before pdl_wait, and one_stage_pull, one_stage_push's LL form and two_stage_push read their
# status for fail_safe before their last barrier or store instead of after it. In order: the
# GPU tests of those kernels (bit-exact eager in loopback 2, 4, 8 and graph replays in 8; a
# replay before registration NaN), `bench kernels --loopback 8` for the flat kernels (graph =
# registered form, eager = staged, beside each other), graph replays in loopback 2 and 4, and
# the bench again (4K:16M), to compare with ../2026-12-05-final/bench.txt (the kernels before
# this change). Loopback: virtual ranks on one GPU; nothing here is multi-GPU evidence.
# From the repository root, with $C holding artune and gpu (stripped release binary and GPU
# test binary of merged main):  C=$PWD/.carry/r54 END=150 bash <this file>
# ARTUNE_CACHE_DIR, where given, is kept (a kernel cache an earlier step of the call filled).
# Results: $OUT/kernels2.tgz, re-packed after each step.
# Look for: gpu.txt and gpu-graph.txt "test result: ok"; bench-*.txt targets: one_stage_pull
# and one_stage_push 4K graph (target 2.50 us; were 3.56 / 3.29 us), two_stage_push >= 16M
# graph (target 90%; was 89.4%).
set -u
R=$PWD; C=${C:-$R/.carry/h42e}; A=$C/artune; G=$C/gpu
W=/tmp/kernels2; rm -rf $W; mkdir -p $W
export ARTUNE_CACHE_DIR=${ARTUNE_CACHE_DIR:-/tmp/kernels2-kcache} ARTUNE_BIN=$A
export NCCL_NVLS_ENABLE=0
pack() { (cd $W && tar czf $OUT/kernels2.tgz .); }
END=${END:-150}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS - 2)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
  $A --version; cat $C/commit.txt; } > $W/env.txt 2>&1
pack
FLAT="--backend one_stage_pull --backend one_stage_push --backend two_stage_pull"
FLAT="$FLAT --backend two_stage_push --backend nccl"
step gpu 70 $G --test-threads 1 --exact \
  gpu_custom_kernels_verify_bit_exactly_in_loopback_2_4_8_or_skip \
  gpu_repeated_calls_and_graph_replay_stay_correct_or_skip \
  gpu_an_unregistered_graph_replay_is_nan_never_a_sum_or_skip
step bench-1 30 $A bench kernels --loopback 8 $FLAT --out $W/bench-1.json
step gpu-graph 30 $G --test-threads 1 --exact \
  gpu_flat_kernels_replay_bit_exactly_in_graphs_in_loopback_2_and_4_or_skip
step bench-2 25 $A bench kernels --loopback 8 $FLAT --sizes 4K:16M --out $W/bench-2.json
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
