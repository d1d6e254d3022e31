#!/bin/bash
# Issue 46 on the H200 after branch h46 (loopback: virtual ranks on one GPU; nothing here is
# multi-GPU evidence). From the repository root, with .carry/h46/ holding artune (stripped
# release binary of the commit in commit.txt):  bash .carry/h46/run.sh
# About 5 minutes; the first command on a fresh machine (env.txt's uptime says so).
# Results: $OUT/speed.tgz, re-packed after each step. Compare with ../2026-12-04-speed/.
# Look for:
# - first.txt / warm.txt "real" (goal <= 15 s cold) and, with -v, the gaps between
#   "artune started", "kernels compiled ahead", "CUDA driver ... visible" (the busy check ends
#   just before it: 1.05-1.24 s on 2026-12-04, expected near 0 where NVML's sample buffer covers
#   the last second) and "workers up";
# - check1-20.txt "real" (goal <= 4 s) and exit 0 in all 20 (0 false stale);
# - check-v.txt: the same gaps for one check, and "prepared in" / "re-timed in" per group;
# - the "busy check:" lines (-v): whether the driver's samples covered the last second (no
#   polling) or the check fell back to polling it; samples.txt: nvidia-smi's view of the same.
# - "artune started N s after its process" then the prefetch line: what the 1.3 s before the
#   prefetch on 2026-12-04 was (the prefetch now finds its libraries in its own thread).
set -u
R=$PWD; C=${C:-$R/.carry/h46}; A=$C/artune
W=/tmp/speed; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed-cache
pack() { (cd $W && tar czf $OUT/speed.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; uptime; nproc; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
  $A --version; cat $C/commit.txt; ls -l /lib/x86_64-linux-gnu/libnccl.so*; } > $W/env.txt 2>&1
cd /tmp
step first 90 $A -v tune --loopback 8 --out $W/first.json
step warm 90 $A -v tune --loopback 8 --out $W/warm.json
step check-v 60 $A -v check $W/warm.json --measure --loopback 8
for i in $(seq 1 20); do step check$i 60 $A check $W/warm.json --measure --loopback 8; done
# NVML's own utilization samples (what the busy check reads first): timestamps and values.
step samples 20 nvidia-smi stats -d gpuUtil -c 1
step compare 30 $A compare $W/first.json $W/warm.json
# The same choices as before this branch (the 2026-12-04 warm tune against this one).
step compare-old 30 $A compare $R/profiles/hardware/h200/2026-12-04-speed/warm.json $W/warm.json
# The stopping rule (close calls settled at 1%, short revisits): the same choices as the
# reference? (2026-12-04: TP8 eager regret 0.46% summed; goal <= 1%). Samples per timing are in
# first.json and warm.json ("samples" + "outliers"); 2026-12-04's first.json took 30250.
step exhaustive 120 $A tune --loopback 8 --tp 8 --exhaustive --out $W/exhaustive.json
step compare-ex 30 $A compare $W/first.json $W/exhaustive.json
date -u >> $W/env.txt; pack
