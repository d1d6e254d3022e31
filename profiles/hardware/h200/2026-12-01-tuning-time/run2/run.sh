#!/bin/bash
# Run 2: where start-up and set-up go (-v), the kernel cache across two processes, check
# --measure twice, and the two-stage 64 MiB slowdown against the working set.
B=$PWD/.carry/r2
export ARTUNE_CACHE_DIR=/tmp/artune-cache
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,persistence_mode,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $OUT/env.txt 2>&1
cd /tmp
( time timeout -s INT 250 $B/artune -v tune --loopback 8 --out $OUT/full.json ) > $OUT/tune-full.txt 2>&1; echo "exit $?" >> $OUT/tune-full.txt
for i in 1 2; do
( time timeout -s INT 60 $B/artune -v check $OUT/full.json --measure --loopback 8 ) > $OUT/check-measure-$i.txt 2>&1; echo "exit $?" >> $OUT/check-measure-$i.txt
done
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/env.txt
{
echo "== loopback 8, IPC"; timeout 60 $B/artune bench kernels --loopback 8 --backend two_stage_pull --backend two_stage_push --sizes 32M:64M 2>&1 | grep -E "copy ceiling|two_stage_p"
echo "== loopback 4, IPC"; timeout 60 $B/artune bench kernels --loopback 4 --backend two_stage_pull --backend two_stage_push --sizes 64M:128M 2>&1 | grep -E "copy ceiling|two_stage_p"
} > $OUT/bench-working-set.txt 2>&1
ls -la /tmp/artune-cache >> $OUT/env.txt
echo "end $(date -u +%T); workers left: $(ps aux | grep __worker | grep -vc grep)" >> $OUT/env.txt
