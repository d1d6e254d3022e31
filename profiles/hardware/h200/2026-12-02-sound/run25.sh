#!/bin/bash
# Run 25 (2026-12-02): the merged tree (cuda branch: probe mapped tracked, release on drop,
# lost workers replaced at once, IPC sizes checked) on the H200. PART=a or PART=b.
R=$PWD; B=$R/.carry/r25; A=$B/artune; export ARTUNE_BIN=$A
W=/tmp/run25; mkdir -p $W
pack() { (cd $W && tar czf $OUT/run25$PART.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s KILL $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >> $W/env.txt
if [ "$PART" = a ]; then
  # 1. The library's unit tests on a GPU (scripted coordinator, IPC range, expired wait).
  step lib 120 $B/lib --test-threads 1
  # 2. The expired-wait test with Mem's poison guard removed: must FAIL, not hang.
  step expired-wait-broken 60 $B/lib-broken --exact fabric::cuda::driver::tests::memory_under_an_expired_wait_is_kept_or_skip --nocapture
  # 3. The watchdog GPU test in tests/faults.rs, now starting the artune binary as worker.
  step faults-gpu 120 $B/faults gpu_ --nocapture --test-threads 1
  cd /tmp
  # 4. bench kernels releases before it exits.
  step bench 120 $A bench kernels --loopback 8 --sizes 4K:1M
  # 5. NCCL's log on.
  step nccl-info 90 env NCCL_DEBUG=INFO $A tune --loopback 4 --tp 4 --sizes 4K:64K --out $W/info.json -v
  # 6. The default tune.
  step tune 90 $A tune --loopback 8 --out $W/default.json
  cd $R
  # 7. Each rank launching on its own: probe growth and IPC between launchers.
  step each 150 env ARTUNE_LOOPBACK_LAUNCH=each $B/gpu --test-threads 1 gpu_contention_probe gpu_workers_are_processes gpu_each_worker --nocapture
else
  step gpu-tests 300 $B/gpu --test-threads 1
fi
echo "end $(date -u +%T) after $SECONDS s; artune left: $(pgrep -fa artune | grep -v pgrep | wc -l)" >> $W/env.txt
pgrep -fa artune >> $W/env.txt
pack
# Part c (trial): NCCL hung in its worker, through the binary.
if [ "$PART" = b ]; then
  cd /tmp
  step hang-nccl 120 env ARTUNE_CUDA_FAULTS=hang=nccl ARTUNE_GPU_DEADLINE_MS=1500 $A tune --loopback 2 --sizes 4K:16K --mode graph --out $W/hang.json
  step hang-nccl-show 20 $A show $W/hang.json
  pack
fi
