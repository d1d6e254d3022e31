#!/bin/bash
# Issue 42, an experiment: one_stage_push's LL form in 32-thread blocks (artune-e32: main at
# c0771e4 with LL1_THREADS = 32, not committed) against 64 (artune), interleaved, `bench kernels
# --loopback 8` (each row verified before it is timed). Loopback: not multi-GPU evidence. ~60 s.
#   C=<unpacked carry with artune-e32> bash profiles/hardware/h100/2026-12-05-percall/e32.sh
set -u
C=${C:?set C}; W=/tmp/e32; rm -rf $W; mkdir -p $W; i=0
for b in artune artune-e32 artune artune-e32 artune artune-e32; do i=$((i + 1))
  ARTUNE_CACHE_DIR=/tmp/e32-cache-$b timeout 40 $C/$b bench kernels --loopback 8 \
    --backend one_stage_push --sizes 4K:32K > $W/$i-$b.txt 2>&1
  echo "$i $b exit $?" >> $W/summary.txt
  grep -a "one_stage_push" $W/$i-$b.txt | sed "s/^/$i $b: /" >> $W/summary.txt
  (cd $W && tar czf $OUT/e32.tgz .)
done
