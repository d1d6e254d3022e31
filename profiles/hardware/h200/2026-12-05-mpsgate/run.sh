#!/bin/bash
# The busy check under MPS and the exit of a refused command (lead, 2026-12-05).
# An exploration that morning found: under MPS, `tune` refused at once, naming the MPS server
# (pid of nvidia-cuda-mps) as a neighbour; and the refused process then died of SIGSEGV (exit
# 139) after its sentence, while the kernels compiled ahead were still in NVRTC. Steps, each
# with the binary after the fix ($C/artune) first, then the one before it ($OLD, optional:
# 65427d6; plain or .xz; default $C/artune-old where the carry has it):
#   1. under MPS, nothing else on the GPU: a short loopback tune must run (exit 0);
#   2. a neighbour holding the GPU (torch, until killed), empty kernel cache: the refusal must
#      exit 2.
# The old binary goes second in each step: its crash must not leave the MPS server or the GPU
# in a state that decides the new one's result.
# From the repository root: C=<carry folder> [OLD=<old artune>] [END=240] bash .../run.sh
# Within $END seconds; results: $OUT/mpsgate.tgz, re-packed after each step. Loopback on one
# GPU: nothing here is multi-GPU evidence.
set -u
END=${END:-240}
C=${C:?set C to the folder of the carried binaries}; C=$(cd "$C" && pwd) || exit 1
W=/tmp/mpsgate; rm -rf $W; mkdir -p $W/bin
PY=${PY:-/opt/torch/.venv/bin/python}
pack() { (cd $W && tar czf $OUT/mpsgate.tgz --exclude=./mps --exclude='./kc*' --exclude=./bin .); }
# Waits (at most 10 s) until no artune worker is left: MPS refused new clients (error 807)
# right after killed ones in the exploration.
gone() { for _ in $(seq 20); do pgrep -f __worker > /dev/null || return 0; sleep 0.5; done
  echo "artune workers still up 10 s after $1" >> $W/summary.txt; }
# run NAME LIMIT CMD...: within what is left of END (skipped where under 5 s is).
run() { n=$1; t=$2; shift 2; left=$((END - SECONDS - 15)); [ $t -gt $left ] && t=$left
  if [ $t -lt 5 ]; then echo "skipped: no time left" > $W/$n.txt; pack; return; fi
  ( time timeout -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $? (limit $t s)" >> $W/$n.txt
  gone $n; pack; }
OLD=${OLD:-}
[ -z "$OLD" ] && [ -f $C/artune-old ] && OLD=$C/artune-old
case $OLD in
  *.xz) xz -dc "$OLD" > $W/bin/artune-old && chmod +x $W/bin/artune-old && OLD=$W/bin/artune-old ;;
esac
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv
  $C/artune --version; cat $C/commit.txt 2>/dev/null; echo "OLD=${OLD:-none}"; } > $W/env.txt 2>&1
pack
export CUDA_MPS_PIPE_DIRECTORY=$W/mps/pipe CUDA_MPS_LOG_DIRECTORY=$W/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
quit_mps() { echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1; }
trap quit_mps EXIT
timeout 10 nvidia-cuda-mps-control -d > $W/mps-start.txt 2>&1; echo "exit $?" >> $W/mps-start.txt
T="tune --loopback 8 --tp 8 --mode graph --sizes 4K:64K --no-contention"
run mps-new 90 env ARTUNE_CACHE_DIR=$W/kc-new $C/artune $T --out $W/new.json
[ -n "$OLD" ] && run mps-old 30 env ARTUNE_CACHE_DIR=$W/kc-old $OLD $T --out $W/old.json
cp -r $W/mps/log $W/mpslog 2>/dev/null
quit_mps; trap - EXIT; sleep 2
# No client of the stopped daemon from here on.
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
# The neighbour: 1 GiB on the GPU, held until killed; the refusals run once it says so.
$PY -c "import torch,time,sys; x=torch.ones(1<<28,device='cuda'); torch.cuda.synchronize()
open(sys.argv[1],'w').close(); time.sleep(300)" $W/holding > $W/holder.txt 2>&1 &
HOLD=$!
for _ in $(seq 60); do
  [ -f $W/holding ] && break; kill -0 $HOLD 2>/dev/null || break; sleep 0.5
done
if [ -f $W/holding ]; then
  echo "holder up at $SECONDS s" >> $W/holder.txt
  run busy-new 20 env ARTUNE_CACHE_DIR=$W/kc-new2 $C/artune $T --out $W/new2.json
  [ -n "$OLD" ] && run busy-old 20 env ARTUNE_CACHE_DIR=$W/kc-old2 $OLD $T --out $W/old2.json
else
  echo "the torch neighbour did not hold the GPU (holder.txt): step 2 not run" >> $W/summary.txt
fi
kill $HOLD 2>/dev/null; wait $HOLD 2>/dev/null
for f in $W/mps-*.txt $W/busy-*.txt; do [ -f "$f" ] && echo "$(basename $f .txt): $(grep -h \
  "^exit\|^error\|^real\|^skipped" "$f" | tr '\n' ' ')"; done >> $W/summary.txt
echo "done $(date -u +%T) after $SECONDS s" >> $W/summary.txt; pack
