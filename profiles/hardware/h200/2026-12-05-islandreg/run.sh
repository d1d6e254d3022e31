#!/bin/bash
# Issue 42, the island kernels' registered form on the H200 in one call: graph replays of
# island_two_shot and island_one_shot reading the peers' own inputs (and the two-shot reaching
# their own outputs), mapped once, bit-exact in loopback 8 with islands 4,4 and 2,2,2,2; a
# replay before registration NaN; `bench kernels` with the island rows' registered (graph)
# figures beside the staged (eager) ones. Loopback: virtual ranks on one GPU, virtual
# islands; nothing here is multi-GPU evidence.
# From the repository root, with .carry/h42b/ holding artune and gpu (stripped release binary
# and GPU test binary of branch h42b) and commit.txt:
#   END=540 bash .carry/h42b/run.sh
# Results: $OUT/islandreg.tgz, re-packed after each step.
# Look for: gpu.txt "test result: ok" (and no "skipped"); bench-*.txt island rows, graph
# (form registered) beside eager (form staged); profile.json groups' "forms" for island
# kernels; why-*.txt "form:".
set -u
R=$PWD; C=${C:-$R/.carry/h42b}; A=$C/artune; G=$C/gpu
W=/tmp/islandreg; rm -rf $W; mkdir -p $W
export ARTUNE_CACHE_DIR=/tmp/islandreg-kcache ARTUNE_BIN=$A
export NCCL_NVLS_ENABLE=0
pack() { (cd $W && tar czf $OUT/islandreg.tgz .); }
END=${END:-540}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  cat $C/commit.txt; } > $W/env.txt 2>&1
step gpu 240 $G --test-threads 1 --exact \
  gpu_island_kernels_replay_registered_bit_exactly_in_islands_4_4_and_2_2_2_2_or_skip \
  gpu_an_unregistered_island_replay_is_nan_never_a_sum_or_skip \
  gpu_island_kernels_verify_bit_exactly_in_virtual_islands_or_skip \
  gpu_island_kernels_replay_in_graphs_and_across_worker_processes_or_skip
step bench-4-4 60 $A bench kernels --loopback 8 --islands 4,4 --out $W/bench-4-4.json
step bench-2-2-2-2 60 $A bench kernels --loopback 8 --islands 2,2,2,2 --out $W/bench-2-2-2-2.json
step tune 90 $A tune --loopback 8 --tp 8 --islands 4,4 --sizes 4K:16M --no-contention --out $W/profile.json
for b in 4K 1M 16M; do
  for m in graph eager; do
    $A why $W/profile.json --tp 8 --bytes $b --mode $m > $W/why-$m-$b.txt 2>&1
  done
done
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
