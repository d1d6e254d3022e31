#!/bin/bash
# The last device call of 2026-12-05, on a fresh machine: every script of this stop that
# waited for a GPU, each under its own time budget and all within $TOTAL seconds, from the
# carry folder $C (stripped release binary `artune`, GPU test binary `gpu`, the abi3 wheel),
# built here from merged main. Loopback (virtual ranks on one GPU): nothing here is multi-GPU
# evidence. From the repository root:  C=$PWD/.carry/r53 TOTAL=540 bash <this file>
# Results: one .tgz per script under $OUT, as each script writes them, and final.tgz.
set -u
P=profiles/hardware/h200
export C=${C:-$PWD/.carry/r53}
TOTAL=${TOTAL:-540}
W=/tmp/final; rm -rf $W; mkdir -p $W
pack() { (cd $W && tar czf $OUT/final.tgz .); }
{ date -u; uptime; cat $C/commit.txt; } > $W/env.txt 2>&1
# What is left of TOTAL, at most $1 seconds.
budget() { local left=$((TOTAL - SECONDS)); [ $1 -lt $left ] && echo $1 || echo $left; }
# The speed first: its first tune is the first command on this machine (issue 46).
END=$(budget 150) bash $P/2026-12-05-speed2/run.sh
echo "speed2 done at $SECONDS s" >> $W/env.txt
# The copy rows with their end-of-call guard (new), and the op's deadline (issue 45).
END=$(budget 110) bash $P/2026-12-05-copydeadline/run.sh
echo "copydeadline done at $SECONDS s" >> $W/env.txt
END=$(budget 100) bash $P/2026-12-05-eager/run.sh
echo "eager done at $SECONDS s" >> $W/env.txt
cd /tmp
export ARTUNE_CACHE_DIR=/tmp/final-kc NCCL_NVLS_ENABLE=0 ARTUNE_BIN=$C/artune
# bench kernels with the copy rows on by default and the targets judged in graph mode.
( time timeout -k 5 $(budget 60) $C/artune bench kernels --loopback 8 --islands 4,4 \
  --out $W/bench.json ) > $W/bench.txt 2>&1; echo "exit $?" >> $W/bench.txt; pack
# The rest of the GPU suite on the merged tree, in what is left (the hung-kernel test, which
# waits out its deadlines, last).
t=$(budget 400); [ $t -gt 20 ] && ( time timeout -k 5 $((t - 10)) $C/gpu --test-threads 1 \
  --skip gpu_hung_kernel --skip gpu_copy_engine_rows_verify --skip gpu_an_op_copy_call \
  --skip gpu_a_check_starts --skip gpu_workers_are_processes ) > $W/gpu-rest.txt 2>&1
echo "exit $? at $SECONDS s" >> $W/gpu-rest.txt
date -u >> $W/env.txt; pack
