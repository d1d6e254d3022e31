#!/bin/bash
# Issues 35 and 33 on the H200: the kernels stage the caller's tensors through their shared
# buffers themselves (ArArgs src/dst), so the op queues the kernel alone and the tune times
# what the op runs; and the island two-shot's LL form spreads a shard word over the island's
# places. Loopback: virtual ranks and islands on one GPU; nothing here is multi-GPU evidence.
# From the repository root, with .carry/st/ holding artune and gpu (stripped release binary and
# GPU test binary) and the op wheel (../2026-12-03-op/build-carry.sh, copied there):
#   PART=kernels bash profiles/hardware/h200/2026-12-04-staging/run.sh   (about 4 minutes)
#   PART=op      bash profiles/hardware/h200/2026-12-04-staging/run.sh   (about 6 minutes)
# Results: $OUT/st-kernels.tgz, $OUT/st-op.tgz, re-packed after each step.
# Look for: gpu-all "test result: ok" (every custom and island kernel verified bit-exactly with
# src/dst apart from the shared buffers, eager and graph, each worker its own rank); bench
# targets (4K graph, >= 16M share of copy); overhead.txt graph column near 0 for every kernel;
# mps*/slice2 summary "PLAUSIBLE-WRONG RESULTS: 0" and op vs tune per size.
set -u
R=$PWD; C=$R/.carry/st; A=$C/artune; G=$C/gpu; PY=/opt/torch/.venv/bin/python
PART=${PART:-kernels}; W=/tmp/st-$PART; rm -rf $W; mkdir -p $W/py
export ARTUNE_CACHE_DIR=/tmp/st-kcache ARTUNE_BIN=$A PYTHONPATH=$W/py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
pack() { (cd $W && tar czf $OUT/st-$PART.tgz --exclude ./py --exclude ./mps .); }
END=${END:-570}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 15 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 15 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version
  echo "tree $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; } > $W/env.txt 2>&1
if [ $PART = kernels ]; then
  step gpu-all 300 $G --test-threads 1 --skip nvrtc_compiles
  for s in 4,4 2,2,2,2; do step bench${s//,/} 60 $A bench kernels --loopback 8 --islands $s; done
  pack; exit 0
fi
TR="$PY -m torch.distributed.run --standalone"
P=benches/op_proof.py
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
cp python/artune/*.py $W/py/artune/
step tune 120 $A tune --loopback 8 --tp 2,4,8 --islands 4,4 --sizes 4K:16M --no-contention --out $W/profile.json
step overhead 90 $TR --nproc-per-node 1 benches/op_overhead.py --profile $W/profile.json --out $W/overhead.json
step slice2 100 $TR --nproc-per-node 2 $P --profile $W/profile.json --out $W/slice2.json
step peer-dies 40 $TR --nproc-per-node 2 $P --peer-dies --profile $W/profile.json --out $W/peer-dies.json
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
if nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; then
  for K in 2 4 8; do step mps$K 100 $TR --nproc-per-node $K $P --profile $W/profile.json --out $W/mps$K.json; done
else echo "MPS did not start: no mps steps" >> $W/mps-start.txt; fi
echo quit | nvidia-cuda-mps-control; trap - EXIT; sleep 1
$PY - "$W" > $W/summary.txt 2>&1 <<'PYEOF'
import json, os, sys
w = sys.argv[1]
for step in ("slice2", "mps2", "mps4", "mps8"):
    f = f"{w}/{step}.json"
    if not os.path.exists(f):
        print(step, "no result"); continue
    d = json.load(open(f))
    wrong = 0
    for r, res in enumerate(d["ranks"]):
        for k, v in res["kernels"].items():
            if "checked" not in v:
                continue
            wrong += sum(n for c, n in v["classes"].items() if c.startswith("wrong"))
            print(step, "rank", r, k, v["classes"], "failed", v["failed_barriers"],
                  "faulted", v["faulted"], "lines", len(v["fault_lines"]))
    print(step, "PLAUSIBLE-WRONG RESULTS:", wrong)
if os.path.exists(f"{w}/peer-dies.json"):
    print("peer-dies", json.load(open(f"{w}/peer-dies.json")))
PYEOF
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
