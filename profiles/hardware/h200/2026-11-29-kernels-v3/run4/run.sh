#!/bin/bash
# v6 (kernels v3: programmatic dependent launches): GPU tests, the kernel benchmark twice,
# and the full loopback tune with 8 virtual ranks.
cd "$(dirname "$0")"
R=/tmp/r6; mkdir -p $R/loopback8
{ date -u; nvidia-smi --query-gpu=name,driver_version,pci.bus_id,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; } > $R/env.txt 2>&1
timeout 90 ./gpu-tests --test-threads=4 --nocapture > $R/gpu-tests-v3.log 2>&1; echo "tests rc=$?" | tee -a $R/gpu-tests-v3.log
grep -E "test result|panicked|FAILED" $R/gpu-tests-v3.log | cut -c1-200
for r in 1 2; do
  timeout 80 ./artune bench kernels --loopback 8 --out $R/bench-kernels-v3-run$r.json > $R/bench-kernels-v3-run$r.txt 2>&1; echo "bench $r rc=$?"
  grep -A9 "^targets" $R/bench-kernels-v3-run$r.txt
done
date -u >> $R/env.txt
./artune topo > $R/loopback8/topo.txt 2>&1
( time timeout 300 ./artune tune --loopback 8 --out $R/loopback8/profile-loopback8.json --plot $R/loopback8 ) > $R/loopback8/tune-loopback8.txt 2>&1; echo "tune rc=$?"
tail -5 $R/loopback8/tune-loopback8.txt
date -u >> $R/env.txt
tar czf $OUT/r6.tgz -C /tmp r6
