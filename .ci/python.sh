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
    "$root/build/bin/pip" install -q "maturin>=1.5,<2" ziglang
fi
rm -rf "$root/wheels"
# manylinux2014 (glibc 2.17): RHEL 8 and Ubuntu 20.04 install it. Linking against this host's
# glibc would tag it 2.34; zig links against 2.17's symbols instead.
PATH="$PWD/$root/build/bin:$PATH" "$root/build/bin/maturin" build --release --locked --zig \
    --compatibility manylinux2014 -o "$root/wheels"
wheel=$(ls "$root"/wheels/artune-*.whl)
case "$wheel" in
*manylinux_2_17*|*manylinux2014*) ;;
*) echo "the wheel is not tagged manylinux2014: $wheel" >&2; exit 1 ;;
esac

run() {  # run NAME REQUIREMENT TEST...
    local name=$1 req=$2
    shift 2
    local venv="$root/$name"
    "$py" -m venv "$venv"
    # An engine with its CUDA wheels is about 10 GiB: no pip cache, and each environment goes
    # once its tests ran, so the two never sit on the disk together.
    # Exit 3: the release could not be installed here (a dependency missing from the index),
    # which says nothing about the plugins.
    if ! "$venv/bin/pip" install -q --no-cache-dir "$req" pytest; then
        rm -rf "$venv"
        return 3
    fi
    "$venv/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps "$wheel"
    local rc=0
    (cd tests/python && "$OLDPWD/$venv/bin/python" -m pytest -q "$@") || rc=$?
    rm -rf "$venv"
    return $rc
}

start=$SECONDS
run vllm "$VLLM" test_package.py test_vllm.py test_vllm_fusion.py
run sglang "$SGLANG" test_package.py test_sglang.py
echo "python tests: $((SECONDS - start)) s after the wheel was built"

# The newest releases on the package index: a release that breaks a patch is seen the day it
# ships. It reports loudly and never fails CI (the pinned releases above are the contract).
# ARTUNE_CI_NEWEST=0 skips it. ARTUNE_NEWEST_RELEASE=1 skips the tests that pin the release the
# plugins were read against (a new release always differs there), so only real breakage shows.
newest() {  # newest NAME PACKAGE PINNED "TEST..."
    local name=$1 pkg=$2 pinned=$3 test=$4 latest
    latest=$("$root/build/bin/pip" index versions "$pkg" 2>/dev/null | sed -n "s/^$pkg (\(.*\))$/\1/p")
    if [ -z "$latest" ]; then
        echo "NEWEST $pkg: cannot ask the package index; not tested" >&2
    elif [ "$latest" = "${pinned#*==}" ]; then
        echo "NEWEST $pkg: $latest is the pinned release; tested above"
    else
        local rc=0
        ARTUNE_NEWEST_RELEASE=1 run "newest-$name" "$pkg==$latest" test_package.py $test || rc=$?
        if [ $rc = 0 ]; then
            echo "NEWEST $pkg: $latest passes the plugin tests"
        elif [ $rc = 3 ]; then
            echo "NEWEST $pkg: $latest could not be installed here (pip failed above); not tested" >&2
        else
            echo "!!! NEWEST $pkg: $latest BREAKS the artune plugin tests (pinned ${pinned#*==} passes);" \
                "read it against python/artune/engines.json and bump the pin" >&2
        fi
    fi
}
if [ "${ARTUNE_CI_NEWEST:-1}" != 0 ]; then
    newest vllm vllm "$VLLM" "test_vllm.py test_vllm_fusion.py"
    newest sglang sglang "$SGLANG" test_sglang.py
fi
