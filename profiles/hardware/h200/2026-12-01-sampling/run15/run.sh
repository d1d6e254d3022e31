#!/bin/bash
# Run 15: is one-rank NCCL's eager drift the driver's device-to-device copy?
set -u
d=$(dirname "$0")
o=$OUT/r15; mkdir -p $o
date -u > $o/env.txt
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,clocks.sm,clocks.mem,pstate --format=csv >> $o/env.txt 2>&1
nproc >> $o/env.txt; grep -m3 MHz /proc/cpuinfo >> $o/env.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,utilization.gpu --format=csv,noheader -lms 250 > $o/smi.csv 2>&1 &
smi=$!
vmstat -t 1 > $o/vmstat.txt 2>&1 &
vm=$!
echo "start $(date -u +%T.%N)" > $o/times.txt
$d/drift 1048576 75 1 20 > $o/drift-1M-1s.txt 2> $o/drift-1M-1s.err
echo "second $(date -u +%T.%N)" >> $o/times.txt
$d/drift 16384 30 1 20 > $o/drift-16K-1s.txt 2> $o/drift-16K-1s.err
echo "third $(date -u +%T.%N)" >> $o/times.txt
$d/drift 1048576 15 0.1 20 > $o/drift-1M-100ms.txt 2> $o/drift-1M-100ms.err
echo "end $(date -u +%T.%N)" >> $o/times.txt
kill $smi $vm
grep -m3 MHz /proc/cpuinfo >> $o/env.txt
cd $OUT && tar czf r15.tgz r15 && rm -rf r15
