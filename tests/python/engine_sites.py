"""Every all-reduce call site of an installed engine against the engine model. A call site is
a function, method or class body (or a module's top level) of the engine's package whose code
names an all-reduce mechanism (engines.json `scan.pattern`: the gates' methods, any
`should_*_ar` / `should_*_allreduce`, FlashInfer's fusion, Lamport and multicast kernels,
push planes), written `file::Qualified.name` (`file::<module>` for the top level). Each must
be listed by a path of `order` (its `sites`), by `scan.dispatch` (the engine's dispatch order
and its communicators, which every gated path shares), or lie in a file or folder (ending in
"/") of `scan.not_all_reduce`, with the reason. A call site that is none of these is an
all-reduce path artune has not modelled, whether it is in a new file or a new function of a
file the model lists: `python3 tests/python/engine_sites.py vllm` lists them (exit 1), as
test_vllm.py / test_sglang.py do against the installed release."""

import ast
import gc
import importlib.util
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODULE = "<module>"


def parse(source: str) -> ast.Module:
    """``ast.parse`` with the collector paused: CPython 3.11 keeps the AST builder's recursion
    count in state the whole interpreter shares, so a finalizer that runs Python while the tree
    is built (and lets another thread parse) leaves it unbalanced, and the parse fails with
    "AST constructor recursion depth mismatch"."""
    was = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if was:
            gc.enable()


def model():
    with open(os.path.join(ROOT, "python", "artune", "engines.json")) as f:
        return json.load(f)


def package_dir(engine: str) -> str:
    spec = importlib.util.find_spec(engine)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{engine} is not installed here")
    return os.path.dirname(spec.origin)


def call_sites(source: str, pattern) -> list:
    """The qualified names of the innermost function, method or class around each line of
    ``source`` that ``pattern`` matches (MODULE for the top level), sorted and unique."""
    lines = [i for i, line in enumerate(source.splitlines(), 1) if pattern.search(line)]
    if not lines:
        return []
    try:
        tree = parse(source)
    except SyntaxError:
        return [MODULE]
    spans = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans.append((first, child.end_lineno, name))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    out = set()
    for line in lines:
        around = [s for s in spans if s[0] <= line <= s[1]]
        out.add(max(around)[2] if around else MODULE)
    return sorted(out)


def sites(engine: str, root: str = None):
    """The call sites (``file::name``, files relative to the package) of the installed
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
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8", errors="replace") as fh:
                out += [f"{rel}::{name}" for name in call_sites(fh.read(), pattern)]
    return out


def owner(engine: str, site: str):
    """The path of `order` listing a call site, "dispatch", "not an all-reduce: why", or
    None."""
    m = model()[engine]
    for row in m["order"]:
        if site in row.get("sites", []):
            return row["path"]
    if site in m["scan"]["dispatch"]:
        return "dispatch"
    file = site.split("::")[0]
    for p, why in m["scan"]["not_all_reduce"].items():
        if file == p or (p.endswith("/") and file.startswith(p)):
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
