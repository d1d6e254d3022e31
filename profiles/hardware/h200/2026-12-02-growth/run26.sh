#!/bin/bash
# Run 26 (2026-12-02): run 25c as written (the probe grown under each-rank launches, the
# NCCL-hang case of the hung-kernel test, a tune with each rank launching on its own), plus
# NCCL_DEBUG=TRACE through a tune and every GPU test under each-rank launches.
R=$PWD; B=$R/.carry/r26; A=$B/artune; export ARTUNE_BIN=$A
W=/tmp/run26; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run26.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s KILL $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $W/env.txt
step probe-each 120 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1 gpu_contention_probe --nocapture
step hung 200 $B/gpu --test-threads 1 gpu_hung_kernel --nocapture
cd /tmp
step each-tune 150 env ARTUNE_LOOPBACK_LAUNCH=each $A tune --loopback 4 --tp 4 --sizes 4K:1M --out $W/each.json
step nccl-trace 90 env NCCL_DEBUG=TRACE $A tune --loopback 4 --tp 4 --sizes 4K:64K --out $W/trace.json -v
cd $R
step gpu-tests-each 230 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1
echo "end $(date -u +%T) after $SECONDS s; artune left: $(pgrep -fa artune | grep -v pgrep | wc -l)" >> $W/env.txt
pack
