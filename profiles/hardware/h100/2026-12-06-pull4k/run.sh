#!/bin/bash
# Issue 42, one call: (1) where one_stage_pull's 4 KiB graph time goes, by variants of its
# binary built from af4fd62 (measurement only, never merged; their diffs beside this file):
# v0 as merged, v1/v2 its small registered calls in 64/32-thread blocks instead of 128, v3
# without the closing barrier of the registered form, v4 without either barrier of it (v3 and
# v4 are unsafe kernels: a peer may overwrite an input still being read); interleaved rounds.
# (2) one full `bench kernels` of v0. (3) the op's eager path with the capture status read
# from the driver (the wheel, built from this tree): op_overhead.py, op_pieces.py.
# Loopback: 8 virtual ranks on one GPU (1 for the op). Nothing here is multi-GPU evidence.
#   C=<carry folder with artune-v0..v4 and the wheel> END=480 bash <this file>
set -u
R=$PWD; C=${C:?set C}; END=${END:-480}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune-v0
S=$(date +%s); W=/tmp/pull4k; rm -rf $W; mkdir -p $W/py; export ARTUNE_CACHE_DIR=/tmp/pull4k-cache
pack() { (cd $W && tar czf $OUT/pull4k.tgz --exclude ./py .); }
. $R/profiles/hardware/lib.sh
describe
pack
cd /tmp || exit 1
for v in v0 v1 v2 v3 v4; do
  step warm-$v 40 $C/artune-$v bench kernels --loopback 8 --sizes 4K:4K --backend one_stage_pull
done
for i in 1 2 3 4; do for v in v0 v1 v2 v3 v4; do
  step $v-$i 15 $C/artune-$v bench kernels --loopback 8 --sizes 4K:16K --backend one_stage_pull --backend one_stage_push --out $W/$v-$i.json
done; done
python3 - $W > $W/summary.txt 2>&1 <<'PY'
import json, os, statistics, sys
w = sys.argv[1]; rows = {}
for v in ["v0", "v1", "v2", "v3", "v4"]:
    for i in range(1, 5):
        f = f"{w}/{v}-{i}.json"
        if not os.path.exists(f): continue
        for r in json.load(open(f))["results"]:
            rows.setdefault((r["backend"], r["mode"], r["bytes_per_rank"], v), []).append(r["us_per_call"])
for (b, m, n, v), t in sorted(rows.items()):
    print(f"{b:16} {m:5} {n:>6} {v} median {statistics.median(t):.2f} us  runs " + " ".join(f"{x:.2f}" for x in t))
PY
pack
step full 80 $A bench kernels --loopback 8 --islands 4,4 --out $W/full.json
sed -n '/^targets/,$p' $W/full.txt >> $W/summary.txt; pack
# The op: one rank, the wheel of this tree (EagerPath reads the capture status from the driver).
PY=/opt/torch/.venv/bin/python; export ARTUNE_BIN=$A PYTHONPATH=$W/py
{ $PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl; sha256sum $C/artune-*.whl
  $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  grep -m1 "model name" /proc/cpuinfo; } >> $W/env.txt 2>&1
step tune 30 $A tune --loopback 2 --tp 2 --sizes 4K:1M --no-contention --out $W/profile.json
T="$PY -m torch.distributed.run --standalone --nproc-per-node 1"
step overhead 45 $T $R/benches/op_overhead.py --profile $W/profile.json --out $W/overhead.json
step pieces 30 $T $R/benches/op_pieces.py --profile $W/profile.json --out $W/pieces.json
step overhead-reg 45 $T $R/benches/op_overhead.py --register --profile $W/profile.json --out $W/overhead-reg.json
date -u >> $W/env.txt; pack
