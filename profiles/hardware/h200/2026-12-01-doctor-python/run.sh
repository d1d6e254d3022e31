#!/usr/bin/env bash
# On the lent H200, the merged tree: the GPU tests through worker processes, `artune doctor`
# (plain, --json, --measure), then the Python wheel in the machine's torch environment:
# Profile.load/select on the committed loopback profile, and torch's own NCCL loading
# artune.plugin_path() as its tuner plugin. Results under $OUT.
set -u
A=$PWD/.carry/final/artune
export ARTUNE_BIN=$A
mkdir -p "$OUT"
( cd /tmp && timeout 240 "$OLDPWD/.carry/final/gpu" --test-threads=1 --nocapture ) > "$OUT/gpu-tests.log" 2>&1
echo "exit $?" >> "$OUT/gpu-tests.log"
echo "workers left after the GPU tests: $(ps aux | grep __worker | grep -vc grep)" >> "$OUT/gpu-tests.log"
{ date -u; nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv; } > "$OUT/machine.txt" 2>&1
$A doctor > "$OUT/doctor.txt" 2>&1; echo "exit $?" >> "$OUT/doctor.txt"
$A doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor-json.err"; echo "exit $?" >> "$OUT/doctor-json.err"
$A doctor --measure > "$OUT/doctor-measure.txt" 2>&1; echo "exit $?" >> "$OUT/doctor-measure.txt"
PY=python3
$PY -m pip install -q --no-index --no-deps --target /tmp/site .carry/final/artune-*.whl > "$OUT/python.txt" 2>&1
export PYTHONPATH=/tmp/site
PROFILE=profiles/hardware/h200/2026-11-29-loopback8-v3/profile-loopback8.json
$PY - "$PROFILE" >> "$OUT/python.txt" 2>&1 <<'PYEOF'
import sys, artune, platform
print("python", platform.python_version(), "artune", artune.__version__)
p = artune.Profile.load(sys.argv[1])
print(p)
for tp in p.tp_sizes:
    for n in (4096, 65536, 1 << 20, 16 << 20):
        print("select", tp, n, p.select(tp, n, "graph"))
print("plugin_path", artune.plugin_path())
PYEOF
echo "exit $?" >> "$OUT/python.txt"
# torch's NCCL (pip wheel) loads artune's tuner plugin: one rank, one allreduce, NCCL's log.
NCCL_TUNER_PLUGIN=$($PY -c 'import artune; print(artune.plugin_path())') \
ARTUNE_PROFILE="$PROFILE" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
NCCL_NVLS_ENABLE=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 \
$PY - > "$OUT/torch-nccl.txt" 2>&1 <<'PYEOF'
import torch, torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda", dtype=torch.bfloat16)
dist.all_reduce(x)
torch.cuda.synchronize()
print("allreduce ok", float(x[0]), "torch", torch.__version__, "nccl", torch.cuda.nccl.version())
dist.destroy_process_group()
PYEOF
echo "exit $?" >> "$OUT/torch-nccl.txt"
grep -i "tuner\|artune" "$OUT/torch-nccl.txt" | head -20
cat "$OUT/doctor.txt" "$OUT/python.txt"
