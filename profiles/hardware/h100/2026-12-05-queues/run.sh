#!/bin/bash
# Issue 46: is worker 0's slower context (1.51 s against 1.08-1.12 s for the others in
# ../2026-12-05-speed4/check-v.txt) its 32 hardware queues? The loopback launcher (worker 0)
# gets CUDA_DEVICE_MAX_CONNECTIONS=32 unless the caller sets it; set by the caller, every
# worker gets the caller's. A small tune, three times each: as artune sets it (worker 0: 32,
# the others CUDA's 8), every worker 32, every worker 16; then the loopback GPU tests with 16
# (the launcher needs 9 queues: 8 probe streams and the latch's). Loopback: one GPU. ~90 s.
#   C=<unpacked carry> bash profiles/hardware/h100/2026-12-05-queues/run.sh
set -u
C=${C:?set C}; C=$(cd "$C" && pwd); W=/tmp/queues; rm -rf $W; mkdir -p $W
export ARTUNE_CACHE_DIR=$W/kc
pack() { (cd $W && tar czf $OUT/queues.tgz .); }
cd /tmp
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat $C/commit.txt; } > $W/env.txt
# Compile once, untimed.
timeout 60 $C/artune tune --loopback 8 --tp 2 --sizes 4K:16K --mode graph --no-contention \
  --out $W/warmup.json > $W/warmup.txt 2>&1
for i in 1 2 3; do
  for q in artune 32 16; do n=$q-$i
    if [ $q = artune ]; then E=env; else E="env CUDA_DEVICE_MAX_CONNECTIONS=$q"; fi
    ( time timeout 40 $E $C/artune -v tune --loopback 8 --tp 2 --sizes 4K:16K --mode graph \
      --no-contention --out $W/$n.json ) > $W/$n.txt 2>&1
    { echo "$n exit $? $(grep -a '^real' $W/$n.txt)"
      grep -a "context opened in" $W/$n.txt | sed 's/.*\[worker \([0-9]*\) .*opened in/  worker \1/'
      grep -a "workers up after\|workers exited in" $W/$n.txt | sed 's/.*coordinator[^ ]* //'; } >> $W/summary.txt
    pack
  done
done
( time timeout 60 env CUDA_DEVICE_MAX_CONNECTIONS=16 ARTUNE_BIN=$C/artune $C/gpu \
  gpu_custom_kernels_verify_bit_exactly_in_loopback_2_4_8_or_skip \
  gpu_repeated_calls_and_graph_replay_stay_correct_or_skip --nocapture --test-threads 1 ) \
  > $W/gpu16.txt 2>&1
echo "gpu16 exit $?: $(grep -a 'test result' $W/gpu16.txt)" >> $W/summary.txt
pack
