#!/bin/bash
# Issue 42, the one-stage kernels at 4 KiB (branch k42): small calls over more SMs (the
# registered one_stage_pull in 128-thread blocks up to 32 KiB per rank, one_stage_push's LL form
# in 64-thread blocks) and one_stage_push's LL form zeroing no line it read. A/B in one device
# call against main before the branch: `bench kernels --loopback 8` for one_stage_pull and
# one_stage_push at 4K, 16K and 64K per rank (graph = registered form where there is one, eager
# = staged; unchanged, so controls: the staged one_stage_pull, still 512-thread blocks, and
# one_stage_push at 64K, past its LL form), old and new
# interleaved (old, new, old, new, ...), after the GPU tests of the new binary that check bit
# exactness (eager in loopback 2, 4, 8; repeated calls and graph replays in 8; graph replays in
# 2 and 4; one_stage_push's LL form as its size shrinks and grows; a replay before registration
# NaN). Loopback: virtual ranks on one GPU; nothing here is multi-GPU evidence.
#
# Build the carry (here, from the k42 checkout, with main's artune before the branch as OLD):
#   bash profiles/hardware/h200/build-carry.sh k42 OLD=<main's artune, xz-compressed>
# then on the device, from the repository root (carry [".carry/k42"]):
#   bash .carry/k42/unpack.sh /tmp/k42 &&
#     C=/tmp/k42 END=200 bash profiles/hardware/h200/2026-12-05-kernels3/run.sh
# It needs about 90 s (GPU tests ~25 s, each bench ~5-8 s, kernels compiled once per binary
# into ARTUNE_CACHE_DIR); END (default 200) bounds it: a step that no longer fits is skipped
# and says so. PAIRS (default 3) old/new bench pairs.
# Results: $OUT/kernels3.tgz, re-packed after each step: env.txt, gpu.txt, bench-<i>-<old|new>.txt
# and .json, summary.txt (per backend, mode and size: each bench's median time per call for
# old and new, the median of those per binary, new - old).
# Look for: gpu.txt "test result: ok"; in summary.txt one_stage_pull and one_stage_push 4K
# graph (target <= 2.50 us; 2.94 / 3.04 us in ../2026-12-05-kernels2/), and no size slower.
set -u
R=$PWD; C=${C:-$R/.carry/k42}; A=$C/artune; O=$C/artune-old; G=$C/gpu
W=/tmp/kernels3; rm -rf $W; mkdir -p $W
# ARTUNE_BIN: the artune the GPU tests' workers run (artune itself does not read it).
export ARTUNE_CACHE_DIR=${ARTUNE_CACHE_DIR:-/tmp/kernels3-kcache} ARTUNE_BIN=$A
export NCCL_NVLS_ENABLE=0
unset ARTUNE_WORKER_BIN  # each artune runs its own workers: old kernels with old, new with new
pack() { (cd $W && tar czf $OUT/kernels3.tgz .); }
END=${END:-200}; PAIRS=${PAIRS:-3}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS - 2)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
  echo "new: $($A --version)"; cat $C/commit.txt; echo "old: $($O --version)"; } > $W/env.txt 2>&1
[ -x $O ] || echo "no $O: build the carry with OLD=" >> $W/env.txt
pack
step gpu 80 $G --test-threads 1 --exact \
  gpu_custom_kernels_verify_bit_exactly_in_loopback_2_4_8_or_skip \
  gpu_repeated_calls_and_graph_replay_stay_correct_or_skip \
  gpu_flat_kernels_replay_bit_exactly_in_graphs_in_loopback_2_and_4_or_skip \
  gpu_one_stage_push_ll_takes_no_stale_line_as_sizes_change_or_skip \
  gpu_an_unregistered_graph_replay_is_nan_never_a_sum_or_skip
ONE="--backend one_stage_pull --backend one_stage_push --sizes 4K:64K"
for i in $(seq 1 $PAIRS); do
  for v in old new; do
    b=$A; [ $v = old ] && b=$O
    step bench-$i-$v 25 $b bench kernels --loopback 8 $ONE --out $W/bench-$i-$v.json
  done
done
{ date -u; nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
  echo "end after $SECONDS s"; } >> $W/env.txt
python3 - $W > $W/summary.txt 2>&1 <<'PY'
import glob, json, os, statistics, sys
w = sys.argv[1]
runs = {"old": [], "new": []}
for f in sorted(glob.glob(os.path.join(w, "bench-*-*.json"))):
    v = f.rsplit("-", 1)[1][:-5]
    try:
        runs[v].append(json.load(open(f))["results"])
    except (OSError, ValueError, KeyError) as e:
        print(f"{os.path.basename(f)}: unreadable ({e})")
print(f"bench kernels --loopback 8, bf16: us per call, each bench's median of its samples; "
      f"benches: old {len(runs['old'])}, new {len(runs['new'])} (interleaved)")
keys = []
for v in runs.values():
    for res in v:
        for r in res:
            k = (r["backend"], r["mode"], r["bytes_per_rank"])
            if k not in keys:
                keys.append(k)
print(f"{'backend':<16}{'mode':<7}{'per rank':>9}  {'old (each)':<24}{'new (each)':<24}"
      f"{'old':>7}{'new':>7}{'new-old':>9}")
for k in keys:
    each = {v: [r["us_per_call"] for res in runs[v] for r in res
                if (r["backend"], r["mode"], r["bytes_per_rank"]) == k] for v in runs}
    med = {v: statistics.median(x) if x else float("nan") for v, x in each.items()}
    fmt = lambda x: " ".join(f"{y:.2f}" for y in x)
    print(f"{k[0]:<16}{k[1]:<7}{k[2] // 1024:>8}K  {fmt(each['old']):<24}{fmt(each['new']):<24}"
          f"{med['old']:>7.2f}{med['new']:>7.2f}{med['new'] - med['old']:>+9.2f}")
print("loopback: 8 virtual ranks on one GPU, one grid per call; not multi-GPU evidence")
PY
pack
