#!/bin/bash
# Issue 42, second part, on the H200 in one call: two-stage push's registered form (peers write
# the ranks' own outputs, mapped once after capture), the profile's form per mode, and the
# op's registered replays in 2, 4 and 8 processes. Loopback: virtual ranks or processes on
# one GPU; nothing here is multi-GPU evidence.
# From the repository root, with .carry/g42/ holding artune and gpu (stripped release binary
# and GPU test binary of branch g42), the op's abi3 wheel and benches/op_*.py:
#   END=330 bash .carry/g42/run.sh
# Results: $OUT/zc2.tgz, re-packed after each step.
# Look for: gpu.txt "test result: ok"; bench.txt rows of two_stage_push (graph = registered);
# profile.json groups' "forms"; why-*.txt "form:"; summary.txt "PLAUSIBLE-WRONG RESULTS: 0",
# two_stage_push's "unregistered" replays nan at its bandwidth sizes.
set -u
R=$PWD; C=$R/.carry/g42; A=$C/artune; G=$C/gpu; PY=/opt/torch/.venv/bin/python
W=/tmp/zc2; rm -rf $W; mkdir -p $W/py
export ARTUNE_CACHE_DIR=/tmp/zc2-kcache ARTUNE_BIN=$A PYTHONPATH=$W/py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
pack() { (cd $W && tar czf $OUT/zc2.tgz --exclude ./py --exclude ./mps .); }
END=${END:-330}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  cat $C/commit.txt; } > $W/env.txt 2>&1
step gpu 150 $G --test-threads 1 --exact \
  gpu_custom_kernels_verify_bit_exactly_in_loopback_2_4_8_or_skip \
  gpu_each_worker_launching_its_own_rank_verifies_or_skip \
  gpu_an_unregistered_graph_replay_is_nan_never_a_sum_or_skip \
  gpu_repeated_calls_and_graph_replay_stay_correct_or_skip
step bench 40 $A bench kernels --loopback 8 --islands 4,4 --out $W/bench.json
step tune 40 $A tune --loopback 8 --tp 2,4,8 --islands 4,4 --sizes 4K:16M --no-contention --out $W/profile.json
for b in 4K 1M 16M; do
  $A why $W/profile.json --tp 8 --bytes $b --mode graph > $W/why-graph-$b.txt 2>&1
  $A why $W/profile.json --tp 8 --bytes $b --mode eager > $W/why-eager-$b.txt 2>&1
done
TR="$PY -m torch.distributed.run --standalone"
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
step overhead 30 $TR --nproc-per-node 1 $C/op_overhead.py --register --profile $W/profile.json --out $W/overhead.json
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
P="$C/op_proof.py --register --profile $W/profile.json --timing-sizes ${TS:-1M,16M}"
if nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; then
  for K in 2 4 8; do
    step mps$K 30 env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / K)) $TR --nproc-per-node $K $P --out $W/mps$K.json
  done
else echo "MPS did not start: no mps steps" >> $W/mps-start.txt; fi
echo quit | nvidia-cuda-mps-control; trap - EXIT; sleep 1
$PY - "$W" > $W/summary.txt 2>&1 <<'PYEOF'
import json, os, sys
w = sys.argv[1]
for step in ("mps2", "mps4", "mps8"):
    f = f"{w}/{step}.json"
    if not os.path.exists(f):
        print(step, "no result"); continue
    d = json.load(open(f))
    wrong, tot = 0, {}
    for r, res in enumerate(d["ranks"]):
        for k, v in res["kernels"].items():
            if "checked" not in v:
                continue
            for c, n in v["classes"].items():
                tot[c] = tot.get(c, 0) + n
            wrong += sum(n for c, n in v["classes"].items() if c.startswith("wrong"))
            if r == 0:
                print(step, k, v["classes"], "not right:", v["wrong"][:4], "failed",
                      v["failed_barriers"], "missed lines", len(v["missed_lines"]),
                      "graph calls", v["graph_calls"])
    print(step, "totals", tot)
    print(step, "PLAUSIBLE-WRONG RESULTS:", wrong)
PYEOF
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
