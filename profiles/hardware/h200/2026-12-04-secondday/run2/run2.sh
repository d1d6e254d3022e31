#!/bin/bash
# Second call: the re-checks with --loopback 8 against run 1's warm profile on a fresh machine.
set -u
R=$PWD; C=$R/.carry/sd; A=$C/artune; W=/tmp/sd2; rm -rf $W; mkdir -p $W
P=$C/warm.json
pack() { (cd $W && tar czf $OUT/sd2.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; uptime; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
  $A --version; cat $C/commit.txt; } > $W/env.txt 2>&1
cd /tmp; export ARTUNE_CACHE_DIR=/tmp/sd2-cache
step noloop 60 $A check $P --measure
step plain 60 $A check $P
for i in $(seq 1 12); do step check$i 60 $A check $P --measure --loopback 8; done
( time $A check $P --measure --loopback 8 ) > $W/two1.txt 2>&1 & p1=$!; sleep 0.3
( time $A check $P --measure --loopback 8 ) > $W/two2.txt 2>&1 & p2=$!
wait $p1; echo "exit $?" >> $W/two1.txt; wait $p2; echo "exit $?" >> $W/two2.txt; pack
step novis 60 env CUDA_VISIBLE_DEVICES= $A tune --loopback 8 --out $W/novis.json
$R/.carry/sd/hogrun.sh $W $A
echo "workers left: $(pgrep -c -f 'artune worker' || true)" >> $W/env.txt; pack
