#!/bin/bash
# Issue 46 on the H200 after branch h46c (loopback: 8 virtual ranks in 8 worker processes on one
# GPU; nothing here is multi-GPU evidence). From the repository root, with $C holding artune
# (stripped release binary) and gpu (the stripped GPU test binary):  C=/path bash run.sh
# Within $END seconds (default 150); results in $OUT/speed2.tgz, re-packed after each step.
# Compare with ../2026-12-05-speed/ (commit 005fadf: first tune 14.8 s, warm 15.2 s, checks
# 5.79-6.20 s wall). Look for:
# - first.txt / warm.txt "real" (goal <= 15 s) and "where it went" (busy check, start-up);
# - check1-10.txt "real" (goal <= 4 s) and exit 0 in all (0 false stale);
# - check-v.txt (-v now shows the workers' own lines too): "opening the machine meanwhile" and
#   "the wait for the GPUs to settle ended N s after the machine was opened" (workers
#   started during the settle wait), each release round ("workers: every import closed ... in",
#   "every buffer freed in"), the
#   workers' "[worker ...] worker PID: imports closed / buffers freed / its GPU released in",
#   the launcher's "graphs destroyed in A s, backends (NCCL's communicators ...) in B s" (what
#   the ~0.4 s fixed cost of each release between groups is made of), and "N workers exited
#   in" at the end (no round of frees after the last group);
# - first.txt / warm.txt: the same worker lines for the tune's releases (set-up time).
# - compare-speed.txt: this warm tune against 2026-12-05-speed's (the same choices);
#   compare-ex.txt: this first tune against 2026-12-05-speed's exhaustive TP8 reference;
# - gpu.txt: the GPU tests of the check's start and teardown (no worker left behind).
set -u
R=$PWD; C=${C:-$R/.carry/h46c}; A=$C/artune; END=${END:-150}
S=$(date +%s); W=/tmp/speed2; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed2-cache
rm -rf $ARTUNE_CACHE_DIR
REF=$R/profiles/hardware/h200/2026-12-05-speed
pack() { (cd $W && tar czf $OUT/speed2.tgz .); }
# Each step gets at most what is left of $END (less 5 s to pack), and is skipped when none is.
step() { n=$1; t=$2; shift 2; left=$((S + END - 5 - $(date +%s)))
  [ $left -lt $t ] && t=$left
  if [ $t -le 2 ]; then echo "skipped: out of time" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; uptime; nproc; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
  $A --version; cat $C/commit.txt 2>/dev/null; ls -l /lib/x86_64-linux-gnu/libnccl.so*
  } > $W/env.txt 2>&1
pack
cd /tmp
step first 40 $A -v tune --loopback 8 --out $W/first.json
step warm 40 $A -v tune --loopback 8 --out $W/warm.json
step check-v 20 $A -v check $W/warm.json --measure --loopback 8
for i in $(seq 1 10); do step check$i 20 $A check $W/warm.json --measure --loopback 8; done
[ -f $REF/warm.json ] && step compare-speed 10 $A compare $REF/warm.json $W/warm.json
[ -f $REF/exhaustive.json ] && step compare-ex 10 $A compare $W/first.json $REF/exhaustive.json
export ARTUNE_BIN=$A; step gpu 30 $C/gpu --test-threads 1 --nocapture gpu_a_check_starts \
  gpu_workers_are_processes_sharing
date -u >> $W/env.txt; pack
