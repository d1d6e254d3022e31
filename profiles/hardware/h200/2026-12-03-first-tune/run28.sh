#!/bin/bash
# Run 28 (issue #37): on a freshly booted H200, loopback 8.
# 1. The first tune after boot with an empty kernel cache (target: <= 20 s wall; was 22.1 s,
#    7.1 s of it NVRTC), then a second with another empty cache and a warm one.
# 2. A neighbour (a bf16 matmul loop) whose CUDA context appears 6 s into a tune: refused
#    (exit 2, naming it), then allowed (exit 0, every group measured beside it says so and
#    keeps no drift); and the same 2 s into a `check --measure`.
# Must be the first command on the machine (the run's `uptime` says how long it has been up).
# Binary: `cargo build --release --locked`, copied stripped to .carry/r28/artune.
R=$PWD; A=$R/.carry/r28/artune
W=/tmp/run28; mkdir -p $W
PY=/opt/torch/.venv/bin/python
pack() { (cd $W && tar czf $OUT/run28.tgz .); }
{ date -u; uptime; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,persistence_mode \
    --format=csv; nproc; } > $W/env.txt 2>&1
cd /tmp
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
LOG=info,artune::fabric::cuda::compile=debug

# 1. Tune time: first after boot (empty cache), a second with another empty cache, warm.
step first 90 env ARTUNE_CACHE_DIR=/tmp/cache1 RUST_LOG=$LOG $A tune --loopback 8 --out $W/first.json
step second 90 env ARTUNE_CACHE_DIR=/tmp/cache2 RUST_LOG=$LOG $A tune --loopback 8 --out $W/second.json
export ARTUNE_CACHE_DIR=/tmp/cache2
step warm 90 $A -v tune --loopback 8 --out $W/fresh.json

# A neighbour that imports torch first, then creates its CUDA context (and appears to NVML)
# only when $1 exists, and runs bf16 matmuls for $2 seconds.
cat > $W/neighbour.py <<'PYEOF'
import os, sys, time
import torch
flag, seconds = sys.argv[1], float(sys.argv[2])
open(flag + ".ready", "w").close()
while not os.path.exists(flag):
    time.sleep(0.02)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print(f"context at {time.time():.2f}", flush=True)
t = time.time()
while time.time() - t < seconds:
    a @ a
torch.cuda.synchronize()
PYEOF
# beside NAME DELAY SECONDS TIMEOUT ARGS...: runs ARGS with the neighbour's context created
# DELAY s after ARGS started; the neighbour is ended and gone before the next step.
beside() {
  n=$1; d=$2; s=$3; t=$4; shift 4
  rm -f /tmp/go /tmp/go.ready
  $PY $W/neighbour.py /tmp/go $s > $W/$n-neighbour.txt 2>&1 & N=$!
  for i in $(seq 600); do [ -e /tmp/go.ready ] && break; sleep 0.05; done
  ( echo "started at $(date +%s.%N)"; time timeout -s INT $t "$@" ) > $W/$n.txt 2>&1 &
  T=$!; sleep $d; touch /tmp/go; wait $T; echo "exit $?" >> $W/$n.txt
  kill $N 2>/dev/null; wait $N 2>/dev/null
  for i in $(seq 60); do
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . || break; sleep 0.5
  done
  pack
}

# 2. A neighbour 6 s into a tune: refused, then measured beside (recorded).
beside nb-tune 6 60 90 $A tune --loopback 8 --out $W/nb-refused.json
beside nb-tune-allowed 6 60 150 $A tune --loopback 8 --allow-busy --out $W/nb-allowed.json
step nb-show 20 $A show $W/nb-allowed.json
$PY -c "
import json
p = json.load(open('$W/nb-allowed.json'))
for g in p['groups']:
    print(g['tp'], g['mode'], g['gpus'], 'beside:', [b['pid'] for b in g.get('beside', [])],
          'drift:', sorted(g.get('drift', {})))
" > $W/nb-groups.txt 2>&1
pack

# 3. The same 2 s into a check --measure of the warm profile.
beside nb-check 2 30 60 $A check $W/fresh.json --measure --loopback 8
beside nb-check-allowed 2 30 60 $A check $W/fresh.json --measure --loopback 8 --allow-busy
# And without a neighbour, the check holds as before (no worker of its own taken for one).
step check-quiet 60 $A check $W/fresh.json --measure --loopback 8

echo "end $(date -u +%T) after $SECONDS s; workers left: $(pgrep -fc __worker)" >> $W/env.txt
pack
