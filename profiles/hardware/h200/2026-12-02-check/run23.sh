#!/bin/bash
# Run 23 (2026-12-02): the merged tree (cuda branch: typed errors, poisoned contexts, a lost
# worker retried) on the H200: GPU tests, each-rank launches, a worker killed mid-tune.
R=$PWD; B=$R/.carry/r23; A=$B/artune; export ARTUNE_BIN=$A
W=/tmp/run23; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run23.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
date -u > $W/env.txt
# 1. A worker killed 9 s into a tune: kept and re-timed, on record.
cd /tmp
( time timeout 120 $A tune --loopback 8 --out $W/killed.json ) > $W/kill.txt 2>&1 &
T=$!; sleep 9; V=$(pgrep -f '__worker' | head -1); echo "killing worker pid $V at $(date -u +%T)" >> $W/kill.txt
kill -9 $V; wait $T; echo "exit $?" >> $W/kill.txt; pack
step kill-show 20 $A show $W/killed.json
# 2. The GPU tests, default launch.
cd $R
step gpu-tests 210 $B/gpu --test-threads 1
# 3. Each rank launched on its own: the graph replay test, given time.
step each-graph-replay 200 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1 gpu_repeated_calls --nocapture
echo "end $(date -u +%T) after $SECONDS s; artune left: $(pgrep -fa artune | grep -v pgrep | wc -l)" >> $W/env.txt
pgrep -fa artune >> $W/env.txt
pack
