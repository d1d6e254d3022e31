#!/bin/bash
# Issue 42 on the H200: graph mode zero copy (the pull kernels' registered form: peers read the
# ranks' own tensors, mapped once after capture) and `bench kernels` against the loopback
# floor. Loopback: virtual ranks or processes on one GPU; nothing here is multi-GPU evidence.
# From the repository root, with .carry/h42/ holding artune and gpu (stripped release binary
# and GPU test binary of this branch) and the op's wheel (../2026-12-03-op/build-carry.sh):
#   PART=kernels bash .carry/h42/run.sh   (GPU tests, bench kernels; about 5 minutes)
#   PART=op      bash .carry/h42/run.sh   (tune, op overhead, MPS 2/4/8 with --register)
# Results: $OUT/zc-$PART.tgz, re-packed after each step.
# Look for: gpu-all "test result: ok"; bench*.txt floor shares (graph = registered form for
# one_stage_pull and two_stage_pull); overhead.txt graph column; summary.txt "PLAUSIBLE-WRONG
# RESULTS: 0" and "unregistered" results all nan (pull) or right (push, LL sizes).
set -u
R=$PWD; C=$R/.carry/h42; A=$C/artune; G=$C/gpu; PY=/opt/torch/.venv/bin/python
PART=${PART:-kernels}; W=/tmp/zc-$PART; rm -rf $W; mkdir -p $W/py
export ARTUNE_CACHE_DIR=/tmp/zc-kcache ARTUNE_BIN=$A PYTHONPATH=$W/py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
pack() { (cd $W && tar czf $OUT/zc-$PART.tgz --exclude ./py --exclude ./mps .); }
END=${END:-570}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 15 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 15 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  cat $C/commit.txt; } > $W/env.txt 2>&1
if [ $PART = kernels ]; then
  step gpu-all 330 $G --test-threads 1 --skip nvrtc_compiles
  step bench44 90 $A bench kernels --loopback 8 --islands 4,4 --out $W/bench44.json
  pack; exit 0
fi
TR="$PY -m torch.distributed.run --standalone"
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
cp $C/py/*.py $W/py/artune/
step tune 90 $A tune --loopback 8 --tp 2,4,8 --islands 4,4 --sizes 4K:16M --no-contention --out $W/profile.json
step overhead 100 $TR --nproc-per-node 1 $C/op_overhead.py --register --profile $W/profile.json --out $W/overhead.json
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
P="$C/op_proof.py --register --profile $W/profile.json --timing-sizes ${TS:-4K,1M,16M}"
if nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; then
  for K in 2 4 8; do
    step mps$K 110 env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / K)) $TR --nproc-per-node $K $P --out $W/mps$K.json
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
