#!/bin/bash
# Run 22 (2026-12-02): check --measure against the variation recorded at tune time, and the
# tune's time with kernels compiled ahead. Binary in .carry/r22; outputs packed under $OUT.
R=$PWD; A=$R/.carry/r22/artune
W=/tmp/run22; mkdir -p $W
PY=/opt/torch/.venv/bin/python
pack() { (cd $W && tar czf $OUT/run22.tgz .); }
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; uptime; } > $W/env.txt 2>&1
cd /tmp
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
# 1. Tune time: the first on this machine and a second, each with an empty kernel cache; warm.
step cold1 90 env ARTUNE_CACHE_DIR=/tmp/cache1 $A -v tune --loopback 8 --out $W/cold1.json
step cold2 90 env ARTUNE_CACHE_DIR=/tmp/cache2 $A -v tune --loopback 8 --out $W/cold2.json
export ARTUNE_CACHE_DIR=/tmp/cache2
step warm 90 $A tune --loopback 8 --out $W/fresh.json
step show 20 $A show $W/fresh.json
# 2. 20 back-to-back checks of the fresh profile (both modes).
for i in $(seq -w 1 20); do step check-$i 60 $A check $W/fresh.json --measure --loopback 8; done
# 3. Real changes: a chosen kernel made 3x slower; a changed NCCL variable.
K=$($PY -c "import json,collections;p=json.load(open('$W/fresh.json'));c=collections.Counter(b['choice'] for g in p['groups'] for b in g['buckets'] if not b['choice'].startswith('nccl'));print(c.most_common(1)[0][0])")
echo "slowed: $K" >> $W/env.txt
step check-slow3 60 env ARTUNE_CUDA_FAULTS=slow=$K:3 $A check $W/fresh.json --measure --loopback 8
step check-nccl-env 60 env NCCL_PROTO=Simple $A check $W/fresh.json --measure --loopback 8
echo "end $(date -u +%T) after $SECONDS s; workers left: $(pgrep -fc __worker)" >> $W/env.txt
pack
