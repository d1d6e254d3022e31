#!/usr/bin/env bash
# The Python package and the engine plugins against the released engines, on a machine with no
# GPU: build the wheel with maturin, then test it in one virtual environment per engine (vLLM and
# SGLang pin different torch builds). Pinned to the newest releases on PyPI when the plugins were
# read against them (artune/vllm.py, artune/sglang.py say which); bump both together.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM=vllm==0.33.0
SGLANG=sglang==0.5.23
root=target/ci-python
mkdir -p "$root"
py=python3

cargo build --release --locked --bin artune
export ARTUNE_BIN="$PWD/target/release/artune"

if [ ! -x "$root/build/bin/maturin" ]; then
    "$py" -m venv "$root/build"
    "$root/build/bin/pip" install -q "maturin>=1.5,<2"
fi
rm -rf "$root/wheels"
"$root/build/bin/maturin" build --release --locked -o "$root/wheels"
wheel=$(ls "$root"/wheels/artune-*.whl)

run() {  # run NAME REQUIREMENT TEST...
    local name=$1 req=$2
    shift 2
    local venv="$root/$name"
    "$py" -m venv "$venv"
    # An engine with its CUDA wheels is about 10 GiB: no pip cache, and each environment goes
    # once its tests ran, so the two never sit on the disk together.
    "$venv/bin/pip" install -q --no-cache-dir "$req" pytest
    "$venv/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps "$wheel"
    local rc=0
    (cd tests/python && "$OLDPWD/$venv/bin/python" -m pytest -q "$@") || rc=$?
    rm -rf "$venv"
    return $rc
}

start=$SECONDS
run vllm "$VLLM" test_package.py test_vllm.py
run sglang "$SGLANG" test_package.py test_sglang.py
echo "python tests: $((SECONDS - start)) s after the wheel was built"
