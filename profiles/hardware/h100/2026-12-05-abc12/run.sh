#!/bin/bash
# Issue 42: where one_stage_push's LL form reads its status, three binaries on one machine:
# old (3085e4a: after its polls), a (139c1d6: at the start, sends and polls gated on it) and b
# (at the start, sends and polls as before: the working tree of this run, never committed as
# such). `bench kernels --sizes 4K:64K`, one_stage_push and one_stage_pull (a control, unchanged),
# rotating old, a, b five times. Loopback: 8 virtual ranks on one GPU; not multi-GPU evidence.
#   bash .carry/s63/unpack.sh /tmp/s63 && C=/tmp/s63 END=240 bash profiles/hardware/h100/2026-12-05-abc12/run.sh
set -u
R=$PWD; C=${C:?set C}; END=${END:-240}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/abc12; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/abc12-cache
pack() { (cd $W && tar czf $OUT/abc12.tgz .); }
. $R/profiles/hardware/lib.sh
describe
pack
cd /tmp || exit 1
declare -A BIN=([old]=$C/artune-old [a]=$C/artune-a [b]=$A)
for v in old a b; do step warm-$v 30 ${BIN[$v]} bench kernels --loopback 8 --sizes 4K:4K --backend one_stage_push; done
for i in 1 2 3 4 5; do for v in old a b; do
  step $v$i 15 ${BIN[$v]} bench kernels --loopback 8 --sizes 4K:64K --backend one_stage_push --backend one_stage_pull --out $W/$v$i.json
done; done
python3 - $W > $W/summary.txt 2>&1 <<'PY'
import json, os, statistics, sys
w = sys.argv[1]; rows = {}
for v in ["old", "a", "b"]:
    for i in range(1, 6):
        f = f"{w}/{v}{i}.json"
        if not os.path.exists(f): continue
        for r in json.load(open(f))["results"]:
            if r["mode"] == "graph":
                rows.setdefault((r["backend"], r["bytes_per_rank"], v), []).append(r["us_per_call"])
for (b, n, v), t in sorted(rows.items()):
    print(f"{b:16} {n:>6} {v:4} median {statistics.median(t):.2f} us  runs " + " ".join(f"{x:.2f}" for x in t))
PY
date -u >> $W/env.txt; pack
