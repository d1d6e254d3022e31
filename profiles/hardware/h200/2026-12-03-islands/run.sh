#!/bin/bash
# Issue 33 on the H200 (loopback: one GPU, 8 virtual ranks; the islands are virtual, so this is
# evidence that the island schedules verify and time in the real worker processes with CUDA IPC,
# not of any island speed-up on a multi-GPU box). Runs after run28.sh in the same call:
#   bash profiles/hardware/h200/2026-12-03-first-tune/run28.sh
#   bash profiles/hardware/h200/2026-12-03-islands/run.sh
# Carried: .carry/r28/artune (stripped release binary) and .carry/gpu/gpu (the GPU test binary:
# `cargo test --release --locked --test gpu --no-run`, stripped). Results: $OUT/islands.tgz.
set -u
R=$PWD; A=$R/.carry/r28/artune; G=$R/.carry/gpu/gpu
W=/tmp/islands; rm -rf $W; mkdir -p $W
pack() { (cd $W && tar czf $OUT/islands.tgz .); }
# Each step gets at most its limit and never past $END s of this call (the tool's limit is 600 s
# for the whole command, run28.sh included: START is when this script began).
END=${END:-560}; START=${START:-0}
step() { n=$1; t=$2; shift 2; left=$((END - START - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 15 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version; } > $W/env.txt 2>&1
export ARTUNE_CACHE_DIR=/tmp/cache2
# Island tunes: two virtual islands of 4, four of 2; what they chose and why at two sizes.
step tune44 120 $A tune --loopback 8 --tp 8 --islands 4,4 --out $W/islands-4-4.json
step tune2222 120 $A tune --loopback 8 --tp 8 --islands 2,2,2,2 --out $W/islands-2-2-2-2.json
for f in islands-4-4 islands-2-2-2-2; do
  step show-$f 20 $A show $W/$f.json
  step why-$f-16K 20 $A why $W/$f.json --tp 8 --bytes 16K
  step why-$f-1M 20 $A why $W/$f.json --tp 8 --bytes 1M
done
step bench44 90 $A bench kernels --loopback 8 --islands 4,4
# The GPU tests, the island ones first (verification apart from timing, eager and graph, IPC
# between worker processes, memory measured per GPU), then all the others.
export ARTUNE_BIN=$A
step gpu-islands 120 $G --test-threads 1 --nocapture gpu_island gpu_memory
step gpu-all 240 $G --test-threads 1 --skip gpu_island --skip gpu_memory
echo "end $(date -u +%T) after $SECONDS s; workers left: $(pgrep -fc __worker)" >> $W/env.txt
pack
