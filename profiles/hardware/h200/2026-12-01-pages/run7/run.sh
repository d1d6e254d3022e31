#!/bin/bash
# Run 7: two-stage kernels at 16 and 64 MiB with 8 ranks, buffers of whole 2 MiB pages
# against the binary before (sizes as asked).
B=$PWD/.carry/r7
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $OUT/env.txt 2>&1
cd /tmp
for bin in artune-before artune artune-before artune; do
  echo "== $bin"
  timeout 60 $B/$bin bench kernels --loopback 8 --backend two_stage_pull --backend two_stage_push --sizes 16M:64M 2>&1 | grep -E "copy ceiling|two_stage_p"
done > $OUT/bench-2mib-pages.txt 2>&1
