#!/bin/bash
# Why barriers of the op give up under MPS with 4 and 8 processes on one GPU (issue 35):
# the same op run (benches/op_proof.py) under MPS as it was, with more hardware work queues per
# process (CUDA_DEVICE_MAX_CONNECTIONS=32), and with each process held to its share of the SMs
# (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / processes). If the give-ups are grids that cannot
# all be resident at once, the SM share ends them; if they are launches queued behind another
# process's spinning kernel in a shared hardware queue, more queues do. Loopback: nothing here
# is multi-GPU evidence.
# From the repository root with .carry/st/ (artune, the op's wheel):
#   bash profiles/hardware/h200/2026-12-04-mps/run.sh      (about 4 minutes)
# Results: $OUT/mps-run.tgz; summary.txt has one line per step: results by class, give-ups.
set -u
R=$PWD; C=$R/.carry/st; A=$C/artune; PY=/opt/torch/.venv/bin/python
W=/tmp/mps-run; rm -rf $W; mkdir -p $W/py
export PYTHONPATH=$W/py ARTUNE_CACHE_DIR=/tmp/st-kcache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
pack() { (cd $W && tar czf $OUT/mps-run.tgz --exclude ./py --exclude ./mps .); }
END=${END:-560}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 15 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 15 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; $A --version; } > $W/env.txt 2>&1
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
cp python/artune/*.py $W/py/artune/
step tune 60 $A tune --loopback 8 --tp ${TP:-4,8} --islands 4,4 --sizes 4K:16M --no-contention --out $W/profile.json
TR="$PY -m torch.distributed.run --standalone"
# TIMING: op_proof's timing options (run 40: "--timing-sizes 4K,64K,1M,16M"); KS and VARIANTS
# pick the process counts and the steps (run 40: KS="2 4 8" VARIANTS=share).
TIMING=${TIMING:---timing-sizes 4K --calls 4 --samples 3}
P="benches/op_proof.py --profile $W/profile.json $TIMING"
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
trap 'echo quit | nvidia-cuda-mps-control' EXIT
nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1
for K in ${KS:-4 8}; do
  for V in ${VARIANTS:-plain queues share}; do
    case $V in
      plain) step mps$K-plain 90 $TR --nproc-per-node $K $P --out $W/mps$K-plain.json ;;
      queues) step mps$K-queues 90 env CUDA_DEVICE_MAX_CONNECTIONS=32 $TR --nproc-per-node $K $P --out $W/mps$K-queues.json ;;
      share) step mps$K-share 90 env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / K)) $TR --nproc-per-node $K $P --out $W/mps$K-share.json ;;
    esac
  done
done
echo quit | nvidia-cuda-mps-control; trap - EXIT; sleep 1
$PY - "$W" > $W/summary.txt 2>&1 <<'PYEOF'
import glob, json, os, sys
w = sys.argv[1]
for f in sorted(glob.glob(f"{w}/mps*.json")):
    d = json.load(open(f))
    tot, failed = {}, set()
    for res in d["ranks"]:
        for k, v in res["kernels"].items():
            for c, n in v.get("classes", {}).items():
                tot[c] = tot.get(c, 0) + n
            if v.get("failed_barriers"):
                failed.add(k)
            if v.get("wrong"):
                failed.add(f"{k}@{v['wrong'][0][0]} {v['wrong'][0][1]}")
    print(os.path.basename(f), tot, "gave up:", sorted(failed))
PYEOF
pack
