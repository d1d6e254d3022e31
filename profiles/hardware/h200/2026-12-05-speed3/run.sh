#!/bin/bash
# Issue 46 on the H200 after branch h46n (loopback: 8 virtual ranks in 8 worker processes on one
# GPU; nothing here is multi-GPU evidence). From the repository root, as the first command on a
# freshly booted machine, with $C holding artune (stripped release binary) and gpu (the stripped
# GPU test binary):  C=/path END=300 bash profiles/hardware/h200/2026-12-05-speed3/run.sh
# Within $END seconds (default 300); results in $OUT/speed3.tgz, re-packed after each step.
# Compare with ../2026-12-05-speed2/ (first tune 23.2 s, warm 20.5 s, checks 5.03-5.36 s).
# Look for:
# - first.txt / warm.txt: wall ("real", /usr/bin/time) and "tuning took" (goal <= 15 s cold);
#   "set-up" in "where it went" (3.15 s in speed2), and the NCCL lines: one "nccl set up in",
#   then "(the communicator kept from the last group)" for every later group, no "NCCL
#   communicators of ... destroyed";
# - check1-20.txt: wall (goal <= 4 s) and "exit 0" in all 20 (0 false stale); summary.txt
#   gathers both;
# - check-v.txt: each release's parts: "[worker 0 ...] imports closed (graphs, peers' buffers;
#   1 NCCL ranks kept) in", the launcher's "graphs destroyed in A s, backends (...) in B s"
#   (B was 0.40-0.44 s in speed2, now without NCCL's destroy), "workers: every import closed
#   ... in", "every buffer freed in"; at the end "1 NCCL ranks left to the process's exit" and
#   "8 workers exited in T s (each, in worker order, after: ...)": whether the 8 contexts'
#   teardowns on the one GPU run side by side (times alike) or queue (evenly spaced);
# - quick-v.txt, quick1-4.txt: the same check with workers ended by _exit (testing only,
#   ARTUNE_WORKER_EXIT=quick): whether the CUDA driver's exit handler is what the exit costs;
# - check-slow3.txt, check-nccl-env.txt: the catches, each "exit 3" (the profile's most chosen
#   kernel 3x slower through ARTUNE_CUDA_FAULTS; NCCL_PROTO=Simple set);
# - compare-ex.txt: the first tune against ../2026-12-05-speed/exhaustive.json (an older
#   tree's exhaustive TP8, as speed2 compared); compare-ex3.txt / compare-warm-ex3.txt: the
#   first and warm tunes against exhaustive3.json, an exhaustive TP8 tune made here with what
#   is left of $END (its file says "skipped: out of time" or exit 124 where none was left);
#   compare-speed2.txt: this warm tune against speed2's (the same choices);
# - gpu.txt: the GPU tests of the reused communicator and of the check's start and teardown;
#   after.txt: no worker process left, nothing on the GPU.
set -u
R=$PWD; C=${C:-$R/.carry/h46n}; END=${END:-300}
# Absolute: the steps run from /tmp.
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/speed3; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed3-cache
rm -rf $ARTUNE_CACHE_DIR
P=$R/profiles/hardware/h200
pack() { (cd $W && tar czf $OUT/speed3.tgz .); }
# /usr/bin/time where the machine has it (its line: wall, user, sys, peak memory), else bash's.
timed() {
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "real %e s  user %U s  sys %S s  max RSS %M KiB" "$@"
  else
    time "$@"
  fi
}
# Each step gets at most what is left of $END (less 5 s to pack), and is skipped when none is.
step() { n=$1; t=$2; shift 2; left=$((S + END - 5 - $(date +%s)))
  [ $left -lt $t ] && t=$left
  if [ $t -le 2 ]; then echo "skipped: out of time" > $W/$n.txt; pack; return; fi
  ( timed timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; uptime; nproc; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
  $A --version; cat $C/commit.txt 2>/dev/null; ls -l /lib/x86_64-linux-gnu/libnccl.so*
  ls -l /usr/bin/time; } > $W/env.txt 2>&1
pack
cd /tmp || exit 1
step first 45 $A -v tune --loopback 8 --out $W/first.json
step warm 45 $A -v tune --loopback 8 --out $W/warm.json
step check-v 20 $A -v check $W/warm.json --measure --loopback 8
for i in $(seq 1 20); do step check$i 20 $A check $W/warm.json --measure --loopback 8; done
# The workers' exit, A/B: the same check with each worker ended by _exit (its context torn
# down by the kernel, not the CUDA driver's exit handler; testing only, ARTUNE_WORKER_EXIT).
ARTUNE_WORKER_EXIT=quick step quick-v 20 $A -v check $W/warm.json --measure --loopback 8
for i in 1 2 3 4; do
  ARTUNE_WORKER_EXIT=quick step quick$i 20 $A check $W/warm.json --measure --loopback 8
done
# The same catches (issue 46): the kernel the warm profile chooses most, made 3x slower, and a
# changed NCCL variable: each check must exit 3 (stale).
K=$(python3 -c "import json,collections;p=json.load(open('$W/warm.json'));c=collections.Counter(b['choice'] for g in p['groups'] for b in g['buckets'] if not b['choice'].startswith('nccl'));print(c.most_common(1)[0][0] if c else '')" 2>/dev/null)
echo "slowed: ${K:-none chosen}" >> $W/env.txt
[ -n "$K" ] && step check-slow3 20 env ARTUNE_CUDA_FAULTS=slow=$K:3 $A check $W/warm.json --measure --loopback 8
step check-nccl-env 20 env NCCL_PROTO=Simple $A check $W/warm.json --measure --loopback 8
{ echo "check: exit status and wall (real) of each of check1-20.txt, then quick1-4.txt"
  for n in $(seq -f 'check%g' 1 20) quick1 quick2 quick3 quick4; do
    printf '%-8s %s  %s\n' $n "$(grep '^exit' $W/$n.txt)" "$(grep -m1 '^real' $W/$n.txt)"
  done
  echo "exit 0 in $(grep -l '^exit 0$' $W/check[0-9]*.txt | wc -l) of 20 checks"
  grep -h 'workers exited in' $W/check-v.txt $W/quick-v.txt | sed 's/.*INFO[^:]*: //'
  for n in check-slow3 check-nccl-env; do [ -f $W/$n.txt ] && echo "$n (must exit 3): $(grep '^exit' $W/$n.txt)"; done
  for n in first warm; do echo "$n: $(grep -m1 '^real' $W/$n.txt)"; done; } > $W/summary.txt 2>&1
pack
[ -f $P/2026-12-05-speed2/warm.json ] && step compare-speed2 10 $A compare $P/2026-12-05-speed2/warm.json $W/warm.json
[ -f $P/2026-12-05-speed/exhaustive.json ] && step compare-ex 10 $A compare $W/first.json $P/2026-12-05-speed/exhaustive.json
export ARTUNE_BIN=$A; step gpu 90 $C/gpu --test-threads 1 --nocapture gpu_the_next_group_reuses \
  gpu_a_check_destroys_no_nccl gpu_a_check_starts gpu_workers_are_processes_sharing
{ pgrep -fa '__worker' || echo "no artune worker process"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; } > $W/after.txt 2>&1
pack
# Last, with what is left: a fresh exhaustive TP8 reference (about 43 s on an older tree).
step exhaustive3 150 $A tune --loopback 8 --tp 8 --exhaustive --out $W/exhaustive3.json
if [ -f $W/exhaustive3.json ]; then
  step compare-ex3 10 $A compare $W/first.json $W/exhaustive3.json
  step compare-warm-ex3 10 $A compare $W/warm.json $W/exhaustive3.json
fi
date -u >> $W/env.txt; pack
