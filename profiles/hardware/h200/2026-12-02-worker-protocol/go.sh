#!/bin/bash
# Run from the repo root on the device: binaries in .carry/h27.
B=$PWD/.carry/h27; export ARTUNE_BIN=$B/artune
exec > $OUT/run.log 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== 1. NCCL_DEBUG=INFO tune --loopback 4 --tp 4 --sizes 4K:64K"
( time NCCL_DEBUG=INFO $B/artune -v tune --loopback 4 --tp 4 --sizes 4K:64K --out /tmp/p1.json ) > $OUT/nccl-info.log 2>&1; echo "rc=$?"
grep -c "NCCL INFO" $OUT/nccl-info.log; grep -m3 "\[worker" $OUT/nccl-info.log; tail -3 $OUT/nccl-info.log
echo "== 2. NCCL_DEBUG=TRACE"
( NCCL_DEBUG=TRACE timeout 60 $B/artune tune --loopback 2 --sizes 4K:16K --out /tmp/p2.json ) > /tmp/trace.log 2>&1; echo "rc=$?"; tail -2 /tmp/trace.log
echo "== 3. cold default tune --loopback 8 (empty cache)"
C=$(mktemp -d); ( time ARTUNE_CACHE_DIR=$C $B/artune -v tune --loopback 8 --out /tmp/p3.json ) > $OUT/cold8.log 2>&1; echo "rc=$?"
grep -iE "ready in|workers up|set up in|phase|real" $OUT/cold8.log | head -40
echo "== 4. corrupt the cache, tune again"
for f in $C/*; do head -c 3000 /dev/urandom > $f; done
( time ARTUNE_CACHE_DIR=$C $B/artune tune --loopback 2 --sizes 4K:16K --out /tmp/p4.json ) > /tmp/c4.log 2>&1; echo "rc=$?"; grep -E "unusable|real" /tmp/c4.log
echo "== 5. GPU tests"
if [ -x $B/gpu ]; then
  ( timeout 150 $B/gpu --test-threads 1 ) > $OUT/gpu-tests.log 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked|skipped" $OUT/gpu-tests.log | head -20
  echo "== 6. GPU tests, ARTUNE_LOOPBACK_LAUNCH=each (probe growth), probe/contention subset"
  ( ARTUNE_LOOPBACK_LAUNCH=each timeout 60 $B/gpu --test-threads 1 contention ) > $OUT/gpu-each.log 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked" $OUT/gpu-each.log | head
  echo "== 7. a broken open (ARTUNE_BIN=/nonexistent) must fail the test, not skip it"
  ( ARTUNE_BIN=/nonexistent timeout 30 $B/gpu --test-threads 1 gpu_loopback_describes ) > /tmp/broken.log 2>&1; echo "rc=$? (want 101)"; grep -E "test result|panicked|skipped" /tmp/broken.log | head -3
fi
date -u
