#!/usr/bin/env bash
# Every kernel in kernels/ compiled by NVRTC for sm_80, sm_90 and sm_120 on a machine with no
# GPU: NVRTC ships as a pip wheel and needs no driver, so a kernel that does not compile fails
# here instead of on the first GPU that runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=target/ci-nvrtc
if [ ! -d "$root/nvidia" ]; then
    python3 -m venv "$root/venv"
    "$root/venv/bin/pip" install -q --target "$root" "nvidia-cuda-nvrtc>=13,<14"
fi
lib=$(dirname "$(find "$root/nvidia" -name 'libnvrtc.so*' | head -1)")
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --locked --lib fabric::cuda::compile::tests::every_unit_compiles_without_a_gpu \
    -- --exact
