#!/bin/bash
# Run 21 (2026-12-02): the final tree (554715a): the GPU tests, then the same with
# ARTUNE_LOOPBACK_LAUNCH=each with a bound per test, to see whether run 20's stuck
# graph-replay test hangs or is slow; then one default tune.
R=$PWD; B=$R/.carry/r21; export ARTUNE_BIN=$B/artune ARTUNE_CACHE_DIR=/tmp/cache21
W=/tmp/run21; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run21.tgz .); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $W/env.txt 2>&1
step() { n=$1; t=$2; shift 2; ( time timeout $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
step gpu-tests 200 $B/gpu --test-threads 1
step each-graph-replay 90 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1 gpu_repeated_calls_and_graph_replay
step each-rest 150 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1 --skip gpu_repeated_calls_and_graph_replay
step tune 60 $B/artune tune --loopback 8 --out $W/tune.json
echo "end $(date -u +%T) after $SECONDS s; workers left: $(pgrep -fc __worker)" >> $W/env.txt; pack
