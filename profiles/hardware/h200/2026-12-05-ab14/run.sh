#!/bin/bash
# Issue 42: ac5f51a's one_stage_push LL form against 3085e4a (artune-old) once more on whichever
# card comes (the gpu13 script without its GPU tests, plus one full `bench kernels` of the new
# binary: the >= 16M rows and the 4K targets). Loopback: 8 virtual ranks on one GPU. Nothing
# here is multi-GPU evidence.
#   bash .carry/s64/unpack.sh /tmp/s64 && C=/tmp/s64 END=300 bash profiles/hardware/h200/2026-12-05-ab14/run.sh
set -u
R=$PWD; C=${C:?set C}; END=${END:-300}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/ab14; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/ab14-cache
pack() { (cd $W && tar czf $OUT/ab14.tgz .); }
. $R/profiles/hardware/lib.sh
describe
pack
cd /tmp || exit 1
step warm-old 30 $C/artune-old bench kernels --loopback 8 --sizes 4K:4K --backend one_stage_push
step warm-new 30 $A bench kernels --loopback 8 --sizes 4K:4K --backend one_stage_push
for i in 1 2 3 4 5; do for v in old new; do
  B=$A; [ $v = old ] && B=$C/artune-old
  step $v$i 15 $B bench kernels --loopback 8 --sizes 4K:64K --backend one_stage_push --backend one_stage_pull --out $W/$v$i.json
done; done
python3 - $W > $W/summary.txt 2>&1 <<'PY'
import json, os, statistics, sys
w = sys.argv[1]; rows = {}
for v in ["old", "new"]:
    for i in range(1, 6):
        f = f"{w}/{v}{i}.json"
        if not os.path.exists(f): continue
        for r in json.load(open(f))["results"]:
            if r["mode"] == "graph":
                rows.setdefault((r["backend"], r["bytes_per_rank"], v), []).append(r["us_per_call"])
for (b, n, v), t in sorted(rows.items()):
    print(f"{b:16} {n:>6} {v:4} median {statistics.median(t):.2f} us  runs " + " ".join(f"{x:.2f}" for x in t))
PY
pack
step full 75 $A bench kernels --loopback 8 --islands 4,4 --out $W/full.json
sed -n '/^targets/,$p' $W/full.txt >> $W/summary.txt; date -u >> $W/env.txt; pack
