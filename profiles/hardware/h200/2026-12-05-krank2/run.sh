#!/bin/bash
# Issue 48 on the H200: NCCL 2.32.6 with K ranks on GPU 0 in a loopback tune, under MPS (the
# ranks' kernels run at once) and, if time is left, without it (time slices). Loopback: every
# rank is a process on the one GPU, so nothing here is multi-GPU evidence.
# Needs: NCCL 2.32.6 in seven pieces /tmp/nccl232/part0..6 (carried by the lead, as
# ../2026-12-04-realnccl/device.sh says: .carry/g48/part1..7), and the binaries of merged main
# in $C: artune, libartune.so, and the GPU tests as gpu_nccl (or gpu; plain or .xz). Then:
#   C=.carry/<dir> END=480 bash profiles/hardware/h200/2026-12-05-krank2/run.sh
# Steps, each under its own limit and within END seconds in all (skipped when none is left):
#   1. the K-rank GPU tests (tests/gpu_nccl) under MPS, the fabric line checked to say MPS;
#   1b. the per-call switch (tests/gpu_nccl/switch.rs; NOT RUN YET): every NCCL variant by 2
#      ranks on GPU 0 in one start per mode through artune_tuner_force, what NCCL ran under
#      each switch read back per variant, the starts counted; the channel sweep's pins in one
#      start, each count's channels read back per pin;
#   2. `artune tune --loopback K --tp K` for K = 2 and 4, graph then eager, under MPS, each
#      followed by `why` at 16K and 64K, its NCCL cells and its log's channel table;
#   3. `check --nccl-audit` of ../2026-12-04-realnccl/sim4.json at TP2 and TP4, and with
#      NCCL_ALGO=Tree at TP2 (the audit must exit 3);
#   4. without MPS: K = 2 eager, to show what time slices do to the same tune.
# Results: $OUT/krank2.tgz (re-packed after each step); summary.txt has one line per step.
set -u
END=${END:-480}
C=${C:?set C to the folder of the carried binaries}; C=$(cd "$C" && pwd)
R=$PWD; H=$R/profiles/hardware/h200; N=/tmp/nccl232; W=/tmp/krank2
rm -rf $W; mkdir -p $W/bin $W/kc
export ARTUNE_CACHE_DIR=$W/kc
# The checksum of libnccl.so.2 in the nvidia-nccl-cu13 2.32.6 wheel (../2026-12-04-realnccl/
# carry.sh computed it; $C/libnccl.sha256 wins where the carry brings one).
SUM=f567b7aa83bc1ccb123fd873a3a6d838410240763e12e1577c7b77adeea9ac8d
pack() { (cd $W && tar czf $OUT/krank2.tgz --exclude=./bin --exclude=./kc --exclude=./mps .); }
say() { echo "$*" >> $W/summary.txt; pack; }
# Waits (at most 10 s) until no process of this run's binaries is left: MPS refused new clients
# (error 807) right after clients were killed (the lead's exploration, 2026-12-05).
settle() { for i in $(seq 20); do pgrep -f "$W/bin/" > /dev/null || return 0; sleep 0.5; done
  echo "processes of $W/bin still up after 10 s" >> $W/summary.txt; }
# step NAME LIMIT CMD...: CMD's output in NAME.txt, its exit and seconds in summary.txt.
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS - 8)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; say "$n: skipped"; return 1; fi
  s=$SECONDS; ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; e=$?
  echo "exit $e (limit $t s)" >> $W/$n.txt; settle
  say "$n: exit $e in $((SECONDS - s)) s (limit $t)"
  return $e; }

# NCCL 2.32.6 joined and checked before anything runs.
[ -f $N/libnccl.so.2 ] || cat $N/part0 $N/part1 $N/part2 $N/part3 $N/part4 $N/part5 $N/part6 \
  > $N/libnccl.so.2
echo "$SUM  libnccl.so.2" > $W/libnccl.sha256
[ -f $C/libnccl.sha256 ] && cp $C/libnccl.sha256 $W/
(cd $N && sha256sum -c $W/libnccl.sha256) > $W/sha.txt 2>&1 || { say "NCCL checksum failed"; exit 1; }
# artune and libartune.so side by side: the ranks find the profiler beside the binary.
for b in artune libartune.so gpu_nccl gpu; do
  if [ -f $C/$b ]; then cp $C/$b $W/bin/$b; elif [ -f $C/$b.xz ]; then xz -dc $C/$b.xz > $W/bin/$b; fi
  [ -f $W/bin/$b ] && chmod +x $W/bin/$b
done
A=$W/bin/artune
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,compute_mode --format=csv
  $A --version; cat $C/commit.txt 2>/dev/null; ls -l $W/bin $N/libnccl.so.2; } > $W/env.txt 2>&1
# NCCL 2.32.6 for what runs NCCL (not for tar, grep, python).
X="env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2"
cd /tmp

# Each tune: its log (the starts of the K ranks, the channel table), `why` at 16K and 64K, and
# its NCCL cells (median, interval, samples) with the fabric line.
# The busy check no longer counts the MPS server as a neighbour (f062fa6; the exploration of
# 2026-12-05 05:15 was refused): the tunes run without --allow-busy ($BUSY is empty), so a
# refusal here would show that fix failing.
tune() { k=$1; mode=$2; sizes=$3; lim=$4; tag=$5; out=tune$k$mode$tag
  step $out $lim $X RUST_LOG=artune=info $A tune --loopback $k --tp $k --mode $mode \
    --sizes $sizes $BUSY --out $W/$out.json
  grep -a "NCCL ranks on GPU 0\|channel sweep\|tuner's switch\|tuning took\|where it went" \
    $W/$out.txt \
    | sed 's/.*INFO[^ ]* [^ ]* //' > $W/starts-$out.txt
  grep -a "channel table: " $W/$out.txt | sed 's/.*channel table: //' > $W/channels-$out.txt
  [ -f $W/$out.json ] || { pack; return; }
  # Every size's choice against K-rank NCCL (issue 42: does a graph group choose a
  # registered kernel once NCCL is no longer the loopback's one-rank copy?).
  $A show $W/$out.json > $W/show-$out.txt 2>&1
  for b in 16K 64K; do $A why $W/$out.json --tp $k --mode $mode --bytes $b; done \
    > $W/why-$out.txt 2>&1
  python3 - $W/$out.json > $W/nccl-$out.txt 2>&1 <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
print(p["fabric"])
for g in p["groups"]:
    print("TP%d %s pin_channels=%s waived=%s" % (g["tp"], g["mode"], g.get("pin_channels"),
                                                sorted(g.get("waived", {}))))
    for b in g["buckets"]:
        for name, t in sorted(b["results"].items()):
            if name.startswith("nccl"):
                print("  %9d %-18s %10.2f [%10.2f, %10.2f] n=%d" % (b["bytes"], name,
                      t["median_us"], t["ci_low_us"], t["ci_high_us"], t["samples"]))
PY
  pack; }

# MPS: a control daemon of our own, its pipe and log under /tmp; quit at the end.
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
quit_mps() { echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1; }
trap quit_mps EXIT
nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; say "MPS daemon: exit $?"
BUSY=

if [ -x $W/bin/gpu_nccl ]; then G=$W/bin/gpu_nccl; F=; else G=$W/bin/gpu; F=gpu_nccl::; fi
step gpu-mps 45 $X ARTUNE_BIN=$A ARTUNE_EXPECT_MPS=1 $G $F --skip gpu_nccl::switch:: \
  --nocapture --test-threads 1
# The per-call switch (not run yet): per variant "followed; channels NCCL ran ..." or "NOT
# followed under the switch: <what ran>", and "<n> starts of the 2 ranks for 7 variants in 2
# modes" (3 where NCCL follows every switch; 15 before). switch-mps.txt, summarised below.
step switch-mps 40 $X ARTUNE_BIN=$A $G gpu_nccl::switch:: --nocapture --test-threads 1
grep -a "followed\|starts of the\|channels forced" $W/switch-mps.txt > $W/switch-summary.txt
pack
# What is missing first (graph mode, K = 4), then eager; a tune cut by its limit leaves no
# profile, but its log says where the time went (starts-*.txt). With libartune.so beside the
# binary a tune starts the K ranks about 4 times (a prime, one per mode for every variant
# switched by the tuner, and the channel sweep's NCCL reference and its pins in one start),
# plus two for each variant NCCL did not run under its switch (said in the log); before, about
# 15 starts and 40 communicators.
tune 2 graph 16K:256K 70 -mps
tune 4 graph 16K:64K 70 -mps
tune 2 eager 16K:64K 45 -mps
tune 4 eager 16K:64K 45 -mps
# The audit (as ../2026-12-04-realnccl/run.sh, which also ran TP4): the profile followed at
# every pinned size, and NCCL_ALGO=Tree caught (exit 3).
P=$H/2026-12-04-realnccl/sim4.json
export ARTUNE_ALLOW_SIMULATED=1 ARTUNE_ALLOW_INVALID=1
step audit2-mps 20 $X $A check $P --nccl-audit --tp 2
step tree2-mps 20 $X NCCL_ALGO=Tree $A check $P --nccl-audit --tp 2
step audit4-mps 20 $X $A check $P --nccl-audit --tp 4
unset ARTUNE_ALLOW_SIMULATED ARTUNE_ALLOW_INVALID
cp -r $W/mps/log $W/mpslog 2>/dev/null
quit_mps; trap - EXIT; sleep 1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
BUSY=

# Without MPS, in what is left: the same tune at K = 2 eager, by time slices.
step gpu-slices 20 $X ARTUNE_BIN=$A ARTUNE_EXPECT_MPS=0 $G \
  gpu_loopback_times_nccl_with_k_ranks --nocapture --test-threads 1
tune 2 eager 16K:64K 60 -slices
say "done $(date -u) after $SECONDS s"
