"""artune.vllm never stops vLLM: a caller that raises when a gated path refuses gets vLLM's own
answer (Muse Spark's build probe in vLLM 0.34.0), every construction path the tests reach
raises with the plugin exactly what it raises without it, and the settings and the warnings
behave as docs/ENGINE-PATHS.md says. Through vLLM's own code, with test_vllm's stand-ins for
what needs a GPU."""

import logging
import os
import subprocess
import sys
import types

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.vllm  # noqa: E402
import torch  # noqa: E402
from vllm.config.compilation import PassConfig  # noqa: E402

from conftest import KIB, shape  # noqa: E402
from machines import MACHINES, MODES, Machine, OnCuda, message  # noqa: E402
from test_vllm import (  # noqa: E402,F401 - restore: test_vllm's autouse fixture
    Workspace,
    custom_ar_pair,
    log_name,
    on_machine,
    restore,
    stub_platform,
    unregister,
)

H100_TP4 = Machine("H100 TP4 NVSwitch", (9, 0), 4, True, True, "h100")


def flashinfer_ops():
    """Muse Spark's specialized decode's FlashInfer module, as vLLM ships it (0.34.0 on)."""
    try:
        from vllm.models.muse_spark.nvidia.specialized_decode.runtime import flashinfer_ops as f
    except ImportError as e:
        pytest.skip(f"this vLLM has no Muse Spark specialized decode ({e})")
    return f


def probe_on_cuda(f, monkeypatch):
    """The module's torch, whose ``empty`` gives a tensor that says it is on CUDA (what no
    GPU here can give); everything else is torch."""
    shim = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch)
                                    if not k.startswith("__")})
    shim.empty = lambda *a, **k: torch.empty(*a, **dict(k, device="meta")).as_subclass(OnCuda)
    monkeypatch.setattr(f, "torch", shim)
    monkeypatch.setattr(Workspace, "backend", "trtllm", raising=False)


@pytest.fixture
def h100_nccl_at_256k(held_out, tmp_path):
    """An H100 TP4 profile with NCCL at 256 KiB in both modes (custom to 16 KiB and from
    512 KiB to 1 MiB): Muse Spark's probe size, inside FlashInfer's 2 MiB range."""
    src, tp = held_out["H100 TP4 NVSwitch"]
    p = artune.Profile.load(src)
    assert tp == 4 and p.custom_at(4, 256 * KIB, "eager") is False
    assert p.custom_at(4, 4 * KIB, "eager") is True
    return src


def test_muse_sparks_build_probe_gets_vllms_answer_where_the_profile_says_nccl(
        h100_nccl_at_256k, follow, monkeypatch, caplog):
    """flashinfer_ops.stock_all_reduce asks should_use_fi_ar for [16, 8192] bf16 at build
    time and raises RuntimeError if refused. Where the profile gives NCCL at that size, the
    plugin answers it as vLLM does (the decode builds), while vLLM's dispatch of the same
    size is still refused FlashInfer and runs NCCL."""
    f = flashinfer_ops()
    probe_on_cuda(f, monkeypatch)
    seen = []
    comm = on_machine(H100_TP4, "eager", monkeypatch, seen)
    native = f.stock_all_reduce(comm)
    assert native[0] is comm.fi_ar_comm and native[1] == "trtllm"
    comm.all_reduce(message(256 * KIB))
    assert seen == ["flashinfer"], seen

    follow(h100_nccl_at_256k)
    artune.vllm.register()
    assert "flashinfer" in artune.vllm.applied.applied
    comm = on_machine(H100_TP4, "eager", monkeypatch, seen)
    with caplog.at_level(logging.INFO, logger=log_name):
        assert f.stock_all_reduce(comm) == (comm.fi_ar_comm, "trtllm")
        assert f.stock_sum_order(comm) == f.BACKEND_SUM_ORDERS["trtllm"]
    said = [r.getMessage() for r in caplog.records if "stock_all_reduce" in r.getMessage()]
    assert len(said) == 1 and "flashinfer was asked by" in said[0], said
    seen.clear()
    comm.all_reduce(message(256 * KIB))
    assert seen == ["pynccl"], seen


def construction_paths(monkeypatch):
    """Every vLLM construction path these tests can drive: (name, call). Each call builds
    what vLLM builds at start-up and returns nothing; what it raises is its outcome."""
    paths = []
    for m in MACHINES + [H100_TP4]:
        for mode in MODES:
            paths.append((f"CudaCommunicator on {m.name} ({mode})",
                          lambda m=m, mode=mode: on_machine(m, mode, monkeypatch, [])))
    paths.append(("CustomAllreduce on a PCIe pair", lambda: custom_ar_pair(monkeypatch, [])))

    def fusion_sizes():
        for cap in ((9, 0), (10, 0), (10, 3)):
            stub_platform(monkeypatch, cap)
            for ws in (2, 4, 8, 16):
                PassConfig().flashinfer_max_size(ws)

    paths.append(("PassConfig.flashinfer_max_size", fusion_sizes))
    try:
        f = flashinfer_ops()
    except pytest.skip.Exception:
        return paths

    def muse(call):
        def run():
            probe_on_cuda(f, monkeypatch)
            call(on_machine(H100_TP4, "eager", monkeypatch, []))
        return run

    paths += [("Muse Spark stock_all_reduce", muse(f.stock_all_reduce)),
              ("Muse Spark stock_sum_order", muse(f.stock_sum_order)),
              ("Muse Spark bind_all_reduce", muse(f.bind_all_reduce))]
    return paths


def outcome(call):
    try:
        call()
        return "built"
    except Exception as e:  # noqa: BLE001 - the outcome compared is what it raises
        return f"{type(e).__name__}: {e}"


def test_no_construction_path_raises_with_the_plugin_what_it_does_not_raise_without(
        profiles, held_out, follow, monkeypatch):
    """The general guard: every construction path, without the plugin and then with each
    profile applied (NCCL everywhere, custom prefixes, NCCL inside FlashInfer's range, the
    held-out shapes), ends the same way: built, or the same exception vLLM raises alone."""
    paths = construction_paths(monkeypatch)
    native = {name: outcome(call) for name, call in paths}
    assert list(native.values()).count("built") >= len(paths) - 1, native
    every = dict(profiles, **{k: v[0] for k, v in held_out.items()})
    compared = 0
    for prof, path in sorted(every.items()):
        follow(path)
        artune.vllm.register()
        for name, call in paths:
            assert outcome(call) == native[name], (prof, name)
            compared += 1
        unregister()
    assert compared >= 10 * len(every), compared


def test_every_patch_point_is_as_read(profiles, follow):
    """Each path engines.json gives a patch point is patched in the installed vLLM, and
    each caller it refuses to (asked_by) is found: a release that moved one is seen here
    as "a patch no longer applies"."""
    follow(profiles["nvswitch"])
    artune.vllm.register()
    applied = artune.vllm.applied
    assert applied.skipped == [], applied.skipped
    patched = {r["path"] for r in artune._engine.MODEL["vllm"]["order"] if "patch" in r}
    assert patched <= set(applied.applied), patched - set(applied.applied)


@pytest.mark.parametrize("word", ["0", "false", "OFF", "No"])
def test_the_off_switch_takes_the_usual_spellings(word, profiles, follow, monkeypatch, caplog):
    follow(profiles["nvswitch"])
    monkeypatch.setenv("ARTUNE_VLLM", word)
    with caplog.at_level(logging.INFO, logger=log_name):
        artune.vllm.register()
    assert artune.vllm.applied is None
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(lines) == 1 and f"ARTUNE_VLLM={word}" in lines[0], lines


@pytest.mark.parametrize("var,word", [("ARTUNE_VLLM", "maybe"), ("ARTUNE_VLLM_FUSION", "sometimes"),
                                      ("ARTUNE_VLLM_CUSTOM_AR", "gone"),
                                      ("ARTUNE_ALLOW_SIMULATED", "please")])
def test_an_unknown_setting_is_refused_in_one_line_and_changes_nothing(
        var, word, profiles, follow, monkeypatch, caplog):
    follow(profiles["nvswitch"])
    monkeypatch.setenv(var, word)
    with caplog.at_level(logging.INFO, logger=log_name):
        artune.vllm.register()
    assert artune.vllm.applied is None
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(lines) == 1 and f"{var}={word} is none of" in lines[0], lines
    assert "starts as without artune" in lines[0], lines


@pytest.mark.parametrize("word", ["engine", "off", "0", "False", "no"])
def test_the_fusion_opt_out_takes_the_usual_spellings(word, profiles, follow, monkeypatch):
    stub_platform(monkeypatch, (9, 0))
    monkeypatch.setenv(artune.vllm.ENV_FUSION, word)
    follow(profiles["nv_nccl"])
    artune.vllm.register()
    assert "fusion_pass" not in artune.vllm.applied.applied
    assert PassConfig().flashinfer_max_size(8) == 512 << 10


@pytest.mark.parametrize("word", ["off", "0", "FALSE", "no"])
def test_the_custom_ar_opt_out_takes_the_usual_spellings(word, profiles, follow, monkeypatch,
                                                         caplog):
    m = next(x for x in MACHINES if x.name == "H200 TP8 NVSwitch")
    monkeypatch.setenv(artune.vllm.ENV_CUSTOM_AR, word)
    follow(profiles["nv_nccl"])
    artune.vllm.register()
    with caplog.at_level(logging.DEBUG, logger=log_name):
        comm = on_machine(m, "graph", monkeypatch, [])
    assert comm.ca_comm is None
    assert any("custom AR not built" in r.getMessage() for r in caplog.records)


def test_a_profile_warning_is_said_once_per_job(profiles, tmp_path):
    """The engine's main process loads the plugin, then starts its workers (which load it
    too) with its environment: the simulated profile's warning is logged once, by the main
    process, not once per process. The plugins' own start (what register() runs first), in
    processes started as vLLM starts them, without vLLM's minute-long import."""
    code = (
        "import logging, subprocess, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(process)d %(message)s')\n"
        "from artune import _engine\n"
        "_engine.start(logging.getLogger('vllm.artune'), 'vLLM', 'vllm', '0.34.0', None)\n"
        "if len(sys.argv) > 1:\n"
        "    for _ in range(2):\n"
        "        subprocess.run([sys.executable, __file__], check=True)\n"
    )
    script = tmp_path / "job.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTUNE_")}
    env["ARTUNE_PROFILE"] = profiles["pair"]
    out = subprocess.run([sys.executable, str(script), "main"], env=env, capture_output=True,
                         text=True, check=True).stderr
    said = [x for x in out.splitlines() if "made on a simulated fabric" in x]
    assert len(said) == 1, out
    # A second job (a new main process) says it again.
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, check=True).stderr
    assert sum("made on a simulated fabric" in x for x in out.splitlines()) == 1, out


def test_the_fusion_cut_is_the_smaller_custom_prefix_over_modes(profiles, follow, monkeypatch,
                                                                tmp_path):
    """The fusion pass is built once for graph and eager, so it fuses only where both modes
    are custom from the smallest size: with graph custom to 256 KiB and eager only to 16 KiB,
    vLLM's PassConfig gives 16 KiB, not 256 KiB."""
    src = shape(profiles["nvswitch"], str(tmp_path / "modes.json"), 8,
                lambda n, m: n <= (256 * KIB if m == "graph" else 16 * KIB))
    p = artune.Profile.load(src)
    assert p.custom_at(8, 256 * KIB, "graph") and p.custom_at(8, 256 * KIB, "eager") is False
    stub_platform(monkeypatch, (10, 0))  # vLLM fuses to 1 MiB at TP8 on 10.0
    assert PassConfig().flashinfer_max_size(8) == 1 << 20
    follow(src)
    artune.vllm.register()
    assert PassConfig().flashinfer_max_size(8) == 16 * KIB


def test_the_mode_is_the_capture_state_for_communicators_that_keep_none(profiles, follow,
                                                                       monkeypatch, tmp_path):
    """FlashInfer's and symmetric memory's communicators keep no _IS_CAPTURING: the gate
    reads graph mode from CUDA graph capture. With the profile custom at 64 KiB in graph mode
    and NCCL in eager mode, FlashInfer runs the captured all-reduce and NCCL the eager one;
    custom AR reads vLLM's own _IS_CAPTURING the same way."""
    src = shape(profiles["nvswitch"], str(tmp_path / "graph-only.json"), 8,
                lambda n, m: m == "graph")
    follow(src)
    artune.vllm.register()
    h200 = next(x for x in MACHINES if x.name == "H200 TP8 NVSwitch")
    a100 = next(x for x in MACHINES if x.name == "A100 TP8 NVLink")
    for m, path in ((h200, "flashinfer"), (a100, "custom")):
        for mode, want in (("graph", path), ("eager", "pynccl")):
            seen = []
            on_machine(m, mode, monkeypatch, seen).all_reduce(message(64 * KIB))
            assert seen == [want], (m.name, mode, seen)


def test_hisparse_moves_flashinfer_to_trtllm_and_the_startup_line_says_so(
        profiles, follow, monkeypatch, caplog):
    """Under HiSparse vLLM 0.34.0 resolves FlashInfer to its trtllm backend on one node, whose
    limit is the fusion table's (1 MiB on B200 TP8, not MNNVL's tuned 128 MiB): vLLM's own
    FlashInferAllReduce takes that limit, and the plugin's start-up line gives the same range
    and names the backend; the line also lists every path left alone, Muse Spark's build
    probe among them."""
    import vllm.config as config
    from vllm.distributed.device_communicators import flashinfer_all_reduce

    b200 = next(x for x in MACHINES if x.name == "B200 TP8 NVSwitch")
    m = artune._engine.MODEL["vllm"]
    # vLLM's config as the parts read while a communicator is built see it, HiSparse on.
    cfg = types.SimpleNamespace(attention_config=types.SimpleNamespace(hisparse_config=object()),
                                parallel_config=types.SimpleNamespace(all2all_backend=None),
                                use_cumem_cudagraph_pool=False)
    follow(profiles["nv_prefix"])
    artune.vllm.register()
    for hisparse, limit, note in ((False, m["flashinfer_max_bytes"]["10.0"]["8"], ""),
                                  (True, m["fusion_max_bytes"]["10.0"]["8"],
                                   ", trtllm backend under HiSparse")):
        current = (lambda: cfg) if hisparse else (lambda: None)
        monkeypatch.setattr(config, "get_current_vllm_config_or_none", current)
        monkeypatch.setattr(flashinfer_all_reduce, "get_current_vllm_config_or_none", current)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger=log_name):
            comm = on_machine(b200, "eager", monkeypatch, [])
        assert comm.fi_ar_comm.max_workspace_size == limit, (hisparse, limit)
        # The full start-up list, at DEBUG after the short line.
        line = next(r.getMessage() for r in caplog.records
                    if "follows" in r.getMessage() and r.levelno == logging.DEBUG)
        assert f"FlashInfer to {artune._engine.size(limit)} on 10.0{note}," in line, line
        assert "Muse Spark's build probe of FlashInfer" in line, line
        for r in m["order"]:
            if "left_alone" in r:
                assert r["left_alone"] in line, (r["path"], line)
