#!/bin/bash
# Issue 42 item 3, A/B in one call on one host: the op's eager path reading the capture status
# from torch (old: the wheel of ac5f51a, whose op code af4fd62 keeps) against reading it from
# the driver (new: the wheel of this tree), alternating, four rounds of op_overhead.py each,
# then op_pieces.py with each. One rank, one GPU.
#   C=<folder with artune-v0 and the new wheel> O=<folder with the old wheel> END=300 bash <this file>
set -u
R=$PWD; C=${C:?set C}; O=${O:?set O}; END=${END:-300}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune-v0
S=$(date +%s); W=/tmp/eagerab; rm -rf $W; mkdir -p $W/new $W/old; export ARTUNE_CACHE_DIR=/tmp/eagerab-cache
pack() { (cd $W && tar czf $OUT/eagerab.tgz --exclude ./new --exclude ./old .); }
. $R/profiles/hardware/lib.sh
describe
PY=/opt/torch/.venv/bin/python; export ARTUNE_BIN=$A
{ $PY -m pip install -q --no-deps --target $W/new $C/artune-*.whl
  $PY -m pip install -q --no-deps --target $W/old $O/artune-*.whl
  sha256sum $C/artune-*.whl $O/artune-*.whl; grep -m1 "model name" /proc/cpuinfo; } >> $W/env.txt 2>&1
cd /tmp || exit 1
step tune 30 $A tune --loopback 2 --tp 2 --sizes 4K:1M --no-contention --out $W/profile.json
T="$PY -m torch.distributed.run --standalone --nproc-per-node 1"
for i in 1 2 3 4; do for v in old new; do
  PYTHONPATH=$W/$v step overhead-$v$i 40 $T $R/benches/op_overhead.py --profile $W/profile.json --out $W/overhead-$v$i.json
done; done
for v in old new; do
  PYTHONPATH=$W/$v step pieces-$v 30 $T $R/benches/op_pieces.py --profile $W/profile.json --out $W/pieces-$v.json
done
$PY - $W > $W/summary.txt 2>&1 <<'PYEOF'
import json, os, statistics, sys
w = sys.argv[1]
for v in ("old", "new"):
    per = {}
    for i in (1, 2, 3, 4):
        f = f"{w}/overhead-{v}{i}.json"
        if not os.path.exists(f): continue
        for r in json.load(open(f))["rows"]:
            per.setdefault((r["backend"], r["bytes"]), []).append(r["overhead_eager_us"])
    print(v, "eager op over raw launch, us (median of rounds; rounds):")
    for k, t in sorted(per.items()):
        print(f"  {k[0]:15} {k[1]:>8}  {statistics.median(t):5.2f}  " + " ".join(f"{x:.2f}" for x in t))
    if per:
        print(f"  worst median {max(statistics.median(t) for t in per.values()):.2f}")
PYEOF
date -u >> $W/env.txt; pack
