"""``python -m artune ARGS``: the wheel's ``artune`` binary with ARGS, for where pip put its
scripts off PATH (``pip install --user`` in an engine's container). Same output and exit code.
"""

import os
import shutil
import sys
from importlib import metadata


def _binary():
    """The ``artune`` executable this package installed, wherever its scheme put scripts; else
    the one on PATH."""
    try:
        files = metadata.files("artune") or []
        dist = metadata.distribution("artune")
    except metadata.PackageNotFoundError:
        files, dist = [], None
    for f in files:
        if f.name == "artune" and f.parent.name in ("bin", "scripts"):
            path = os.path.realpath(dist.locate_file(f))
            if os.access(path, os.X_OK):
                return path
    return shutil.which("artune")


def main() -> int:
    path = _binary()
    if path is None:
        print("error: the artune binary this package installs was not found; reinstall the "
              "wheel (pip install --force-reinstall artune)", file=sys.stderr)
        return 2
    os.execv(path, [path, *sys.argv[1:]])
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
