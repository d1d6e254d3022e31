#!/bin/bash
# The island GPU tests again, one at a time, with the coordinator's and workers' log lines
# (run.sh's gpu-islands step ran out of its 120 s in the first test without a line).
# Carried: .carry/gpu/gpu and .carry/op/artune. Results: $OUT/diagnose.tgz.
set -u
R=$PWD; G=$R/.carry/gpu/gpu; W=/tmp/diagnose; rm -rf $W; mkdir -p $W
export ARTUNE_BIN=$R/.carry/op/artune ARTUNE_CACHE_DIR=/tmp/dcache
pack() { (cd $W && tar czf $OUT/diagnose.tgz .); }
t() { n=$1; s=$2; shift 2
  ( time timeout -k 5 $s "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack
  for i in $(seq 20); do pgrep -f __worker >/dev/null || break; sleep 0.5; done
  pkill -9 -f __worker; }
RUST_LOG=artune=debug t replay 75 $G --test-threads 1 --nocapture gpu_island_kernels_replay
RUST_LOG=artune=info t verify 45 $G --test-threads 1 --nocapture gpu_island_kernels_verify
t memory 30 $G --test-threads 1 --nocapture gpu_memory
