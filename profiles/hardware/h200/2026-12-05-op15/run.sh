#!/bin/bash
# Issue 42 on the H200, after ../2026-12-05-ab14: the GPU tests that run ac5f51a's
# one_stage_push LL form (its fault path included), and the op's overhead over the raw launch
# (benches/op_overhead.py, staged and registered, inference mode) with the op's abi3 wheel
# built from 318fd82 (.carry/s64w; its kernels are ac5f51a's, which the op checks against the
# profile the binary writes).
# Loopback / one rank / two processes on one GPU: nothing here is multi-GPU evidence.
#   bash .carry/s64/unpack.sh /tmp/s64 && cp .carry/s64w/*.whl /tmp/s64/ &&
#   C=/tmp/s64 END=330 bash profiles/hardware/h200/2026-12-05-op15/run.sh
set -u
R=$PWD; C=${C:?set C}; END=${END:-330}
C=$(cd "$C" && pwd) || exit 1; A=$C/artune
S=$(date +%s); W=/tmp/op15; rm -rf $W; mkdir -p $W/py; export ARTUNE_CACHE_DIR=/tmp/ab14-cache
pack() { (cd $W && tar czf $OUT/op15.tgz --exclude ./py .); }
. $R/profiles/hardware/lib.sh
describe
{ grep -m1 "model name" /proc/cpuinfo; ls $C/*.whl; } >> $W/env.txt 2>&1
pack
cd /tmp || exit 1
PY=/opt/torch/.venv/bin/python
$PY -m pip install -q --no-deps --target $W/py $C/artune-*.whl >> $W/env.txt 2>&1
export PYTHONPATH=$W/py ARTUNE_BIN=$A
step tune 25 $A tune --loopback 2 --tp 2 --sizes 4K:1M --no-contention --out $W/profile.json
B="$PY -m torch.distributed.run --standalone --nproc-per-node 1 $R/benches/op_overhead.py"
step overhead 40 $B --profile $W/profile.json --out $W/overhead.json
step overhead-reg 40 $B --profile $W/profile.json --register --out $W/overhead-reg.json
step gpu 200 $C/gpu --test-threads 1 gpu_an_op_ll_call gpu_one_stage_push_ll gpu_custom_kernels_verify gpu_repeated_calls gpu_flat_kernels_replay gpu_a_wrong_result gpu_each_worker_launching
{ for n in overhead overhead-reg; do echo "== $n"; grep -e 'us/call' -e target $W/$n.txt; done
  grep -h "^test \|test result\|rank 0:" $W/gpu.txt; } > $W/summary.txt 2>&1
rm -f $W/profile.json; date -u >> $W/env.txt; pack
