#!/bin/bash
# Issue 46 on the H200 (loopback: virtual ranks on one GPU; nothing here is multi-GPU evidence).
# From the repository root, with .carry/g46/ holding artune (stripped release binary of the
# commit in commit.txt):  bash .carry/g46/run.sh   (about 6 minutes; first command on a fresh machine)
# Results: $OUT/speed.tgz, re-packed after each step.
# Look for: first/warm "real" (goal <= 15 s cold); check*.txt "real" (goal <= 4 s) and exit 0
# (0 false stale in 20); compare.txt: regret of the fast tune against the exhaustive reference.
set -u
R=$PWD; C=$R/.carry/g46; A=$C/artune
W=/tmp/speed; rm -rf $W; mkdir -p $W; export ARTUNE_CACHE_DIR=/tmp/speed-cache
pack() { (cd $W && tar czf $OUT/speed.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; uptime; nproc; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
  $A --version; cat $C/commit.txt; ls -l /lib/x86_64-linux-gnu/libnccl.so*; } > $W/env.txt 2>&1
cd /tmp
step first 90 $A tune --loopback 8 --out $W/first.json
step warm 90 $A tune --loopback 8 --out $W/warm.json
step check-v 60 $A check $W/warm.json --measure --loopback 8 -v
for i in $(seq 1 20); do step check$i 60 $A check $W/warm.json --measure --loopback 8; done
step exhaustive 200 $A tune --loopback 8 --tp 8 --exhaustive --out $W/exhaustive.json
step compare 30 $A compare $W/first.json $W/exhaustive.json
date -u >> $W/env.txt; pack
