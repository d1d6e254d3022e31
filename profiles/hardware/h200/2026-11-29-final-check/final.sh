#!/usr/bin/env bash
# Final evidence run on the merged tree: GPU tests, a short loopback tune, the NCCL plugin under torch.
set -u
C=$(cd "$(dirname "$0")" && pwd)
(date -u; nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv) > $OUT/env.txt 2>&1
timeout 150 $C/gpu-tests --test-threads=1 > $OUT/gpu-tests-final.log 2>&1; echo "exit $?" >> $OUT/gpu-tests-final.log
timeout 60 $C/artune tune --loopback 4 --tp 2,4 --sizes 4K:1M --out $OUT/profile-loopback4-check.json > $OUT/tune-loopback4-check.txt 2>&1; echo "exit $?" >> $OUT/tune-loopback4-check.txt
NCCL_TUNER_PLUGIN=$C/libartune.so ARTUNE_PROFILE=$PWD/profiles/hardware/h200/2026-11-29-loopback8-v1/profile-loopback8.json NCCL_DEBUG=INFO \
  timeout 80 /opt/torch/.venv/bin/python $C/plugin_check.py > $OUT/plugin-nccl.log 2>&1; echo "exit $?" >> $OUT/plugin-nccl.log
grep -c "test .* ok" $OUT/gpu-tests-final.log; tail -3 $OUT/gpu-tests-final.log; tail -2 $OUT/tune-loopback4-check.txt; grep -i "tuner\|artune\|exit" $OUT/plugin-nccl.log | head -20
