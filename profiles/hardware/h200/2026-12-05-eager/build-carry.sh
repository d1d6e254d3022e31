#!/bin/bash
# Builds what run.sh needs besides `artune` into the folder $1 (the lead's $C): the op's abi3
# wheel (the extension module with EagerPath, and python/artune). Run from the repository root
# on the build machine (glibc 2.36 here, 2.39 on the H200; Python 3.12 there, abi3 from 3.9).
set -euo pipefail
C=${1:?the carry folder}
mkdir -p "$C" && rm -f "$C"/artune-*.whl
venv=target/ci-python/build
if [ ! -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "maturin>=1.5,<2"
fi
"$venv/bin/maturin" build --release --locked --compatibility linux -o "$C"
ls -l "$C"/artune-*.whl
