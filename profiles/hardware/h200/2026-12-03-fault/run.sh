#!/bin/bash
# Issue 35, item 5 on the H200: a barrier that gives up must never hand the engine a plausible
# wrong tensor. Repeats the op run's slice2, mps2, mps8 and peer-dies steps
# (profiles/hardware/h200/2026-12-03-op) with benches/op_proof.py classing every checked result
# as right, nan (all NaN), part_nan or wrong (no NaN, not the sum), and recording the fault word
# and the op's one line. Loopback: every rank is a process on the one GPU; nothing here is
# multi-GPU evidence.
# From the repository root, with .carry/op/ built by ../2026-12-03-op/build-carry.sh:
#   bash profiles/hardware/h200/2026-12-03-fault/run.sh
# Everything lands in $OUT/fault-run.tgz, re-packed after each step (a cut run keeps what ran).
# About 3 minutes; bounded by END (default 530 s) so the MPS daemon is stopped in time.
# Look for, in summary.txt: "PLAUSIBLE-WRONG RESULTS: 0" for every step; every nan/part_nan
# count on a rank whose kernel has failed barriers and faulted true, with exactly one fault
# line; after it every call answers NaN ("nan broken": the op of a broken group never hands
# calls to the engine's own allreduce, which could pair different calls); peer-dies:
# after_peer_left ["nan", "nan", "nan"] in about 5 s, faulted true, one "gave up waiting" line.
set -u
R=$PWD; C=$R/.carry/op; A=$C/artune; PY=/opt/torch/.venv/bin/python
W=/tmp/fault-run; rm -rf $W; mkdir -p $W/py
export PYTHONPATH=$W/py ARTUNE_CACHE_DIR=$W/kcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
pack() { (cd $W && tar czf $OUT/fault-run.tgz --exclude ./py --exclude ./kcache --exclude ./mps .); }
END=${END:-530}; START=${START:-0}
step() { n=$1; t=$2; shift 2; left=$((END - START - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 20 ]; then echo "skipped: no time left" > $W/$n.txt; return; fi
  ( time timeout -k 15 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
TR="$PY -m torch.distributed.run --standalone"
P=benches/op_proof.py
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.used --format=csv
  $PY -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
  $A --version; echo "tree $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; } > $W/env.txt 2>&1
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
# The wheel carries the extension (fault word included: build it from this tree); the Python
# files are this tree's.
cp python/artune/*.py $W/py/artune/
$PY -c 'import artune._artune as a; print("faulted() in the wheel:", hasattr(a.AllreduceKernels, "faulted"))' >> $W/env.txt 2>&1
step tune 150 $A tune --loopback 8 --tp 2,4,8 --islands 4,4 --sizes 4K:16M --no-contention --out $W/profile.json
step slice2 120 $TR --nproc-per-node 2 $P --profile $W/profile.json --out $W/slice2.json
step peer-dies 60 $TR --nproc-per-node 2 $P --peer-dies --profile $W/profile.json --out $W/peer-dies.json
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
if nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; then
  step mps2 100 $TR --nproc-per-node 2 $P --profile $W/profile.json --out $W/mps2.json
  step mps8 150 $TR --nproc-per-node 8 $P --profile $W/profile.json --out $W/mps8.json
else echo "MPS did not start: no mps steps" >> $W/mps-start.txt; fi
cp $W/mps/log/*.log $W/ 2>/dev/null
echo quit | nvidia-cuda-mps-control; trap - EXIT; sleep 1
# One line per rank and kernel: how each checked result came back, and the fault's line.
$PY - "$W" > $W/summary.txt 2>&1 <<'PYEOF'
import json, os, sys
w = sys.argv[1]
for step in ("slice2", "mps2", "mps8"):
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
echo "end $(date -u +%T) after $SECONDS s; processes left: $(pgrep -fc 'op_proof|artune')" >> $W/env.txt
pack
