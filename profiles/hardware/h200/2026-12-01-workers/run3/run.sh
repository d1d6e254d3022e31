#!/bin/bash
# Run 3 of issue 13: IPC vs single-owner two-stage kernels at 16/64 MiB, GPU tests, a loopback
# tune through worker processes.
B=$PWD/.carry/wt13
export ARTUNE_BIN=$B/artune
mkdir -p $OUT/tune
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; } > $OUT/env.txt 2>&1
cd /tmp
{
for i in 1; do
  echo "== IPC-shared buffers (default), round $i"
  timeout 60 $B/artune bench kernels --loopback 8 --backend two_stage_pull --backend two_stage_push --sizes 16M:64M 2>&1 | grep -E "copy ceiling|two_stage|worst"
  echo "== ARTUNE_LOOPBACK_OWNERS=one (rank 0's worker owns every buffer, no IPC), round $i"
  ARTUNE_LOOPBACK_OWNERS=one timeout 60 $B/artune bench kernels --loopback 8 --backend two_stage_pull --backend two_stage_push --sizes 16M:64M 2>&1 | grep -E "copy ceiling|two_stage|worst"
done
} > $OUT/bench-ipc-vs-one-owner.txt 2>&1
date -u >> $OUT/env.txt
timeout 140 $B/gpu --test-threads=1 --nocapture > $OUT/gpu-tests.log 2>&1; echo "exit $?" >> $OUT/gpu-tests.log
date -u >> $OUT/env.txt
( time timeout 115 $B/artune tune --loopback 8 --sizes 1K:4M --out $OUT/tune/profile-loopback8.json --plot $OUT/tune ) > $OUT/tune/tune-loopback8.txt 2>&1; echo "exit $?" >> $OUT/tune/tune-loopback8.txt
date -u >> $OUT/env.txt
echo "workers left: $(ps aux | grep __worker | grep -vc grep)" >> $OUT/env.txt
cd $OUT && tar czf tune.tgz tune && rm -rf tune
