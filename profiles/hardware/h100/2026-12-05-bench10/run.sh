#!/bin/bash
# Issue 42 on current kernels (3085e4a; kernels unchanged since 5269980): `bench kernels` in
# full twice (the before/after table's 4K and >= 16M rows), 4 KiB alone five times (how reliably
# the one-stage kernels sit under 2.5 us), and the op's overhead over the raw launch
# (benches/op_overhead.py, staged and registered). Loopback: 8 virtual ranks on one GPU; the
# op's overhead is one rank. Nothing here is multi-GPU evidence.
#   bash .carry/s60/unpack.sh /tmp/s60 && cp .carry/s57w/*.whl /tmp/s60/ &&
#   C=/tmp/s60 END=300 bash profiles/hardware/h100/2026-12-05-bench10/run.sh
set -u
R=$PWD; C=${C:?set C}; END=${END:-300}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/bench10; rm -rf $W; mkdir -p $W/py; export ARTUNE_CACHE_DIR=/tmp/bench10-cache
pack() { (cd $W && tar czf $OUT/bench10.tgz --exclude ./py .); }
. $R/profiles/hardware/lib.sh
describe
{ grep -m1 "model name" /proc/cpuinfo; ls $C/*.whl; } >> $W/env.txt 2>&1
pack
cd /tmp || exit 1
step full1 75 $A bench kernels --loopback 8 --islands 4,4 --out $W/full1.json
for i in 1 2 3 4 5; do step small$i 15 $A bench kernels --loopback 8 --sizes 4K:4K --out $W/small$i.json; done
PY=/opt/torch/.venv/bin/python
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
export PYTHONPATH=$W/py ARTUNE_BIN=$A
step tune 25 $A tune --loopback 2 --tp 2 --sizes 4K:1M --no-contention --out $W/profile.json
B="$PY -m torch.distributed.run --standalone --nproc-per-node 1 $R/benches/op_overhead.py"
step overhead 40 $B --profile $W/profile.json --out $W/overhead.json
step overhead-reg 40 $B --profile $W/profile.json --register --out $W/overhead-reg.json
step full2 75 $A bench kernels --loopback 8 --islands 4,4 --out $W/full2.json
{ for n in full1 full2 $(seq -f 'small%g' 1 5); do [ -f $W/$n.txt ] || continue
    echo "== $n: $(grep '^exit' $W/$n.txt)  $(grep -m1 '^real' $W/$n.txt)"
    sed -n '/^targets/,/^real/p' $W/$n.txt | grep -v '^real'; done
  for n in overhead overhead-reg; do [ -f $W/$n.txt ] && { echo "== $n"; grep -i -e target -e 'us' $W/$n.txt | tail -30; }; done
} > $W/summary.txt 2>&1
date -u >> $W/env.txt; pack
