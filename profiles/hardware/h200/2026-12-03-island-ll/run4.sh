#!/bin/bash
# The fourth H200 call: the island kernels as committed (the two-shot's LL reduce-scatter back
# to one load per store, fail_safe after the trigger), verified and timed again. Loopback: one
# GPU, virtual ranks and islands; not multi-GPU evidence.
#   bash profiles/hardware/h200/2026-12-03-island-ll/run4.sh
# Carried: .carry/ll4/artune and .carry/ll4/gpu (stripped release binary and GPU test binary).
# Results: $OUT/island-ll4.tgz. Run 5 is the same with C=.carry/ll5 N=island-ll5.
set -u
C=${C:-$PWD/.carry/ll4}; N=${N:-island-ll4}
A=$C/artune; G=$C/gpu; W=/tmp/$N; rm -rf $W; mkdir -p $W
export ARTUNE_CACHE_DIR=/tmp/ll4cache ARTUNE_BIN=$A
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version; } > $W/env.txt 2>&1
( time timeout -k 10 120 $G --test-threads 1 --nocapture gpu_island ) > $W/gpu-islands.txt 2>&1
echo "exit $?" >> $W/gpu-islands.txt
for s in 4,4 2,2,2,2; do
  ( time timeout -s INT -k 10 60 $A bench kernels --loopback 8 --islands $s ) > $W/bench${s//,/}.txt 2>&1
  echo "exit $?" >> $W/bench${s//,/}.txt
done
(cd $W && tar czf $OUT/$N.tgz .)
