#!/bin/bash
# Builds what the H200 scripts need into .carry/$1, small enough to travel with the checkout in
# one device call (64 MiB in all; the tracked files were 34 MiB on 2026-12-05): the stripped
# release `artune` and `libartune.so`, the GPU test binary `gpu` (tests/gpu.rs, tests/gpu_nccl
# inside), each xz-compressed; NCCL 2.32.6 pruned to sm_90 (2026-12-04-realnccl/carry-sm90.sh,
# built once into .carry/n90); an older `artune` as artune-old where OLD names one; and
# unpack.sh, which the device call runs first:
#   bash profiles/hardware/h200/build-carry.sh s54 [OLD=.carry/old/artune.xz]
#   (device, carry [".carry/s54"]): bash .carry/s54/unpack.sh /tmp/s54 && C=/tmp/s54 ... run.sh
# unpack.sh puts the binaries in its folder argument and NCCL in /tmp/nccl232/libnccl.so.2,
# where ../2026-12-05-krank2/run.sh looks, with the pruned library's checksum in the folder.
set -euo pipefail
N=${1:?name the carry folder, e.g. s54}; shift
OLD=; for a in "$@"; do case $a in OLD=*) OLD=${a#OLD=};; esac; done
R=$PWD; C=$R/.carry/$N; H=$R/profiles/hardware/h200
cargo build --release --locked
G=$(cargo test --release --locked --test gpu --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="gpu" and m.get("executable"):
        print(m["executable"])' | tail -1)
[ -x "$G" ] || { echo "the GPU test binary was not built" >&2; exit 1; }
[ -f .carry/n90/libnccl.so.2.xz ] || bash $H/2026-12-04-realnccl/carry-sm90.sh
rm -rf "$C"; mkdir -p "$C"
strip -o "$C/artune" target/release/artune
strip -o "$C/libartune.so" target/release/libartune.so
strip -o "$C/gpu" "$G"
xz -9 -T2 "$C/artune" "$C/libartune.so" "$C/gpu"
cp .carry/n90/libnccl.so.2.xz .carry/n90/libnccl.sha256 "$C/"
[ -n "$OLD" ] && cp "$OLD" "$C/artune-old.xz"
git rev-parse HEAD > "$C/commit.txt"
cat > "$C/unpack.sh" <<'UNPACK'
#!/bin/bash
# Unpacks this carry into $1 (binaries, executable) and NCCL into /tmp/nccl232.
set -eu
S=$(cd "$(dirname "$0")" && pwd); D=${1:?a folder, e.g. /tmp/s54}
mkdir -p "$D" /tmp/nccl232
for f in "$S"/*.xz; do b=$(basename "$f" .xz)
  case $b in libnccl.so.2) xz -dc "$f" > /tmp/nccl232/libnccl.so.2;;
    *) xz -dc "$f" > "$D/$b"; chmod +x "$D/$b";; esac; done
cp "$S/libnccl.sha256" "$S/commit.txt" "$D/"
(cd /tmp/nccl232 && sha256sum -c "$D/libnccl.sha256")
ls -l "$D"
UNPACK
chmod +x "$C/unpack.sh"
du -sh "$C"/*; echo "with the tracked files: $(( $(git ls-files -z | du -c --files0-from=- | tail -1 | cut -f1) + $(du -s "$C" | cut -f1) )) KiB (limit 65536)"
