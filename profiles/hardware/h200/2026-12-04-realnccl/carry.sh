#!/bin/bash
# Prepares NCCL 2.32.6 for the H200 here, where the package index is reachable: pip's
# nvidia-nccl-cu13 2.32.6 wheel holds a 199 MB libnccl.so.2 that does not compress, and a device
# call's working tree (the checkout's tracked files plus what it carries) must stay under 64 MiB,
# counted in whole blocks as `du` counts (the tracked files alone were 29 MB so on 2026-12-04,
# 32.1 MiB on 2026-12-05). So the library goes in seven pieces of at most 30 MB, one per call,
# carried back to back while the machine stays warm (device.sh lists the calls); the binaries,
# the profiles and run.sh go, xz-compressed, with the last piece. From the repository root of the checkout that the device tool sends (its
# .carry/ is git-ignored):
#   bash profiles/hardware/h200/2026-12-04-realnccl/carry.sh [BUILD_TREE]
# BUILD_TREE is the worktree whose target/release holds artune and libartune.so (default: .).
set -eu
R=$PWD; T=${1:-$R}; C=$R/.carry/g48; H=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d); trap 'rm -rf $W' EXIT
pip download --no-deps nvidia-nccl-cu13==2.32.6 -d $W >/dev/null
(cd $W && unzip -q -o nvidia_nccl_cu13-2.32.6-*.whl nvidia/nccl/lib/libnccl.so.2)
rm -rf $C; mkdir -p $C/bin
(cd $W/nvidia/nccl/lib && split -b 30000000 -d -a 1 libnccl.so.2 part && sha256sum libnccl.so.2) \
  > $C/bin/libnccl.sha256
for f in $W/nvidia/nccl/lib/part*; do n=$(basename $f); i=$((${n#part} + 1))
  mkdir -p $C/part$i; mv $f $C/part$i/; done
for b in artune libartune.so; do strip -o $C/bin/$b $T/target/release/$b; xz -9 $C/bin/$b; done
(cd $T && git rev-parse HEAD) > $C/bin/commit.txt
# The profile the audit follows: artune's own tune of a simulated 4-GPU PCIe box (TP2 and TP4
# groups, ring/Simple pinned at a few sizes, 2 NCCL channels), and the same without the channel
# count (NCCL then runs its own at the pinned sizes).
$T/target/release/artune tune --sim pcie-4x-1switch --out $C/bin/sim4.json >/dev/null
python3 - $C/bin/sim4.json $C/bin/sim4-nochan.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for g in p["groups"]:
    g.pop("nccl_channels", None)
json.dump(p, open(sys.argv[2], "w"), indent=1)
PY
cp $H/run.sh $C/bin/
du -sh $C/*
