#!/bin/bash
# Issue 46 on the H200: 20 `check --measure` back to back against a tune made here, and the
# catches (the profile's most chosen kernel 3x slower; NCCL_PROTO set). Loopback: 8 virtual ranks
# on one GPU; nothing here is multi-GPU evidence.
#   bash .carry/s60/unpack.sh /tmp/s60 && C=/tmp/s60 END=190 bash profiles/hardware/h200/2026-12-05-speed9/run.sh
set -u
R=$PWD; C=${C:?set C}; END=${END:-190}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/speed9; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed9-cache
pack() { (cd $W && tar czf $OUT/speed9.tgz .); }
. $R/profiles/hardware/lib.sh
describe
pack
cd /tmp || exit 1
step tune 45 $A tune --loopback 8 --out $W/tune.json
for i in $(seq 1 20); do step check$i 20 $A check $W/tune.json --measure --loopback 8; done
K=$(python3 -c "import json,collections;p=json.load(open('$W/tune.json'));c=collections.Counter(b['choice'] for g in p['groups'] for b in g['buckets'] if not b['choice'].startswith('nccl'));print(c.most_common(1)[0][0] if c else '')" 2>/dev/null)
echo "slowed: ${K:-none chosen}" >> $W/env.txt
[ -n "$K" ] && step check-slow3 20 env ARTUNE_CUDA_FAULTS=slow=$K:3 $A check $W/tune.json --measure --loopback 8
step check-nccl-env 20 env NCCL_PROTO=Simple $A check $W/tune.json --measure --loopback 8
{ for n in tune $(seq -f 'check%g' 1 20) check-slow3 check-nccl-env; do [ -f $W/$n.txt ] &&
    printf '%-15s %s  %s\n' $n "$(grep '^exit' $W/$n.txt)" "$(grep -m1 '^real' $W/$n.txt)"; done; } > $W/summary.txt
date -u >> $W/env.txt; pack
