#!/bin/bash
# Run 27 (2026-12-02): the four GPU tests run 26's bound cut off, under each-rank launches,
# and an each-rank tune of two ranks beside run 26's four.
R=$PWD; B=$R/.carry/r26; A=$B/artune; export ARTUNE_BIN=$A
W=/tmp/run27; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run27.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s KILL $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $W/env.txt
step rest-each 420 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1 gpu_repeated_calls gpu_workers_are_processes no_gpu_error nvrtc_compiles --nocapture
cd /tmp
step each-tune2 120 env ARTUNE_LOOPBACK_LAUNCH=each $A tune --loopback 2 --tp 2 --sizes 4K:64K --out $W/each2.json
sleep 5
echo "end $(date -u +%T) after $SECONDS s; artune processes left: $(pgrep -f '\.carry/r26/' | wc -l)" >> $W/env.txt
pack
