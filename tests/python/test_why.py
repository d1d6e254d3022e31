"""`artune why --json` says what each engine runs with artune's plugin applied, and it is
computed by the plugin's own rule (src/export/follow.rs, which the plugins call through the
extension module): checked row by row against the engines' own dispatch with the plugin
registered, on held-out profile shapes (NVSwitch TP4 with NCCL inside FlashInfer's range, B200
TP2 with eager custom to 44M, a PCIe pair without P2P, an A100 NVLink pair), for vLLM and for
SGLang, SGLang's FlashInfer-tagged groups included."""

import json
import subprocess

import pytest

from conftest import BIN, KIB, MIB
from machines import MODES, Machine, message

SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 44 * MIB]
#: Held-out shape -> the machine its topology describes (the dispatch stand-ins' answers).
MACHINES = {
    "H100 TP4 NVSwitch": Machine("H100 TP4 NVSwitch", (9, 0), 4, True, True, ""),
    "B200 TP2 NVSwitch": Machine("B200 TP2 NVSwitch", (10, 0), 2, True, True, ""),
    "RTX 4090 TP2 PCIe without P2P": Machine("RTX 4090 TP2", (8, 9), 2, False, False, "",
                                             p2p=False),
    "A100 TP2 NVLink": Machine("A100 TP2 NVLink", (8, 0), 2, True, False, ""),
}


def why(profile, tp, nbytes, mode):
    out = subprocess.run([BIN, "why", profile, "--tp", str(tp), "--bytes", str(nbytes),
                          "--mode", mode, "--json"], check=True, capture_output=True,
                         text=True).stdout
    return {e["engine"]: e for e in json.loads(out)["engines"]}


def vllm_name(runs):
    """`why`'s vLLM wording as test_vllm's recording stand-ins name what ran."""
    for prefix, name in (("FlashInfer", "flashinfer"), ("custom allreduce", "custom"),
                         ("torch symmetric-memory", "torch_symm_mem"), ("NCCL", "pynccl")):
        if runs.startswith(prefix):
            return name
    raise AssertionError(f"unknown vLLM path in why: {runs}")


def sglang_name(runs):
    """`why`'s SGLang wording as test_sglang's dispatch names what ran."""
    if runs == "NCCL":
        return "nccl"
    if runs == "FlashInfer allreduce":
        return "flashinfer"
    if runs.startswith("custom all-reduce v1"):
        return "v1"
    kernel = runs.removeprefix("custom all-reduce v2, ")
    return "v2 " + kernel.replace(" over multicast", " multicast")


def rows(held_out):
    for shape, (profile, tp) in sorted(held_out.items()):
        for n in SIZES:
            for mode in MODES:
                yield shape, profile, tp, n, mode


def test_why_is_what_vllms_dispatch_runs_with_the_plugin(held_out, follow, monkeypatch):
    pytest.importorskip("vllm", reason="needs the vLLM test environment (.ci/python.sh)")
    import artune.vllm
    from test_vllm import on_machine, stub_platform, unregister
    from vllm.config.compilation import PassConfig

    compared, changed, last = 0, 0, None
    try:
        for shape, profile, tp, n, mode in rows(held_out):
            m = MACHINES[shape]
            if profile != last:
                unregister()
                native = {}
                for nn in SIZES:
                    for mm in MODES:
                        seen = []
                        on_machine(m, mm, monkeypatch, seen).all_reduce(message(nn))
                        native[(nn, mm)] = seen[0]
                follow(profile)
                artune.vllm.register()
                last = profile
            seen = []
            on_machine(m, mode, monkeypatch, seen).all_reduce(message(n))
            said = why(profile, tp, n, mode)["vLLM + artune's plugin"]
            assert [vllm_name(said["runs"])] == seen, (shape, n, mode, said, seen)
            # The fusion pass (-O2): what vLLM's own PassConfig gives with the plugin.
            stub_platform(monkeypatch, m.cap)
            top = PassConfig().flashinfer_max_size(tp)
            fused = "is fused into FlashInfer's kernel here" in said["because"]
            assert fused == (top is not None and n <= top), (shape, n, mode, top, said)
            compared += 1
            changed += seen[0] != native[(n, mode)]
    finally:
        unregister()
    assert compared == len(MACHINES) * len(SIZES) * len(MODES)
    # The grid holds rows where the plugin changes what vLLM runs, or it proves little.
    assert changed >= 8, changed


def test_why_is_what_sglangs_dispatch_runs_with_the_plugin(held_out, follow, monkeypatch):
    pytest.importorskip("sglang", reason="needs the SGLang test environment (.ci/python.sh)")
    import artune.sglang
    from test_sglang import dispatch, nccl_here, unregister

    max_tokens = artune._engine.MODEL["sglang"]["flashinfer_max_tokens"]

    def run(m, n, mode, tagged):
        # SGLang tags groups for FlashInfer where it auto-enables the fusion: 9.x and 10.x.
        tag = tagged and m.cap[0] in (9, 10)
        return dispatch(m, n, mode, monkeypatch, max_tokens if tag else None)

    compared, changed, last = 0, 0, None
    try:
        for shape, profile, tp, n, mode in rows(held_out):
            m = MACHINES[shape]
            if profile != last:
                unregister()
                native = {(nn, mm, t): run(m, nn, mm, t)
                          for nn in SIZES for mm in MODES for t in (False, True)}
                follow(profile)
                artune.sglang.register()
                p = artune.Profile.load(profile)
                last = profile
            said = why(profile, tp, n, mode)
            for tagged, engine in ((False, "SGLang + artune's plugin"),
                                   (True, "SGLang + artune's plugin, FlashInfer group")):
                got = run(m, n, mode, tagged)
                want = said[engine]["runs"]
                tokens = n // (2 * 2048)
                if tagged and tokens > max_tokens:
                    want = said["SGLang + artune's plugin"]["runs"]
                assert sglang_name(want) == got, (shape, n, mode, engine, said[engine], got)
                # Against the profile, not the plugin's plan: NCCL wherever select says NCCL.
                if nccl_here(p, tp, n, mode):
                    assert got == "nccl", (shape, n, mode, engine, said[engine])
                compared += 1
                changed += got != native[(n, mode, tagged)]
    finally:
        unregister()
    assert compared == 2 * len(MACHINES) * len(SIZES) * len(MODES)
    assert changed >= 8, changed
