#!/bin/bash
# Issue 46 (where a tune's timing goes) and issue 42 (the eager call under the engines' grad
# modes), one device call. From the repository root, $C the unpacked carry (artune, gpu) and $WHL
# the folder holding the op's abi3 wheel:
#   bash .carry/s57/unpack.sh /tmp/s57 && C=/tmp/s57 WHL=.carry/s57w END=480 bash profiles/hardware/h100/2026-12-05-trace/run.sh
# 1. A default tune (loopback 8) with the per-request timing trace (RUST_LOG artune::timing=debug:
#    each request's wall time on the coordinator; on the worker, its set-up, its samples' wall
#    time and the part the GPU's events timed), the first command after boot.
# 2. The same tune untraced (warm), to see what the trace costs.
# 3. ../2026-12-05-queues/run.sh (worker 0's 32 hardware queues).
# 4. benches/op_overhead.py under inference mode (vLLM) and no_grad (SGLang's default).
# Results: $OUT/trace.tgz, re-packed after each step.
set -u
R=$PWD; C=${C:?set C}; C=$(cd "$C" && pwd); A=$C/artune
W=/tmp/trace; rm -rf $W; mkdir -p $W/py
PY=/opt/torch/.venv/bin/python
export ARTUNE_CACHE_DIR=$W/kc
pack() { (cd $W && tar czf $OUT/trace.tgz --exclude ./py --exclude ./kc .); }
END=${END:-480}
step() { n=$1; t=$2; shift 2; left=$((END - SECONDS)); [ $t -gt $left ] && t=$left
  if [ $t -lt 10 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; uptime; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  cat $C/commit.txt; nproc; } > $W/env.txt 2>&1
step traced 60 env RUST_LOG=artune=info,artune::timing=debug NO_COLOR=1 $A -v tune --loopback 8 \
  --out $W/traced.json
step warm 60 $A -v tune --loopback 8 --out $W/warm.json
$PY - $W/traced.txt > $W/where.txt 2>&1 <<'PYEOF'
import re, sys, collections
req = collections.defaultdict(lambda: [0, 0.0]); wk = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for l in open(sys.argv[1], errors="replace"):
    m = re.search(r"request (\S+) (\d+) (\w+) (\d+)x(\d+): ([\d.]+) ms", l)
    if m:
        k = (m[3], int(m[2]) >= 1 << 20); req[k][0] += 1; req[k][1] += float(m[6]); continue
    m = re.search(r"worker (\S+) (\d+) (\w+) (\d+)x(\d+): set-up ([\d.]+) ms, samples ([\d.]+) ms wall, ([\d.]+) ms timed", l)
    if m:
        k = (m[3], int(m[2]) >= 1 << 20); w = wk[k]; w[0] += 1; w[1] += float(m[6]); w[2] += float(m[7]); w[3] += float(m[8])
print("mode, >=1M | coordinator requests, ms | worker: requests, set-up ms, samples wall ms, timed ms")
for k in sorted(set(req) | set(wk)):
    print(k, req[k], [round(x, 1) for x in wk[k]])
PYEOF
pack
mkdir -p $W/queues-out
( cd $R && OUT=$W/queues-out C=$C timeout $(( END - SECONDS - 5 > 10 ? 120 : 10 )) bash profiles/hardware/h100/2026-12-05-queues/run.sh ) > $W/queues.txt 2>&1
pack
WHL=${WHL:?the folder of the abi3 wheel}
$PY -m pip install -q --no-deps --target $W/py $R/$WHL/artune-*.whl > $W/pip.txt 2>&1
export PYTHONPATH=$W/py ARTUNE_BIN=$A
step optune 30 $A tune --loopback 2 --tp 2 --sizes 4K:1M --no-contention --out $W/op-profile.json
B="$PY -m torch.distributed.run --standalone --nproc-per-node 1 $R/benches/op_overhead.py"
for g in inference no_grad grad; do
  step overhead-$g 40 $B --grad-mode $g --profile $W/op-profile.json --out $W/overhead-$g.json
done
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
# 5. NVRTC per unit and side by side, with and without --split-compile (warm page cache).
NL=$(ls /usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so* 2>/dev/null | head -1)
for e in "" "--split-compile=0"; do
  step "units${e:+-split}" 40 env NVRTC_LIB=$NL $PY $R/profiles/hardware/h100/2026-12-05-trace/units.py $R/kernels 8 $e
done
step units-serial 40 env NVRTC_LIB=$NL $PY $R/profiles/hardware/h100/2026-12-05-trace/units.py $R/kernels 1
echo "end $(date -u +%T) after $SECONDS s" >> $W/env.txt
pack
