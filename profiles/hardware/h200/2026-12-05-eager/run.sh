#!/bin/bash
# Issue 42 item 3 on the H200 in one call: the op's native eager path (artune._artune.EagerPath)
# against the raw launch, one rank (benches/op_overhead.py): eager with and without `out`,
# beside the Python form of the same call, and graph mode (staged, then registered). The
# target line (eager with `out` <= raw + 2 us, every row) is computed in overhead*.json.
# From the repository root of the merged tree, with $C holding `artune` (stripped release
# binary) and the op's abi3 wheel (artune-*.whl; build-carry.sh beside this file builds it):
#   END=90 bash profiles/hardware/h200/2026-12-05-eager/run.sh
# Results: $OUT/eager.tgz, re-packed after each step.
# Look for: overhead.txt "target: ... met True" and every row "native True correct True";
# summary.txt "PLAUSIBLE-WRONG RESULTS: 0" (2 processes, every eager result checked).
set -u
R=$PWD; C=${C:?the folder of the carried artune and wheel}; A=$C/artune
PY=/opt/torch/.venv/bin/python
W=/tmp/eager; rm -rf $W; mkdir -p $W/py
export ARTUNE_CACHE_DIR=/tmp/eager-kcache ARTUNE_BIN=$A PYTHONPATH=$W/py
pack() { (cd $W && tar czf $OUT/eager.tgz --exclude ./py .); }
END=${END:-90}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  ls $C/artune-*.whl; sha256sum $C/artune-*.whl
  $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  cat /proc/cpuinfo | grep -m1 "model name"; } > $W/env.txt 2>&1
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
$PY -c "import artune._artune as a; print('EagerPath', hasattr(a, 'EagerPath'))" >> $W/env.txt 2>&1
# A profile whose kernel record is this build's (the op checks it); one small group suffices:
# the benchmark forces each kernel.
step tune 25 $A tune --loopback 2 --tp 2 --sizes 4K:1M --no-contention --out $W/profile.json
B="$PY -m torch.distributed.run --standalone --nproc-per-node 1 $R/benches/op_overhead.py"
step overhead 35 $B --profile $W/profile.json --out $W/overhead.json
# Every result of the op's eager calls (now the native path) checked bit for bit, 2 processes
# on the GPU under MPS, as ../2026-12-04-zerocopy2 ran them.
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
if nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; then
  step proof2 25 env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 $PY -m torch.distributed.run \
    --standalone --nproc-per-node 2 $R/benches/op_proof.py --profile $W/profile.json \
    --timing-sizes 64K --out $W/proof2.json
else echo "MPS did not start: no proof step" >> $W/mps-start.txt; fi
echo quit | nvidia-cuda-mps-control; trap - EXIT; sleep 1
$PY - "$W" > $W/summary.txt 2>&1 <<'PYEOF'
import json, os, sys
w = sys.argv[1]
for name in ("overhead", "overhead-reg"):
    f = f"{w}/{name}.json"
    print(name, json.load(open(f))["target"] if os.path.exists(f) else "no result")
f = f"{w}/proof2.json"
if os.path.exists(f):
    wrong, tot = 0, {}
    for res in json.load(open(f))["ranks"]:
        for k, v in res["kernels"].items():
            for c, n in v.get("classes", {}).items():
                tot[c] = tot.get(c, 0) + n
                wrong += n if c.startswith("wrong") else 0
    print("proof2 totals", tot, "PLAUSIBLE-WRONG RESULTS:", wrong)
else:
    print("proof2 no result")
PYEOF
pack
step overhead-reg 30 $B --register --profile $W/profile.json --out $W/overhead-reg.json
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
