#!/bin/bash
# Run 1 of issue 13 (worker processes): GPU tests, kernel benchmark, a short loopback tune.
B=$PWD/.carry/wt13
export ARTUNE_BIN=$B/artune
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.used --format=csv; ls -l /lib/x86_64-linux-gnu/libnccl* ; which nvidia-cuda-mps-control; nproc; } > $OUT/env.txt 2>&1
cd /tmp
timeout 200 $B/gpu --test-threads=1 --nocapture > $OUT/gpu-tests.log 2>&1; echo "exit $?" >> $OUT/gpu-tests.log
date -u >> $OUT/env.txt
timeout 120 $B/artune bench kernels --loopback 8 --out $OUT/bench.json > $OUT/bench.txt 2>&1; echo "exit $?" >> $OUT/bench.txt
date -u >> $OUT/env.txt
( time timeout 150 $B/artune tune --loopback 8 --sizes 1K:4M --out $OUT/profile-short.json ) > $OUT/tune-short.txt 2>&1; echo "exit $?" >> $OUT/tune-short.txt
date -u >> $OUT/env.txt
ps aux | grep -c "__worker" >> $OUT/env.txt
nvidia-smi --query-gpu=memory.used --format=csv >> $OUT/env.txt
