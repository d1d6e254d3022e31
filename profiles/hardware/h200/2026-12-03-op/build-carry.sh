#!/bin/bash
# Builds what run.sh carries to the H200 into .carry/op/ (git-ignored): the stripped release
# binary (it tunes) and the abi3 wheel (the op). Run from the repository root on the build
# machine (glibc 2.36 here, 2.39 there; Python 3.12 there, abi3 from 3.9).
set -euo pipefail
mkdir -p .carry/op && rm -f .carry/op/artune-*.whl
cargo build --release --locked --bin artune
strip -o .carry/op/artune target/release/artune
venv=target/ci-python/build
if [ ! -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "maturin>=1.5,<2"
fi
"$venv/bin/maturin" build --release --locked --compatibility linux -o .carry/op
ls -l .carry/op && du -sh .carry/op
