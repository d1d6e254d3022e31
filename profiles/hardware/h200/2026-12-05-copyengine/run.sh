#!/bin/bash
# Issue 45 on the H200 in one call: the copy-engine executor (src/fabric/cuda/copy/), built
# without a GPU and waived unless ARTUNE_COPY_ENGINE=1, run for the first time. Loopback: every
# rank on one GPU, so every copy is device-to-device on that GPU's copy engines and the flags'
# peers share a stream; nothing here is multi-GPU or PCIe evidence. A copy within one GPU may
# even run on SMs (NCCL's src/ce_coll.cc: the driver offloads it to the copy engines only under
# cudaMemcpyFlagPreferOverlapWithCompute, CUDA 13.1 on), so loopback times are not CE times.
# From the repository root, with .carry/ce/ made by build-carry.sh (same folder):
#   END=560 bash .carry/ce/run.sh
# Results: $OUT/ce.tgz, re-packed after each step.
# Look for: gpu.txt "test result: ok" (copy rows bit-exact in 2/4/8 ranks and islands, eager and
# graph, one stream and a process per rank; the SM kernels unchanged); bench.txt rows two_stage_copy and island_two_shot_copy at
# 4K and 16M beside the SM kernels; tune.txt/profile.json measuring both copy rows (not waived).
# Only then does copy::runs() become true by default (a separate commit).
set -u
R=$PWD; C=${C:-$R/.carry/ce}; A=$C/artune; G=$C/gpu
W=/tmp/ce; rm -rf $W; mkdir -p $W
export ARTUNE_CACHE_DIR=/tmp/ce-kcache ARTUNE_BIN=$A NCCL_NVLS_ENABLE=0
pack() { (cd $W && tar czf $OUT/ce.tgz .); }
END=${END:-560}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  cat $C/commit.txt; } > $W/env.txt 2>&1
# Without the switch the rows are waived, saying why (the default until this run passes).
step waived 60 $A bench kernels --loopback 8 --islands 4,4 --sizes 4K:4K \
  --backend two_stage_copy --backend island_two_shot_copy
export ARTUNE_COPY_ENGINE=1
step gpu 240 $G --test-threads 1 --nocapture --exact \
  gpu_copy_engine_rows_verify_bit_exactly_in_loopback_eager_and_graph_or_skip \
  gpu_copy_engine_rows_time_in_loopback_or_skip \
  gpu_copy_engine_rows_across_worker_processes_verify_and_replay_or_skip \
  gpu_a_copy_peer_that_never_arrives_fails_only_its_backend_or_skip \
  gpu_custom_kernels_verify_bit_exactly_in_loopback_2_4_8_or_skip
step bench 120 $A bench kernels --loopback 8 --islands 4,4 --out $W/bench.json
step tune 100 $A tune --loopback 8 --tp 2,4,8 --islands 4,4 --sizes 4K:16M --no-contention \
  --out $W/profile.json
for b in 4K 16M; do
  $A why $W/profile.json --tp 8 --bytes $b --mode graph > $W/why-graph-$b.txt 2>&1
done
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
