#!/bin/bash
# Builds what run.sh carries to the H200 into .carry/ce/ (git-ignored): the stripped release
# binary and the stripped GPU test binary. Run from the repository root on the build machine.
set -euo pipefail
mkdir -p .carry/ce
cargo build --release --locked --bin artune
strip -o .carry/ce/artune target/release/artune
exe=$(cargo test --release --locked --test gpu --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])')
strip -o .carry/ce/gpu "$exe"
cp profiles/hardware/h200/2026-12-05-copyengine/run.sh .carry/ce/
git rev-parse HEAD > .carry/ce/commit.txt
ls -l .carry/ce && du -sh .carry/ce
