#!/bin/bash
# Issue 48 on the H200 (loopback: every rank on the one GPU, so NCCL's timings are one GPU's,
# never a fabric's). Joins NCCL 2.32.6 from the carried pieces, checks its sha256, preloads it, and
# runs `artune check --nccl-audit` with 2 and 4 ranks in one NCCL communicator on GPU 0
# (NCCL_MULTI_RANK_GPU_ENABLE=1, set by the audit), with NCCL's own TUNING log beside it.
# Results: $OUT/realnccl.tgz, re-packed after each step.
set -u
R=$PWD; B=$R/.carry/g48/bin; N=/tmp/nccl232; W=/tmp/g48; rm -rf $W; mkdir -p $W/bin
pack() { (cd $W && tar czf $OUT/realnccl.tgz --exclude=bin .); }
step() { n=$1; shift
  ( time timeout -s INT -k 5 45 "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }
cat $N/part? > $N/libnccl.so.2
(cd $N && sha256sum -c $B/libnccl.sha256) > $W/sha.txt 2>&1 || { cat $W/sha.txt; pack; exit 1; }
for b in artune libartune.so; do xz -dc $B/$b.xz > $W/bin/$b; chmod +x $W/bin/$b; done
cp $B/sim4.json $B/sim4-nochan.json $B/commit.txt $W/
A=$W/bin/artune; P=$W/sim4.json; Q=$W/sim4-nochan.json
{ date -u; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv; $A --version
  cat $B/commit.txt; ls -l /lib/x86_64-linux-gnu/libnccl.so* $N/libnccl.so.2; } > $W/env.txt 2>&1
cd /tmp
export ARTUNE_ALLOW_SIMULATED=1 ARTUNE_ALLOW_INVALID=1
L="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING"
# NCCL 2.32.6, preloaded: the profile followed at every pinned size, then NCCL_ALGO=Tree caught,
# then the profile's 2 channels at its pinned sizes against NCCL's own (the profile without them).
N2=(env LD_PRELOAD=$N/libnccl.so.2 ARTUNE_NCCL_LIB=$N/libnccl.so.2)
step audit2 "${N2[@]}" $L $A check $P --nccl-audit --tp 2
step tree2 "${N2[@]}" NCCL_ALGO=Tree $A check $P --nccl-audit --tp 2
step audit4 "${N2[@]}" $L $A check $P --nccl-audit --tp 4
step nochan2 "${N2[@]}" $L $A check $Q --nccl-audit --tp 2
step nochan4 "${N2[@]}" $L $A check $Q --nccl-audit --tp 4
step tree4 "${N2[@]}" NCCL_ALGO=Tree $A check $P --nccl-audit --tp 4
# Timings without NCCL's log (one GPU's: every rank shares it).
step quiet2 "${N2[@]}" $A check $P --nccl-audit --tp 2
step quietnochan2 "${N2[@]}" $A check $Q --nccl-audit --tp 2
step quiet4 "${N2[@]}" $A check $P --nccl-audit --tp 4
step quietnochan4 "${N2[@]}" $A check $Q --nccl-audit --tp 4
# The system's NCCL 2.28.3: several ranks on one GPU refused in one sentence.
step old2 $A check $P --nccl-audit --tp 2
echo "done $(date -u)" >> $W/env.txt; pack
