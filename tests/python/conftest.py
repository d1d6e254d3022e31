"""Shared fixtures: simulated profiles tuned by the artune binary (ARTUNE_BIN), and an
environment that lets the plugins follow them on a machine without GPUs."""

import json
import os
import subprocess

import pytest

BIN = os.environ.get("ARTUNE_BIN", "target/release/artune")
#: Set by .ci/python.sh when it tests the newest releases on the package index: tests that
#: pin the release artune was read against are skipped there, so only patch breakage shows.
NEWEST = os.environ.get("ARTUNE_NEWEST_RELEASE") == "1"


def tune(tmp, preset, *args, name=None):
    out = os.path.join(tmp, f"{name or preset}.json")
    if not os.path.exists(out):
        # A topology file stands for the preset where one is given.
        sim = [] if "--topology" in args else ["--sim", preset]
        subprocess.run(
            [BIN, "tune", *sim, "--sizes", "1K:64M", "--no-contention", "--out", out, *args],
            check=True, stdout=subprocess.DEVNULL,
        )
    return out


def topology(tmp, name, preset, edit):
    """A topology file: the preset as `artune topo --json` writes it, edited by ``edit``."""
    out = os.path.join(tmp, f"{name}.topology.json")
    if not os.path.exists(out):
        t = json.loads(subprocess.run([BIN, "topo", "--sim", preset, "--json"], check=True,
                                      capture_output=True, text=True).stdout)
        edit(t)
        with open(out, "w") as f:
            json.dump(t, f)
    return out


def shape(src, out, tp, custom, add=()):
    """A copy of profile ``src`` whose TP ``tp`` choices are custom where ``custom(bytes,
    mode)`` (a measured custom kernel: the profile's own where it chose one) and NCCL
    elsewhere (its NCCL variant); ``add`` inserts buckets at those sizes (copies of the next
    larger one's measurements). Held-out band shapes the simulator would not produce on its
    own; labelled simulated like their source."""
    with open(src) as f:
        p = json.load(f)
    for g in p["groups"]:
        if g["tp"] != tp:
            continue
        for n in add:
            i = next(i for i, b in enumerate(g["buckets"]) if b["bytes"] > n)
            g["buckets"].insert(i, dict(json.loads(json.dumps(g["buckets"][i])), bytes=n))
        for b in g["buckets"]:
            customs = [k for k in ("one_stage_pull", "two_stage_pull", "one_stage_push",
                                   "two_stage_push") if k in b["results"]]
            if custom(b["bytes"], g["mode"]) and customs:
                if b["choice"] not in customs:
                    b["choice"] = customs[0]
            else:
                b["choice"] = b.get("nccl_choice") or "nccl"
            g.get("waived", {}).pop(b["choice"], None)
    with open(out, "w") as f:
        json.dump(p, f)
    return out


def fastest(src, out, tp, pick):
    """A copy of profile ``src`` whose TP ``tp`` buckets are each won, clearly (a quarter of
    the next best time, beyond any model band), by ``pick(bytes, mode)``: a custom kernel's
    id, or "nccl" for the bucket's NCCL variant. Band shapes the simulator would not give on
    its own (SGLang v2's push, pull and two-shot limits all different); simulated like their
    source."""
    with open(src) as f:
        p = json.load(f)
    for g in p["groups"]:
        if g["tp"] != tp:
            continue
        for b in g["buckets"]:
            want = pick(b["bytes"], g["mode"])
            if want == "nccl":
                want = b.get("nccl_choice") or "nccl"
            best = min(r["median_us"] for k, r in b["results"].items() if k != want)
            b["results"][want].update(median_us=best / 4, ci_low_us=best / 4.04,
                                      ci_high_us=best / 3.96)
            b["choice"] = want
            g.get("waived", {}).pop(want, None)
    with open(out, "w") as f:
        json.dump(p, f)
    return out


KIB, MIB = 1 << 10, 1 << 20


def _b200(t):
    for g in t["gpus"]:
        g["name"], g["compute_capability"] = "NVIDIA B200", "10.0"


def _a100(t):
    t["nvswitch"] = None
    for g in t["gpus"]:
        g["name"], g["compute_capability"] = "NVIDIA A100-SXM4-80GB", "8.0"


def _no_p2p(t):
    for g in t["gpus"]:
        g["name"], g["compute_capability"] = "NVIDIA GeForce RTX 4090", "8.9"
    for pr in t["pairs"]:
        pr["p2p"] = {"read": "no", "write": "no", "nvlink": "no", "atomics": "no"}


@pytest.fixture(scope="session")
def held_out(tmp_path_factory):
    """The held-out profile shapes `why` is checked against the engines' dispatch on
    (test_why_is_the_plugin.py): NVSwitch TP4 with NCCL inside FlashInfer's range, B200 TP2
    with eager custom to 44M, a PCIe pair without P2P, an A100 NVLink pair. (name, profile,
    TP size)."""
    tmp = str(tmp_path_factory.mktemp("held_out"))
    out = {}
    h100 = tune(tmp, "nvswitch-8x", "--tp", "4", name="h100-tp4")
    # Custom to 16K (64K eager) and from 512K to 1M: NCCL inside FlashInfer's 2M at TP4.
    out["H100 TP4 NVSwitch"] = (shape(
        h100, os.path.join(tmp, "h100-tp4-shaped.json"), 4,
        lambda n, m: (n <= (64 * KIB if m == "eager" else 16 * KIB)
                      or 512 * KIB <= n <= 1 * MIB)), 4)
    b200 = tune(tmp, "nvswitch-8x", "--tp", "2", "--topology",
                topology(tmp, "b200", "nvswitch-8x", _b200), name="b200-tp2")
    out["B200 TP2 NVSwitch"] = (shape(
        b200, os.path.join(tmp, "b200-tp2-shaped.json"), 2,
        lambda n, m: n <= 44 * MIB if m == "eager" else n <= 256 * KIB, add=[44 * MIB]), 2)
    out["RTX 4090 TP2 PCIe without P2P"] = (tune(
        tmp, "pcie-2x", "--topology", topology(tmp, "rtx4090", "pcie-2x", _no_p2p),
        name="rtx4090-tp2"), 2)
    a100 = tune(tmp, "nvswitch-8x", "--tp", "2", "--topology",
                topology(tmp, "a100", "nvswitch-8x", _a100), name="a100-tp2")
    out["A100 TP2 NVLink"] = (shape(
        a100, os.path.join(tmp, "a100-tp2-shaped.json"), 2,
        lambda n, m: n <= 1 * MIB or 8 * MIB <= n <= 16 * MIB), 2)
    return out


@pytest.fixture(scope="session")
def profiles(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("profiles"))
    return {
        # A plain pcie-2x takes one-stage push's LL form up to about 20K and NCCL above; with
        # NCCL's variants made twice as slow (a fault knob) the pair has a custom band (to
        # 512K) and NCCL above, so the plugins' custom and NCCL paths are both exercised.
        # A 5 MiB memory budget (3 MiB of it the op's slot table) keeps its largest custom
        # size under custom AR's 8 MiB.
        "pair": tune(tmp, "pcie-2x", "--sim-faults",
                     "slow=nccl+nccl_ring_ll+nccl_ring_simple+nccl_tree_ll+nccl_tree_simple:2",
                     "--mem-budget", "5MiB"),
        # The pair with NCCL at every size: a 1 MiB budget leaves no custom kernel room.
        "pair_nccl": tune(tmp, "pcie-2x", "--mem-budget", "1MiB", name="pair-nccl"),
        "nvswitch": tune(tmp, "nvswitch-8x", "--tp", "2,8"),
        "story": tune(tmp, "pcie-8x-2switch", "--tp", "8"),
        # Memory budgets make NCCL win where the custom kernels' buffers do not fit: a custom
        # band at small sizes and NCCL above it, or NCCL at every size (simulated, like all
        # of these).
        "nv_mid": tune(tmp, "nvswitch-8x", "--tp", "8", "--mem-budget", "4MiB", name="nv-mid"),
        "nv_nccl": tune(tmp, "nvswitch-8x", "--tp", "8", "--mem-budget", "1MiB", name="nv-nccl"),
        # NCCL made twice as slow: custom from the smallest size to a few hundred KiB at TP8,
        # NCCL above (the fusion rules' cut inside the profile).
        "nv_prefix": tune(tmp, "nvswitch-8x", "--tp", "8", "--sim-faults",
                          "slow=nccl+nccl_ring_ll+nccl_ring_simple+nccl_tree_ll+nccl_tree_simple:2",
                          name="nv-prefix"),
        # TP8 on NVSwitch where one-stage push wins to 16K, one-stage pull to 256K, two-stage
        # pull to 2M and NCCL above, in both modes: SGLang v2's three limits all differ, so
        # swapping two of them changes which kernel runs.
        "v2_steps": fastest(
            tune(tmp, "nvswitch-8x", "--tp", "8", name="nv-tp8"),
            os.path.join(tmp, "v2-steps.json"), 8,
            lambda n, m: ("one_stage_push" if n <= 16 * KIB else "one_stage_pull"
                          if n <= 256 * KIB else "two_stage_pull" if n <= 2 * MIB else "nccl")),
    }


@pytest.fixture(autouse=True)
def newest_reads_as_installed(monkeypatch):
    """In the newest-release run the release differs from the one the model was read against
    by definition; that is reported by its own test (test_the_engine_model_was_read_against_
    the_installed_release, run apart by .ci/python.sh), so here the plugins take the installed
    release as read and their one extra line does not hide real breakage."""
    if not NEWEST:
        return
    import importlib

    from artune import _engine

    for key in ("vllm", "sglang"):
        try:
            version = importlib.import_module(key).__version__
        except Exception:  # noqa: BLE001 - that engine is not installed in this environment
            continue
        monkeypatch.setitem(_engine.MODEL[key], "read_against", version)


@pytest.fixture
def follow(monkeypatch):
    """Sets ARTUNE_PROFILE to a simulated profile and allows following it here."""

    def set_profile(path):
        monkeypatch.setenv("ARTUNE_PROFILE", path)
        monkeypatch.setenv("ARTUNE_ALLOW_SIMULATED", "1")
        # No NVML here: the validity rule cannot read this machine, so the override.
        monkeypatch.setenv("ARTUNE_ALLOW_INVALID", "1")
        monkeypatch.delenv("NCCL_TUNER_PLUGIN", raising=False)

    return set_profile
