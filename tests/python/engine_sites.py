"""Every all-reduce call site of an installed engine against the engine model: the files of
the engine's package that name an all-reduce mechanism (engines.json `scan.pattern`: the gates'
methods, FlashInfer's fusion, Lamport and multicast kernels, push planes) must each belong to a
path of `order` (its `sites`: files, or folders ending in "/") or be listed as no all-reduce
(`scan.not_all_reduce`, with the reason). A file that is neither is a path artune has not
modelled: `python3 tests/python/engine_sites.py vllm` lists them (exit 1), as
test_vllm.py / test_sglang.py do against the installed release."""

import importlib.util
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def model():
    with open(os.path.join(ROOT, "python", "artune", "engines.json")) as f:
        return json.load(f)


def package_dir(engine: str) -> str:
    spec = importlib.util.find_spec(engine)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{engine} is not installed here")
    return os.path.dirname(spec.origin)


def sites(engine: str, root: str = None):
    """(files naming an all-reduce mechanism, relative to the package) of the installed
    engine."""
    m = model()[engine]
    pattern = re.compile(m["scan"]["pattern"])
    root = root or package_dir(engine)
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", "test", "tests"))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                if pattern.search(fh.read()):
                    out.append(os.path.relpath(path, root).replace(os.sep, "/"))
    return out


def owner(engine: str, site: str):
    """The path of `order` a site belongs to, "not an all-reduce: why", or None."""
    m = model()[engine]

    def under(prefixes):
        return any(site == p or (p.endswith("/") and site.startswith(p)) for p in prefixes)

    for row in m["order"]:
        if under(row.get("sites", [])):
            return row["path"]
    for p, why in m["scan"]["not_all_reduce"].items():
        if under([p]):
            return f"not an all-reduce: {why}"
    return None


def unmodelled(engine: str, root: str = None):
    return [s for s in sites(engine, root) if owner(engine, s) is None]


if __name__ == "__main__":
    engine = sys.argv[1]
    missing = unmodelled(engine, sys.argv[2] if len(sys.argv) > 2 else None)
    for s in missing:
        print(f"unmodelled all-reduce site in {engine}: {s}")
    sys.exit(1 if missing else 0)
