"""Fails unless the wheel gives what `pip install artune` promises: the `artune` CLI as a
script (pip installs it as bin/artune, executable) and the NCCL plugin library in the package,
neither needing a glibc newer than manylinux2014's 2.17.

    python3 .ci/wheel_contents.py target/ci-python/wheels/artune-*.whl
"""

import re
import sys
import zipfile

MANYLINUX2014_GLIBC = (2, 17)


def newest_glibc(elf: bytes):
    """The newest GLIBC_x.y symbol version an ELF file asks for (its .dynstr names them)."""
    found = {tuple(int(x) for x in m.groups()) for m in re.finditer(rb"GLIBC_(\d+)\.(\d+)", elf)}
    return max(found, default=None)


def main(path: str) -> int:
    wheel = zipfile.ZipFile(path)
    names = wheel.namelist()
    script = re.compile(r"artune-[^/]+\.data/scripts/artune")
    wanted = {
        "the artune CLI": next((n for n in names if script.fullmatch(n)), None),
        "the NCCL plugin library": next((n for n in names if n == "artune/libartune.so"), None),
    }
    bad = [f"{what} is missing" for what, name in wanted.items() if name is None]
    for what, name in wanted.items():
        if name is None:
            continue
        mode = wheel.getinfo(name).external_attr >> 16
        if what == "the artune CLI" and not mode & 0o111:
            bad.append(f"{name} is not executable (mode {mode:o})")
        glibc = newest_glibc(wheel.read(name))
        if glibc is not None and glibc > MANYLINUX2014_GLIBC:
            bad.append(f"{name} needs glibc {glibc[0]}.{glibc[1]}, newer than manylinux2014's 2.17")
    for b in bad:
        print(f"{path}: {b}", file=sys.stderr)
    if not bad:
        print(f"{path}: holds {wanted['the artune CLI']} and {wanted['the NCCL plugin library']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
