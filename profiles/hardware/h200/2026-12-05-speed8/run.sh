#!/bin/bash
# Issue 46 on the H200 when one is lent: the first tune after boot again, then its regret
# against an exhaustive TP8 tune made in the same call (speed7 had no exhaustive tune). Loopback:
# 8 virtual ranks on one GPU; nothing here is multi-GPU evidence. The FIRST command after boot:
#   bash .carry/s60/unpack.sh /tmp/s60 && C=/tmp/s60 END=210 bash profiles/hardware/h200/2026-12-05-speed8/run.sh
# Results in $OUT/speed8.tgz, re-packed after each step.
set -u
R=$PWD; C=${C:?set C}; END=${END:-210}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/speed8; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed8-cache
rm -rf $ARTUNE_CACHE_DIR
pack() { (cd $W && tar czf $OUT/speed8.tgz .); }
. $R/profiles/hardware/lib.sh
describe
pack
cd /tmp || exit 1
step first 45 $A -v tune --loopback 8 --out $W/first.json
step exhaustive 120 $A tune --loopback 8 --tp 8 --exhaustive --out $W/exhaustive.json
[ -f $W/exhaustive.json ] && step compare-ex 10 $A compare $W/first.json $W/exhaustive.json
{ for n in first exhaustive; do printf '%-10s %s  %s\n' $n "$(grep '^exit' $W/$n.txt)" "$(grep -m1 '^real' $W/$n.txt)"; done
  grep -h -e 'ready in' -e 'workers up after' -e 'tuning took' -e 'where it went' $W/first.txt \
    | grep -v 'worker [0-9]' | sed 's/.*INFO[^:]*: //; s/^/  /'
  [ -f $W/compare-ex.txt ] && grep -i -e regret -e alike $W/compare-ex.txt; } > $W/summary.txt 2>&1
date -u >> $W/env.txt; pack
