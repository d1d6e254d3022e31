#!/bin/bash
# Issue 48, the channel timing of the CUDA fabric (nccl_ranks::timing), for the next session
# on the H200. Two halves:
#   here (the package index reachable), after carry.sh has made .carry/g48/:
#     bash profiles/hardware/h200/2026-12-04-realnccl/channels.sh carry [BUILD_TREE]
#   builds the GPU test binary in BUILD_TREE (default .) and adds it, stripped and xz-compressed,
#   with this script to .carry/g48/bin (the last piece's carry; where that passes the device's
#   64 MiB, carry .carry/g48/bin alone in a further call, after the pieces);
#   on the device, as the last of device.sh's calls in place of run.sh:
#     ... && bash .carry/g48/bin/channels.sh run
#   joins NCCL 2.32.6 as run.sh does and runs tests/gpu_nccl/channels.rs against it: Ring/Simple
#   at 64K and 16M with 2 and 8 run-time channels forced, 2 ranks sharing GPU 0
#   (NCCL_MULTI_RANK_GPU_ENABLE=1), what ran read back through libartune.so as NCCL's profiler;
#   and the loopback fabric's K-rank NCCL sampled in eager and graph mode, its pin verified.
#   Results: $OUT/channels.tgz. Loopback: the times are one GPU's.
#   and, in one further device call (the pieces in /tmp/nccl232 still, the machine warm):
#     bash .carry/g48/bin/channels.sh tune
#   loopback tunes with NCCL 2.32.6, within 300 s in all: K = 2 in graph mode (16K:64K), then
#   K = 2 eager (16K:64K) in what time is left: NCCL's own choice and every algorithm x protocol
#   timed by K rank processes sharing GPU 0, in samples (each one call; in graph mode one
#   replay of the call each rank captured in a CUDA graph), every size's sum checked by
#   the ranks first, the channel sweep per pin in one start of the ranks, `why` of each profile
#   at 16K and 64K, each profile's NCCL cells (samples, interval) and the description's note
#   that these are time slices of one GPU (never multi-GPU evidence).
#   Results: $OUT/tune.tgz, re-packed after each step.
set -u
case ${1:-} in
carry)
  R=$PWD; T=${2:-$R}; C=$R/.carry/g48/bin; H=$(cd "$(dirname "$0")" && pwd)
  [ -d $C ] || { echo "run carry.sh first: $C is missing"; exit 2; }
  G=$(cd $T && cargo test --release --locked --test gpu --no-run --message-format=json \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="gpu" and m.get("executable"):
        print(m["executable"])' | tail -1)
  strip -o $C/gpu-tests $G && xz -9 -f $C/gpu-tests
  cp $H/channels.sh $C/
  du -sh $C;;
run)
  R=$PWD; B=$R/.carry/g48/bin; N=/tmp/nccl232; W=/tmp/g48ch; rm -rf $W; mkdir -p $W/bin
  cat $N/part? > $N/libnccl.so.2
  (cd $N && sha256sum -c $B/libnccl.sha256) > $W/sha.txt 2>&1 || { tar czf $OUT/channels.tgz -C $W .; exit 1; }
  for b in artune libartune.so gpu-tests; do xz -dc $B/$b.xz > $W/bin/$b; chmod +x $W/bin/$b; done
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; cat $B/commit.txt; } > $W/env.txt 2>&1
  cd /tmp
  ( time env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2 ARTUNE_BIN=$W/bin/artune \
      timeout -k 5 300 $W/bin/gpu-tests gpu_nccl --nocapture --test-threads 1 ) > $W/channels.txt 2>&1
  echo "exit $?" >> $W/channels.txt
  (cd $W && tar czf $OUT/channels.tgz --exclude=bin .);;
tune)
  R=$PWD; B=$R/.carry/g48/bin; N=/tmp/nccl232; W=/tmp/g48tune; rm -rf $W; mkdir -p $W/bin
  pack() { (cd $W && tar czf $OUT/tune.tgz --exclude=bin .); }
  [ -f $N/libnccl.so.2 ] || cat $N/part? > $N/libnccl.so.2
  (cd $N && sha256sum -c $B/libnccl.sha256) > $W/sha.txt 2>&1 || { pack; exit 1; }
  for b in artune libartune.so; do xz -dc $B/$b.xz > $W/bin/$b; chmod +x $W/bin/$b; done
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; cat $B/commit.txt; } > $W/env.txt 2>&1
  cd /tmp
  S=$(date +%s)
  # K ranks time-slice GPU 0 at ~5 ms a call at K = 2 and 13-36 ms at 4 whatever the size
  # (NOTES.md), and every start of them (a variant, a refined size, a channel count) costs
  # NCCL's setup: K = 2 and three grid sizes, graph mode first (the capture is what is new).
  for run in "2 graph 16K:64K 140" "2 eager 16K:64K 0"; do
    set -- $run; k=$1; mode=$2; sizes=$3; lim=$4; out=tune$k$mode
    # The last tune takes what is left of 300 s, less 20 s for `why` and the packing.
    [ $lim = 0 ] && lim=$((S + 280 - $(date +%s)))
    [ $lim -lt 30 ] && { echo "no time left for K=$k $mode" >> $W/env.txt; break; }
    ( time env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2 RUST_LOG=artune=info \
        timeout -s INT -k 5 $lim $W/bin/artune tune --loopback $k --tp $k --mode $mode \
        --sizes $sizes --out $W/$out.json ) > $W/$out.txt 2>&1
    echo "exit $? (limit $lim s)" >> $W/$out.txt
    for b in 16384 65536; do $W/bin/artune why $W/$out.json --tp $k --mode $mode \
      --bytes $b; done > $W/why-$out.txt 2>&1
    python3 - $W/$out.json > $W/nccl-$out.txt 2>&1 <<'PY'
import json, sys
# Every NCCL cell with its samples and interval: the spread the K-rank samples give the tune
# (one mean repeated, zero width, before).
p = json.load(open(sys.argv[1]))
print(p["fabric"])
for g in p["groups"]:
    print("TP%d %s nccl_channels=%s waived=%s" % (g["tp"], g["mode"], g.get("nccl_channels"),
                                                 sorted(g.get("waived", {}))))
    for b in g["buckets"]:
        for name, t in sorted(b["results"].items()):
            if name.startswith("nccl"):
                print("  %9d %-18s %9.2f [%9.2f, %9.2f] n=%d" % (b["bytes"], name,
                      t["median_us"], t["ci_low_us"], t["ci_high_us"], t["samples"]))
PY
    pack
  done
  echo "done $(date -u)" >> $W/env.txt; pack;;
*) echo "usage: channels.sh carry [BUILD_TREE] | run | tune"; exit 2;;
esac
