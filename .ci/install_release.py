"""Installs an engine release into a virtual environment, as .ci/python.sh needs it:
`python3 .ci/install_release.py VENV PACKAGE==VERSION [EXTRA...]`.

First as pip resolves it. Where the release pins a dependency the package index does not hold
(vLLM 0.34.0 pins flashinfer-python 0.7.3, which was never uploaded), the release is
installed without its dependencies and then its own requirements are installed with each
missing pin replaced by the nearest version the index has: the next one above it in the same
major.minor series, else the highest below it. Every replacement is printed on one line
starting with "NEAREST", so the run says which dependencies it did not test as pinned.

Exit 0: installed (as pinned, or with the replacements printed); 3: it cannot be installed
here even so (the reason is pip's, above)."""

import re
import subprocess
import sys

MISSING = re.compile(r"No matching distribution found for ([A-Za-z0-9_.\-]+)==([^\s;]+)")
ROUNDS = 4


def pip(venv: str, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([f"{venv}/bin/pip", *args], text=True,
                          capture_output=capture)


def available(venv: str, name: str) -> list:
    out = pip(venv, "index", "versions", name, capture=True).stdout
    m = re.search(r"Available versions: (.*)", out)
    return [v.strip() for v in m.group(1).split(",")] if m else []


def nearest(pinned: str, versions: list) -> str:
    """The version to use for a pin the index lacks: the closest above it in the same
    major.minor series (a later patch keeps the API), else the highest below it."""
    try:
        from packaging.version import Version
    except ImportError:  # the interpreter running this has only pip's own copy
        from pip._vendor.packaging.version import Version

    want = Version(pinned)
    vs = sorted((Version(v) for v in versions if not Version(v).is_prerelease), reverse=True)
    same = [v for v in vs if v.release[:2] == want.release[:2] and v > want]
    if same:
        return str(min(same))
    below = [v for v in vs if v < want]
    if below:
        return str(below[0])
    if vs:
        return str(vs[-1])
    raise SystemExit(f"{pinned}: the index holds no version at all")


def requirements(venv: str, dist: str, replaced: dict) -> list:
    """The installed release's own requirements for this platform, with replaced pins."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "from packaging.requirements import Requirement\n"
        "out = []\n"
        f"for r in m.requires({dist!r}) or []:\n"
        "    q = Requirement(r)\n"
        "    if q.marker is None or q.marker.evaluate({'extra': ''}):\n"
        "        q.marker = None\n"
        "        out.append(str(q))\n"
        "print(json.dumps(out))\n"
    )
    import json

    out = subprocess.run([f"{venv}/bin/python", "-c", code], text=True, capture_output=True,
                         check=True).stdout
    reqs = []
    for r in json.loads(out):
        name = re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-")
        reqs.append(f"{name}=={replaced[name]}" if name in replaced else r)
    return reqs


def main() -> int:
    venv, req, *extra = sys.argv[1:]
    dist = req.split("==")[0]
    replaced, pins = {}, {}
    for _ in range(ROUNDS):
        if not replaced:
            r = pip(venv, "install", "-q", "--no-cache-dir", req, *extra, capture=True)
        else:
            base = pip(venv, "install", "-q", "--no-cache-dir", "--no-deps", req, "packaging",
                       capture=True)
            if base.returncode != 0:
                sys.stderr.write(base.stderr)
                return 3
            r = pip(venv, "install", "-q", "--no-cache-dir",
                    *requirements(venv, dist, replaced), *extra, capture=True)
        if r.returncode == 0:
            for name, v in replaced.items():
                print(f"NEAREST {req}: {name}=={pins[name]} is not on the package index; "
                      f"installed {name}=={v} (the nearest it has) with the release's other "
                      "requirements as pinned")
            return 0
        missing = MISSING.findall(r.stderr)
        if not missing:
            sys.stderr.write(r.stderr)
            return 3
        for name, v in missing:
            key = name.lower().replace("_", "-")
            if key in replaced:
                sys.stderr.write(r.stderr)
                return 3
            pins[key] = v
            replaced[key] = nearest(v, available(venv, name))
    sys.stderr.write(f"{req}: still missing dependencies after {ROUNDS} rounds\n")
    return 3


if __name__ == "__main__":
    sys.exit(main())
