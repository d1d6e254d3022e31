#!/bin/bash
# Run 2 of issue 13: probe test, kernel benchmark, full loopback tune, through worker processes.
B=$PWD/.carry/wt13
export ARTUNE_BIN=$B/artune
mkdir -p $OUT/tune
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $OUT/env.txt 2>&1
cd /tmp
timeout 60 $B/gpu --test-threads=1 --nocapture gpu_contention gpu_memory > $OUT/gpu-tests-probe.log 2>&1; echo "exit $?" >> $OUT/gpu-tests-probe.log
date -u >> $OUT/env.txt
( time timeout 200 $B/artune bench kernels --loopback 8 --out $OUT/bench-kernels.json ) > $OUT/bench-kernels.txt 2>&1; echo "exit $?" >> $OUT/bench-kernels.txt
date -u >> $OUT/env.txt
$B/artune topo > $OUT/tune/topo.txt 2>&1
( time timeout 330 $B/artune tune --loopback 8 --out $OUT/tune/profile-loopback8.json --plot $OUT/tune ) > $OUT/tune/tune-loopback8.txt 2>&1; echo "exit $?" >> $OUT/tune/tune-loopback8.txt
date -u >> $OUT/env.txt
echo "workers left: $(ps aux | grep __worker | grep -vc grep)" >> $OUT/env.txt
cd $OUT && tar czf tune.tgz tune && rm -rf tune
