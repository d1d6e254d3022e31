#!/bin/bash
# The last device call of 2026-12-05, on a fresh machine: every script of this stop that
# waited for a GPU, each under its own time budget, from the carry folder $C (stripped
# release binary `artune`, GPU test binary `gpu`, `libartune.so`, the wheel for the op bench),
# built here from merged main. Loopback (virtual ranks on one GPU): nothing here is multi-GPU
# evidence. From the repository root:  C=$PWD/.carry/r53 bash <this file>
# Results: one .tgz per script under $OUT, as each script writes them.
set -u
P=profiles/hardware/h200
export C=${C:-$PWD/.carry/r53}
{ date -u; uptime; cat $C/commit.txt; } > $OUT/final-env.txt 2>&1
# The speed first: its first tune is the first command on this machine (issue 46).
END=170 bash $P/2026-12-05-speed2/run.sh
END=60 bash $P/2026-12-05-copydeadline/run.sh
END=100 bash $P/2026-12-05-eager/run.sh
# bench kernels with the copy rows on by default and the targets judged in graph mode.
cd /tmp && ( time ARTUNE_CACHE_DIR=/tmp/final-kc NCCL_NVLS_ENABLE=0 timeout -k 5 90 \
  $C/artune bench kernels --loopback 8 --islands 4,4 --out /tmp/bench-final.json ) \
  > /tmp/bench-final.txt 2>&1; echo "exit $?" >> /tmp/bench-final.txt
tar czf $OUT/bench-final.tgz -C /tmp bench-final.txt bench-final.json
date -u >> $OUT/final-env.txt
