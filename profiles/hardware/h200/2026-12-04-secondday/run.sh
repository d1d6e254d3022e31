#!/bin/bash
# Issues 43 and 46 on the H200, on the merged tree of this stop (loopback: virtual ranks on one
# GPU; nothing here is multi-GPU evidence). From the repository root, with .carry/sd/ holding
# artune and gpu (release binary and GPU test binary of the tree named in commit.txt):
#   bash .carry/sd/run.sh        (about 6 minutes; the first command on a fresh machine)
# Results: $OUT/sd.tgz, re-packed after each step.
# Look for: first/warm "real" (issue 46: <= 15 s cold); check*.txt "real" (<= 4 s) and exit 0;
# settle.txt exit 0 started within a second of a 120 GiB process exiting (issue 43); two1/two2:
# both exit 0 or one waits and says so, neither loses its result; gpu-all "test result: ok".
set -u
R=$PWD; C=$R/.carry/sd; A=$C/artune; G=$C/gpu; PY=/opt/torch/.venv/bin/python
W=/tmp/sd; rm -rf $W; mkdir -p $W; export ARTUNE_BIN=$A
pack() { (cd $W && tar czf $OUT/sd.tgz .); }
step() { n=$1; t=$2; shift 2
  ( time timeout -s INT -k 10 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
{ date -u; uptime; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
  $A --version; cat $C/commit.txt; ls -l /lib/x86_64-linux-gnu/libnccl.so*; } > $W/env.txt 2>&1
cd /tmp
# Issue 46: the first tune after boot (empty kernel cache), then warm; re-checks of the warm one.
step first 90 env ARTUNE_CACHE_DIR=/tmp/sd-cache $A tune --loopback 8 --out $W/first.json
step warm 90 env ARTUNE_CACHE_DIR=/tmp/sd-cache $A tune --loopback 8 --out $W/warm.json
for i in 1 2 3 4 5; do
  step check$i 60 env ARTUNE_CACHE_DIR=/tmp/sd-cache $A check $W/warm.json --measure
done
# Issue 43: a process holding 120 GiB and the SMs exits; a tune starts within a second.
cat > $W/hog.py <<'PYEOF'
import time, torch
x = torch.empty(120 * 2**30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 4:
    a @ a
torch.cuda.synchronize()
print(f"hog exits at {time.time():.3f}", flush=True)
PYEOF
$PY $W/hog.py > $W/hog.txt 2>&1; date +"tune starts at %s.%N" >> $W/hog.txt
step settle 90 env ARTUNE_CACHE_DIR=/tmp/sd-cache $A tune --loopback 2 --tp 2 --sizes 4K:256K \
  --out $W/settle.json
# Issue 43: two re-checks of one profile started together: one waits for the other, both finish.
( time env ARTUNE_CACHE_DIR=/tmp/sd-cache $A check $W/warm.json --measure ) > $W/two1.txt 2>&1 &
p1=$!; sleep 0.3
( time env ARTUNE_CACHE_DIR=/tmp/sd-cache $A check $W/warm.json --measure ) > $W/two2.txt 2>&1 &
p2=$!; wait $p1; echo "exit $?" >> $W/two1.txt; wait $p2; echo "exit $?" >> $W/two2.txt; pack
step gpu-all 300 $G --test-threads 1 --skip nvrtc_compiles
echo "workers left: $(pgrep -c -f 'artune worker' || true)" >> $W/env.txt; pack
