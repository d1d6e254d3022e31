#!/bin/bash
# Run 24 (2026-12-02): the GPU path's guards watched fail on the H200. A context poisoned by an
# expired wait keeps its memory (and the same test with that guard removed); GPU tests with a
# broken `open` (no worker binary) fail rather than skip; NCCL_DEBUG=INFO tune on this tree.
R=$PWD; B=$R/.carry/r24; A=$B/artune; export ARTUNE_BIN=$A
W=/tmp/run24; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run24.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s KILL $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $W/env.txt
# 1. The poisoned context keeps the memory under queued work (the guard as built).
step expired-wait 60 $B/lib --exact fabric::cuda::driver::tests::memory_under_an_expired_wait_is_kept_or_skip --nocapture
# 2. The same test with Mem's drop freeing under a poisoned context (the guard removed).
step expired-wait-broken 60 $B/lib-broken --exact fabric::cuda::driver::tests::memory_under_an_expired_wait_is_kept_or_skip --nocapture
# 3. A broken open: the worker binary is missing, or is not artune. Must FAIL, never skip.
step open-missing 120 env ARTUNE_BIN=/nonexistent/artune $B/gpu --test-threads 1 gpu_custom_kernels gpu_nccl_one_rank
step open-false 120 env ARTUNE_BIN=/bin/false $B/gpu --test-threads 1 gpu_custom_kernels gpu_nccl_one_rank
# 4. NCCL's own log on: the protocol has its own channel.
cd /tmp
step nccl-info 120 env NCCL_DEBUG=INFO $A tune --loopback 4 --tp 4 --sizes 4K:64K --out $W/info.json -v
grep -c "NCCL INFO" $W/nccl-info.txt >> $W/env.txt
# 5. All GPU tests, default launch, on this tree.
cd $R
step gpu-tests 240 $B/gpu --test-threads 1
echo "end $(date -u +%T) after $SECONDS s; artune left: $(pgrep -fa artune | grep -v pgrep | wc -l)" >> $W/env.txt
pgrep -fa artune >> $W/env.txt
pack
