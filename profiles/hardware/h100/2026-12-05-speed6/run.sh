#!/bin/bash
# Issue 46: ../2026-12-05-speed6 again with the NVRTC units compiled side by side once more
# (one after another took 8.52 s after boot there, against 2.30 s side by side in speed4), and
# one_stage_push/pull at 4-16 KiB benched three times (issue 42). Loopback:
# 8 virtual ranks in 8 worker processes on one GPU; nothing here is multi-GPU evidence. The
# FIRST command on a freshly booted machine, with $C holding artune, gpu and artune-old
# (main before these changes, with the trace):
#   bash .carry/s59/unpack.sh /tmp/s59 && C=/tmp/s59 END=540 bash profiles/hardware/h100/2026-12-05-speed6/run.sh
# Results in $OUT/speed6.tgz, re-packed after each step.
set -u
R=$PWD; C=${C:?set C}; END=${END:-540}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/speed6; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed6-cache
rm -rf $ARTUNE_CACHE_DIR
P=$R/profiles/hardware/h100
pack() { (cd $W && tar czf $OUT/speed6.tgz .); }
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
sleep 10
step check-idle 20 $A -v check $W/warm.json --measure --loopback 8
K=$(python3 -c "import json,collections;p=json.load(open('$W/warm.json'));c=collections.Counter(b['choice'] for g in p['groups'] for b in g['buckets'] if not b['choice'].startswith('nccl'));print(c.most_common(1)[0][0] if c else '')" 2>/dev/null)
echo "slowed: ${K:-none chosen}" >> $W/env.txt
[ -n "$K" ] && step check-slow3 20 env ARTUNE_CUDA_FAULTS=slow=$K:3 $A check $W/warm.json --measure --loopback 8
step check-nccl-env 20 env NCCL_PROTO=Simple $A check $W/warm.json --measure --loopback 8
summary() {
  { echo "check: exit status and wall (real) of each of check1-20.txt, then check-idle.txt"
    for n in $(seq -f 'check%g' 1 20) check-idle; do
      printf '%-10s %s  %s\n' $n "$(grep '^exit' $W/$n.txt)" "$(grep -m1 '^real' $W/$n.txt)"
    done
    echo "exit 0 in $(grep -l '^exit 0$' $W/check[0-9]*.txt | wc -l) of 20 checks"
    for n in check-slow3 check-nccl-env; do
      [ -f $W/$n.txt ] && echo "$n (must exit 3): $(grep '^exit' $W/$n.txt)"
    done
    for n in first warm ab-old ab-new; do [ -f $W/$n.txt ] || continue
      echo "$n: $(grep -m1 '^real' $W/$n.txt)"
      grep -h -e 'ready in' -e 'compiled ahead' -e 'workers up after' -e 'tuning took' \
        -e 'where it went' -e 'set up and connected' -e 'workers exited in' $W/$n.txt | grep -v 'worker [0-9]' | sed 's/.*INFO[^:]*: //; s/^/  /'
    done
    for n in compare-ex compare-warm-ex compare-speed5; do
      [ -f $W/$n.txt ] && { echo "$n:"; grep -i -e regret -e alike $W/$n.txt | sed 's/^/  /'; }
    done
  } > $W/summary.txt 2>&1; pack; }
summary
[ -f $P/2026-12-05-speed5/warm.json ] && step compare-speed5 10 $A compare $P/2026-12-05-speed5/warm.json $W/warm.json
export ARTUNE_BIN=$A; step gpu 60 $C/gpu --test-threads 1 gpu_a_tune_compiles_its_types_kernels
{ pgrep -fa '__worker' || echo "no artune worker process"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; } > $W/after.txt 2>&1
pack
step exhaustive 150 $A tune --loopback 8 --tp 8 --exhaustive --out $W/exhaustive.json
if [ -f $W/exhaustive.json ]; then
  step compare-ex 10 $A compare $W/first.json $W/exhaustive.json
  step compare-warm-ex 10 $A compare $W/warm.json $W/exhaustive.json
fi
summary
# A/B on this machine, each with an empty cache on a warm driver: main before (with the trace)
# and these changes.
if [ -x $C/artune-old ]; then
  ARTUNE_CACHE_DIR=/tmp/speed6-ab-old step ab-old 45 $C/artune-old -v tune --loopback 8 --out $W/ab-old.json
  ARTUNE_CACHE_DIR=/tmp/speed6-ab-new step ab-new 45 $A -v tune --loopback 8 --out $W/ab-new.json
fi
summary
for i in 1 2 3; do step bench$i 30 $A bench kernels --loopback 8 --backend one_stage_push \
  --backend one_stage_pull --sizes 4K:16K --out $W/bench$i.json; done
{ for n in first check-v; do [ -f $W/$n.txt ] && { echo "$n:"
    grep -h "context opened in" $W/$n.txt | sed 's/.*\[worker \([0-9]*\) .*opened in/  worker \1/'; }
  done; } > $W/contexts.txt 2>&1
date -u >> $W/env.txt; pack
