#!/bin/bash
# The third H200 call: the kernels' speed once fail_safe runs after pdl_trigger (run2/ measured
# it before the trigger), then the fail-safe run of issue 35 in the same call:
#   bash profiles/hardware/h200/2026-12-03-island-ll/run3.sh
# Carried: .carry/op/ (profiles/hardware/h200/2026-12-03-op/build-carry.sh). Loopback: one GPU,
# virtual ranks and islands; not multi-GPU evidence. Results: $OUT/island-ll3.tgz and
# $OUT/fault-run.tgz.
set -u
A=$PWD/.carry/op/artune; W=/tmp/island-ll3; rm -rf $W; mkdir -p $W
export ARTUNE_CACHE_DIR=/tmp/ll3cache
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version; } > $W/env.txt 2>&1
for s in 4,4 2,2,2,2; do
  ( time timeout -s INT -k 10 60 $A bench kernels --loopback 8 --islands $s ) > $W/bench${s//,/}.txt 2>&1
  echo "exit $?" >> $W/bench${s//,/}.txt
done
(cd $W && tar czf $OUT/island-ll3.tgz .)
START=$SECONDS END=580 bash profiles/hardware/h200/2026-12-03-fault/run.sh
