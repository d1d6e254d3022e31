#!/usr/bin/env bash
# The Python package and the engine plugins against the released engines, on a machine with no
# GPU: build the wheel with maturin, then test it in one virtual environment per engine (vLLM and
# SGLang pin different torch builds). Pinned to the releases python/artune/engines.json was read
# against (read_against); bump both together. A release whose pinned dependency the package
# index lacks is installed with the nearest version it has, and the run says which (NEAREST).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM=vllm==0.34.0
SGLANG=sglang==0.5.23
VLLM_TESTS="test_wheel.py test_validity.py test_package.py test_vllm.py test_vllm_fusion.py test_vllm_callers.py test_why.py test_allreduce.py test_vllm_kernels.py"
SGLANG_TESTS="test_wheel.py test_validity.py test_package.py test_sglang.py test_why.py test_sglang_kernels.py"
root=target/ci-python
mkdir -p "$root"
py=python3

# Its own target folder, without debug info, removed once the wheel is built: an engine with
# its CUDA wheels needs about 13.7 GB while pip installs it (vLLM 0.34.0: 9.5 GB installed,
# the rest pip's downloads; measured with .ci/install_release.py here), and CI's disk is not
# ours to size (a run failed with "No space left on device" installing vLLM 0.34.0).
# The wheel is the only build: it carries the `artune` binary (build.rs), and every test below
# runs the CLI the wheel installed (ARTUNE_BIN), so a wheel without it fails here.
export CARGO_TARGET_DIR="$PWD/$root/cargo" CARGO_PROFILE_RELEASE_DEBUG=0

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
# What `pip install artune` must give: the CLI as a script (installed as bin/artune) and the
# NCCL plugin beside the extension module, each linked against glibc 2.17 at most.
"$py" .ci/wheel_contents.py "$wheel"
rm -rf "$CARGO_TARGET_DIR"

# The type stubs against the module the wheel holds: a stub that lacks an attribute or takes
# other arguments than the native code fails here (mypy's stubtest imports it and compares).
rm -rf "$root/stubs"
"$py" -m venv "$root/stubs"
"$root/stubs/bin/pip" install -q --no-cache-dir "mypy==2.4.1"
"$root/stubs/bin/pip" install -q --no-cache-dir --no-deps "$wheel"
(cd / && "$OLDPWD/$root/stubs/bin/python" -m mypy.stubtest artune._artune)
rm -rf "${root:?}/stubs"

install() {  # install NAME REQUIREMENT: a fresh environment holding the release and the wheel
    local venv="$root/$1"
    rm -rf "$venv"
    echo "installing $2: $(df -h --output=avail . | tail -1 | tr -d ' ') free on this disk"
    "$py" -m venv "$venv"
    # An engine with its CUDA wheels is about 9.5 GB: no pip cache, and each environment goes
    # once its tests ran, so two never sit on the disk together.
    # Exit 3: the release could not be installed here even with the nearest dependencies,
    # which says nothing about the plugins.
    if ! "$py" .ci/install_release.py "$venv" "$2" pytest; then
        rm -rf "$venv"
        return 3
    fi
    "$venv/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps "$wheel"
    # The tests tune their profiles with the CLI the wheel installed, nothing else.
    export ARTUNE_BIN="$PWD/$venv/bin/artune"
}

run() {  # run NAME REQUIREMENT TEST...
    local name=$1 req=$2
    shift 2
    install "$name" "$req"
    local rc=0
    (cd tests/python && "$OLDPWD/$root/$name/bin/python" -m pytest -q "$@") || rc=$?
    rm -rf "${root:?}/$name"
    return $rc
}

start=$SECONDS
# shellcheck disable=SC2086
run vllm "$VLLM" $VLLM_TESTS
# shellcheck disable=SC2086
run sglang "$SGLANG" $SGLANG_TESTS
echo "python tests: $((SECONDS - start)) s after the wheel was built"

# The newest releases on the package index, on every run: a release that breaks a patch, brings
# a path the model does not cover, or only carries a new version line is told apart (see
# .ci/verdict.py). It reports and never fails CI: the pinned releases above are the gate.
# ARTUNE_CI_NEWEST=0 skips it. The same dispatch and start-up tests run, with
# ARTUNE_NEWEST_RELEASE=1 (the plugins take the installed release as read, so the version line
# is reported once, by its own test, and does not hide breakage).
newest() {  # newest NAME PACKAGE PINNED "TEST..."
    local name=$1 pkg=$2 pinned=$3 tests=$4 latest venv="$root/newest-$1"
    latest=$("$root/build/bin/pip" index versions "$pkg" 2>/dev/null | sed -n "s/^$pkg (\(.*\))$/\1/p")
    if [ -z "$latest" ]; then
        echo "NEWEST $pkg: cannot ask the package index; not tested" >&2
        return
    elif [ "$latest" = "${pinned#*==}" ]; then
        echo "NEWEST $pkg $latest: the pinned release; tested above"
        return
    fi
    if ! install "newest-$name" "$pkg==$latest"; then
        echo "NEWEST $pkg $latest: cannot be installed here even with the nearest dependencies" \
            "(pip's reason above); not tested" >&2
        return
    fi
    local rc=0
    # shellcheck disable=SC2086
    (cd tests/python && ARTUNE_NEWEST_RELEASE=1 "$OLDPWD/$venv/bin/python" -m pytest -q \
        --junitxml="$OLDPWD/$root/newest-$name.xml" $tests) || true
    (cd tests/python && "$OLDPWD/$venv/bin/python" -m pytest -q \
        --junitxml="$OLDPWD/$root/newest-$name-version.xml" \
        "test_$name.py::test_the_engine_model_was_read_against_the_installed_release") || true
    "$py" .ci/verdict.py "$pkg" "$latest" "${pinned#*==}" "$root/newest-$name.xml" \
        "$root/newest-$name-version.xml" >&2 || rc=$?
    [ $rc = 0 ] || echo "!!! NEWEST $pkg $latest breaks the artune plugins (pinned ${pinned#*==} passes)" >&2
    rm -rf "$venv"
}
if [ "${ARTUNE_CI_NEWEST:-1}" != 0 ]; then
    newest vllm vllm "$VLLM" "$VLLM_TESTS"
    newest sglang sglang "$SGLANG" "$SGLANG_TESTS"
fi
