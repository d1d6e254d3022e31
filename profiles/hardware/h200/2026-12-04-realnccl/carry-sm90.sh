#!/bin/bash
# NCCL 2.32.6 for the H200 in ONE device call instead of seven: the wheel's libnccl.so.2 with
# every architecture's device code but sm_90's zeroed (prune.py says what and why), 10.3 MB
# with xz. From the repository root of the checkout the device tool sends:
#   bash profiles/hardware/h200/2026-12-04-realnccl/carry-sm90.sh [LIBNCCL]
# LIBNCCL: a libnccl.so.2 of the wheel already here (default: pip downloads the wheel); its
# checksum must be the wheel's. Writes .carry/n90/libnccl.so.2.xz and .carry/n90/libnccl.sha256
# (the pruned library's). On the device, before ../2026-12-05-krank2/run.sh:
#   mkdir -p /tmp/nccl232 && xz -dc .carry/n90/libnccl.so.2.xz > /tmp/nccl232/libnccl.so.2
# and give the scripts C holding that libnccl.sha256. Not yet run on a GPU: if NCCL reports no
# kernel image for the device, carry the seven pieces (carry.sh, device.sh) instead.
set -eu
R=$PWD; H=$(cd "$(dirname "$0")" && pwd); C=$R/.carry/n90
SUM=f567b7aa83bc1ccb123fd873a3a6d838410240763e12e1577c7b77adeea9ac8d
W=$(mktemp -d); trap 'rm -rf $W' EXIT
if [ $# -ge 1 ]; then cp "$1" $W/libnccl.so.2; else
  pip download --no-deps nvidia-nccl-cu13==2.32.6 -d $W >/dev/null
  (cd $W && unzip -q -o nvidia_nccl_cu13-2.32.6-*.whl nvidia/nccl/lib/libnccl.so.2 \
    && mv nvidia/nccl/lib/libnccl.so.2 .); fi
echo "$SUM  $W/libnccl.so.2" | sha256sum -c --quiet || {
  echo "$W/libnccl.so.2 is not the 2.32.6 wheel's library; give that one" >&2; exit 1; }
rm -rf $C; mkdir -p $C
python3 $H/prune.py $W/libnccl.so.2 $W/pruned.so --arch 90
(cd $W && mv pruned.so libnccl.so.2 && sha256sum libnccl.so.2) > $C/libnccl.sha256
xz -9 -T2 -c $W/libnccl.so.2 > $C/libnccl.so.2.xz
du -sh $C/*
