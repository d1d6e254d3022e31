#!/bin/bash
# The second H200 call for the island LL forms, after run.sh (run1/): the two-shot's LL
# reduce-scatter now issues its loads together, and every kernel ends in fail_safe (a wait
# that gave up leaves the output NaN). Loopback: one GPU, 8 virtual ranks in worker processes,
# virtual islands; not multi-GPU evidence.
#   bash profiles/hardware/h200/2026-12-03-island-ll/run2.sh
# Carried: .carry/op/artune (profiles/hardware/h200/2026-12-03-op/build-carry.sh) and
# .carry/ll2/gpu (`cargo test --release --locked --test gpu --no-run`, stripped).
# Results: $OUT/island-ll2.tgz, packed after every step.
set -u
R=$PWD; A=$R/.carry/op/artune; G=$R/.carry/ll2/gpu
W=/tmp/island-ll2; rm -rf $W; mkdir -p $W
pack() { (cd $W && tar czf $OUT/island-ll2.tgz .); }
END=${END:-570}; START=${START:-0}
step() { n=$1; t=$2; shift 2; left=$((END - START - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 15 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt
  for i in $(seq 20); do pgrep -f __worker >/dev/null || break; sleep 0.5; done
  pkill -9 -f __worker; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version; } > $W/env.txt 2>&1
export ARTUNE_BIN=$A
# A tune with an empty kernel cache: what NVRTC costs now that island.cu holds the LL forms.
export ARTUNE_CACHE_DIR=/tmp/ll2cache-cold
step tune-cold 60 $A tune --loopback 8 --tp 8 --islands 4,4 --out $W/islands-4-4.json
export ARTUNE_CACHE_DIR=/tmp/ll2cache
step gpu-islands 90 $G --test-threads 1 --nocapture gpu_island
step bench44 60 $A bench kernels --loopback 8 --islands 4,4
step bench2222 60 $A bench kernels --loopback 8 --islands 2,2,2,2
step gpu-nvrtc 100 $G --test-threads 1 --nocapture nvrtc_compiles
step gpu-all 240 $G --test-threads 1 --skip gpu_island --skip nvrtc_compiles
echo "end $(date -u +%T) after $SECONDS s; workers left: $(pgrep -fc __worker)" >> $W/env.txt
pack
