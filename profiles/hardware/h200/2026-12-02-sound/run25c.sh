#!/bin/bash
# Run 25c (2026-12-02): the probe grown under each-rank launches, the NCCL-hang case of the
# hung-kernel test, and a tune with each rank launching on its own.
R=$PWD; B=$R/.carry/r25; A=$B/artune; export ARTUNE_BIN=$A
W=/tmp/run25c; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run25c.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s KILL $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
date -u > $W/env.txt
step probe-each 120 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu2 --test-threads 1 gpu_contention_probe --nocapture
step hung 200 $B/gpu2 --test-threads 1 gpu_hung_kernel --nocapture
cd /tmp
step each-tune 200 env ARTUNE_LOOPBACK_LAUNCH=each $A tune --loopback 4 --tp 4 --sizes 4K:1M --out $W/each.json
echo "end $(date -u +%T) after $SECONDS s; artune left: $(pgrep -fa artune | grep -v pgrep | wc -l)" >> $W/env.txt
pack
