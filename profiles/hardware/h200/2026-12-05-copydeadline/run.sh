#!/bin/bash
# Issue 45, fail-safe on a peer that never arrives, in the engine's op: the op's copy-engine
# calls end with a guard (ce_sum with no inputs) and a watchdog thread releases a call stuck in
# cuStreamWaitValue32 after 5 s (src/fabric/cuda/copy/watch.rs). Two ranks of two_stage_copy as
# two processes on one GPU (loopback, device-to-device copies), rank 1 absent by the fault knob
# (ARTUNE_CUDA_FAULTS=absent=two_stage_copy:1, which the test sets for its children).
# From the repository root, with $C holding the stripped release binary `artune` and GPU test
# binary `gpu` (and commit.txt) built from the commit under test:
#   C=$PWD/.carry/x END=60 bash profiles/hardware/h200/2026-12-05-copydeadline/run.sh
# (END=260 also runs rows.txt and bench.txt). The kernel cache is the default one, so a call
# that ran another script first does not compile the kernels again (a cold compile is most of
# op.txt's time).
# Results: $OUT/copydeadline.tgz, re-packed after each step.
# Look for: op.txt "rank 0: two_stage_copy replayed with rank 1 absent: released after 5.0x s,
# 65536 of 65536 NaN, faulted true" (a captured graph's replay), "the next call (eager): ...
# all NaN" and "test result: ok"; rows.txt (if time is left) the copy rows still bit-exact with
# the guard, and the tune's absent test; bench.txt the copy rows' times with the guard.
set -u
R=$PWD; C=${C:-$R/.carry/copydeadline}; A=$C/artune; G=$C/gpu
W=/tmp/copydeadline; rm -rf $W; mkdir -p $W
export ARTUNE_BIN=$A NCCL_NVLS_ENABLE=0
pack() { (cd $W && tar czf $OUT/copydeadline.tgz .); }
END=${END:-60}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  cat $C/commit.txt; } > $W/env.txt 2>&1
pack
step op 55 $G --test-threads 1 --nocapture --exact \
  gpu_an_op_copy_call_whose_peer_never_arrives_is_nan_within_the_deadline_or_skip
step rows 120 $G --test-threads 1 --nocapture --exact \
  gpu_copy_engine_rows_verify_bit_exactly_in_loopback_eager_and_graph_or_skip \
  gpu_a_copy_peer_that_never_arrives_fails_only_its_backend_or_skip
# The guard (one more kernel per call) in the copy rows' times: compare with
# 2026-12-05-copyengine/bench.txt, the same command before it.
step bench 60 $A bench kernels --loopback 8 --islands 4,4 --sizes 4K:16M \
  --backend two_stage_copy --backend island_two_shot_copy
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
