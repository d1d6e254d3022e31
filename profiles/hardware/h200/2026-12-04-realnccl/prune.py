#!/usr/bin/env python3
"""Shrinks NCCL's library for one GPU architecture so that it fits one device call.

The wheel's libnccl.so.2 (199 MB) is mostly device code for eight architectures: `.nv_fatbin`
(67 MB, what the CUDA runtime loads) and `__nv_relfatbin` (124 MB, the relocatable objects of
NCCL's device link, which only a later device link reads). This zeroes, in place and without
moving a byte of the ELF or of any fatbin header, every `.nv_fatbin` entry but the cubins of
`--arch`, and all of `__nv_relfatbin`: the runtime picks an exact-architecture cubin by its
header, so the zeroed payloads are never read on that GPU, and zeros compress. For sm_90 the
result is 10.3 MB with `xz -9` (2026-12-05).

    prune.py libnccl.so.2 out.so --arch 90 [--keep-relfatbin]
"""
import argparse
import struct
import sys

MAGIC = 0xBA55ED50
CUBIN = 2


def sections(d):
    """(name, offset, size) of every ELF64 section."""
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    entsize, num, strndx = struct.unpack_from("<HHH", d, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", d, shoff + i * entsize) for i in range(num)]
    names = heads[strndx][4]
    out = []
    for name, _typ, _flags, _addr, off, size in heads:
        end = d.index(b"\0", names + name)
        out.append((d[names + name:end].decode(), off, size))
    return out


def entries(d, off, size):
    """(kind, arch, payload offset, payload size) of every entry of every fatbin container."""
    p, end = off, off + size
    while p < end - 16:
        magic, _ver, head, body = struct.unpack_from("<IHHQ", d, p)
        if magic != MAGIC:
            p += 8
            continue
        q, qe = p + head, p + head + body
        while q < qe:
            kind, _u, ehead, esize = struct.unpack_from("<HHIQ", d, q)
            arch = struct.unpack_from("<I", d, q + 28)[0]
            yield kind, arch, q + ehead, esize
            q += ehead + esize
        p = qe


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("lib")
    a.add_argument("out")
    a.add_argument("--arch", type=int, required=True, help="e.g. 90 for sm_90 (H100, H200)")
    a.add_argument("--keep-relfatbin", action="store_true",
                   help="keep __nv_relfatbin's cubins of --arch too (25 MB with xz for sm_90)")
    o = a.parse_args()
    d = bytearray(open(o.lib, "rb").read())
    secs = {n: (off, size) for n, off, size in sections(d)}
    if ".nv_fatbin" not in secs:
        sys.exit(f"{o.lib} has no .nv_fatbin section: not a CUDA library; give libnccl.so.2")
    kept = zeroed = 0
    for name in (".nv_fatbin", "__nv_relfatbin"):
        if name not in secs:
            continue
        off, size = secs[name]
        if name == "__nv_relfatbin" and not o.keep_relfatbin:
            d[off:off + size] = bytes(size)
            zeroed += size
            continue
        for kind, arch, p, n in entries(d, off, size):
            if kind == CUBIN and arch == o.arch:
                kept += n
            else:
                d[p:p + n] = bytes(n)
                zeroed += n
    if kept == 0:
        sys.exit(f"{o.lib} holds no sm_{o.arch} cubin: this GPU would have no NCCL kernel; "
                 "choose an architecture the library was built for")
    open(o.out, "wb").write(d)
    print(f"kept {kept / 1e6:.1f} MB of sm_{o.arch} cubins, zeroed {zeroed / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
