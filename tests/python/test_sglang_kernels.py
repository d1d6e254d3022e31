"""artune's own kernels inside SGLang, through SGLang's own dispatch: ``GroupCoordinator`` built
by its own constructor through the plugin's wrapper, which builds artune's op
(artune.allreduce) on the group; ``GroupCoordinator.all_reduce`` then picks what runs, SGLang's
custom ops recording its own choices as in test_sglang.py. The op is the real one; only its
device layer, which needs GPUs, is a fake that records each launch (device_layer.py)."""

import contextlib
import json
import logging
import subprocess
import types

import pytest

pytest.importorskip("sglang", reason="needs the SGLang test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.sglang  # noqa: E402
import torch  # noqa: E402
from artune import allreduce  # noqa: E402
from sglang.srt.distributed import parallel_state  # noqa: E402

from conftest import BIN, tune  # noqa: E402
from device_layer import (Device, Fake, check_routes, every_rank_alike, fake_device,  # noqa: E402
                          message, sizes)
from machines import MODES, Machine  # noqa: E402
from test_sglang import V2, log_name, on_machine, restore, unregister  # noqa: E402,F401

#: Eight PCIe GPUs on two sockets: SGLang's custom all-reduce needs NVLink beyond two GPUs,
#: and the profile chooses the island schedules at some sizes.
BOX = Machine("RTX PRO 6000 TP8 PCIe, two sockets", (12, 0), 8, False, False, "islands")


@pytest.fixture(scope="module")
def islands(tmp_path_factory):
    return tune(str(tmp_path_factory.mktemp("kernels")), "pcie-8x-direct-2socket", "--tp", "8",
                name="islands")


@pytest.fixture
def group(monkeypatch):
    every_rank_alike(monkeypatch)
    for k in ("ARTUNE_KERNELS", "ARTUNE_SGLANG_KERNELS"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def device(group, monkeypatch):
    return fake_device(monkeypatch)


def coordinator(m, mode, monkeypatch, seen):
    """A TP coordinator built on ``m`` whose dispatch records in ``seen`` what SGLang runs
    (its outplace method, "nccl" for in place) and what artune's op runs."""
    Device.seen = seen
    monkeypatch.setattr(parallel_state, "outplace_all_reduce",
                        lambda x, group_name, outplace_all_reduce_method: seen.append(
                            outplace_all_reduce_method) or x)
    monkeypatch.setattr(parallel_state, "inplace_all_reduce",
                        lambda x, group_name: seen.append("nccl"))
    return on_machine(m, mode, monkeypatch)


def ran(gc, seen, nbytes):
    if seen[0] == "ca" and isinstance(gc.ca_comm, V2):
        cfg = gc.ca_comm._pick_config(nbytes, gc.ca_comm._can_use_graph())
        return f"v2 {cfg.algo.algo_name}" + (" multicast" if cfg.use_multicast else "")
    return "v1" if seen[0] == "ca" else seen[0]


def table(m, monkeypatch, p, dtype=torch.bfloat16):
    """What SGLang's dispatch runs at every size of ``sizes``, per mode, on one coordinator
    built per mode."""
    out = {}
    for mode in MODES:
        seen = []
        gc = coordinator(m, mode, monkeypatch, seen)
        for n in sizes(p, m.tp):
            seen.clear()
            gc.all_reduce(message(n, dtype))
            assert len(seen) == 1, (mode, n, seen)
            out[(mode, n)] = ran(gc, seen, n)
    return out


def register(path, follow, monkeypatch, kernels=None):
    unregister()
    follow(path)
    if kernels is not None:
        monkeypatch.setenv("ARTUNE_SGLANG_KERNELS", kernels)
    else:
        monkeypatch.delenv("ARTUNE_SGLANG_KERNELS", raising=False)
    artune.sglang.register()
    assert artune.sglang.applied is not None and "artune" in artune.sglang.applied.applied


@pytest.mark.parametrize("kernels", [None, "artune"])
def test_the_op_takes_the_sizes_the_profile_gives_it_through_sglangs_dispatch(
        kernels, islands, follow, monkeypatch, device):
    """By default the op takes exactly the sizes where the profile chose an island schedule;
    with ARTUNE_SGLANG_KERNELS=artune every size it gives a custom kernel. Every other size
    runs what SGLang runs with the plugin and no op (ARTUNE_SGLANG_KERNELS=engine)."""
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch, "engine")
    without = table(BOX, monkeypatch, p)
    assert set(without.values()) == {"nccl"}, without  # SGLang has nothing else here
    register(islands, follow, monkeypatch, kernels)
    got = table(BOX, monkeypatch, p)
    check_routes(p, BOX.tp, kernels, without, got)
    # Another dtype than the profile's keeps SGLang's path at a routed size.
    n = next(n for (mode, n), r in got.items() if mode == "eager" and r.startswith("artune"))
    seen = []
    coordinator(BOX, "eager", monkeypatch, seen).all_reduce(message(n, torch.float32))
    assert seen == ["nccl"], seen


def test_the_startup_line_says_what_the_op_takes_and_its_buffers(
        islands, follow, monkeypatch, device, caplog):
    register(islands, follow, monkeypatch)
    with caplog.at_level(logging.DEBUG, logger=log_name):
        coordinator(BOX, "graph", monkeypatch, [])
    lines = [r for r in caplog.records if r.name == log_name]
    said = [r for r in lines if r.levelno >= logging.INFO]
    assert len(said) == 1 and said[0].levelname == "INFO", [r.getMessage() for r in lines]
    # The short line at INFO says where the kernels run; the full list at DEBUG says more.
    short = said[0].getMessage()
    line = next(r.getMessage() for r in lines
                if r.levelno == logging.DEBUG and "follows" in r.getMessage())
    routes = allreduce.Routes.from_profile(artune.Profile.load(islands), 8,
                                           artune._artune.engine_kernels("islands"))
    assert short.endswith(f"artune's own kernels (the default) take {routes.describe()}"), short
    # The full list: the routes per mode, and the buffers' memory.
    assert f"artune's own kernels (the default) take {routes.describe()};" in line, line
    assert "MiB" in line and "per GPU measured" in line, line
    assert "before SGLang sizes its KV cache" in line, line
    # Allocated while SGLang builds the group, before its constructor returns.
    assert device.allocated == [("artune", routes.buffers)], device.allocated


@pytest.mark.parametrize("where", ["open", "connect"])
def test_an_op_that_cannot_be_built_leaves_sglangs_paths_with_one_warning(
        where, islands, follow, monkeypatch, device, caplog):
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch, "engine")
    without = table(BOX, monkeypatch, p)
    register(islands, follow, monkeypatch)
    Fake.plot = {where: {0: "GPU 0 cannot reach GPU 5's memory (no P2P)"}}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=log_name):
        got = table(BOX, monkeypatch, p)
    assert got == without
    lines = [r for r in caplog.records if r.name == log_name]
    assert len(lines) == len(MODES), [r.getMessage() for r in lines]  # one per group
    for r in lines:
        msg = r.getMessage()
        assert r.levelname == "WARNING", msg
        assert "artune's own kernels not used: rank 0: GPU 0 cannot reach" in msg, msg
        assert "SGLang runs its own paths" in msg, msg


def test_without_a_gpu_the_real_device_layer_refuses_in_the_line(islands, follow, monkeypatch,
                                                                 group, caplog):
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch)
    with caplog.at_level(logging.INFO, logger=log_name):
        got = table(BOX, monkeypatch, p)
    assert set(got.values()) == {"nccl"}, got
    msg = next(r.getMessage() for r in caplog.records if r.name == log_name)
    assert "artune's own kernels not used: rank 0: " in msg, msg
    assert "no CUDA device" in msg or "records no kernel" in msg, msg


def test_engine_builds_no_op(islands, follow, monkeypatch, device, caplog):
    register(islands, follow, monkeypatch, "engine")
    with caplog.at_level(logging.INFO, logger=log_name):
        coordinator(BOX, "graph", monkeypatch, [])
    assert device.allocated == []
    assert "artune's own kernels off (ARTUNE_SGLANG_KERNELS=engine)" in caplog.text


@pytest.mark.parametrize("var", ["ARTUNE_KERNELS", "ARTUNE_SGLANG_KERNELS"])
def test_an_unknown_kernels_setting_is_refused_once(var, islands, follow, monkeypatch, device,
                                                    caplog):
    follow(islands)
    monkeypatch.setenv(var, "fastest")
    unregister()
    with caplog.at_level(logging.INFO, logger=log_name):
        artune.sglang.register()
        artune.sglang.register()  # a second process of the job: said at DEBUG only
    assert artune.sglang.applied is None
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(lines) == 1 and f"{var}=fastest is none of" in lines[0], lines


def test_why_says_what_sglangs_dispatch_runs_with_the_op(islands, follow, monkeypatch, device):
    """`artune why` (Rust, from the same Routes rule) against SGLang's dispatch with the op."""
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch)
    got = table(BOX, monkeypatch, p)
    compared = 0
    for (mode, n), r in got.items():
        if p.select(BOX.tp, n, mode) is None:
            continue  # above the largest size measured: why answers nothing (exit 6)
        out = subprocess.run([BIN, "why", islands, "--tp", "8", "--bytes", str(n), "--mode",
                              mode, "--json"], check=True, capture_output=True, text=True)
        line = next(e for e in json.loads(out.stdout)["engines"]
                    if e["engine"] == "SGLang + artune's plugin")
        said = line["runs"]
        name = ("artune " + said.removeprefix("artune's kernels, ")
                if said.startswith("artune's kernels") else
                "nccl" if said == "NCCL" else said)
        assert name == r, (mode, n, line, r)
        compared += r.startswith("artune")
    assert compared >= 4, compared


class OwnCapture:
    """SGLang's custom all-reduce as its graph_capture() uses it: ``capture()`` registers its
    graph buffers as it exits (CustomAllreduce.capture), recorded in ``seen``."""

    disabled = False

    def __init__(self, seen):
        self.seen = seen

    @contextlib.contextmanager
    def capture(self):
        yield
        self.seen.append("SGLang registered")


def test_calls_captured_in_sglangs_graph_capture_are_registered_after_sglangs_own(
        islands, follow, monkeypatch, device):
    """SGLang's own GroupCoordinator.graph_capture (through the plugin's wrapper): the op's
    calls captured inside take the registered form, and the op registers them once SGLang's
    context, which registers its custom all-reduce's, has exited; graph calls outside stage."""
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch, "artune")
    seen = []
    gc = coordinator(BOX, "graph", monkeypatch, seen)
    op = gc._artune_op
    n = next(n for n in sizes(p, BOX.tp) if op.should_run(message(n)))
    # No GPU here: SGLang's stream switch and its NCCL communicators' capture states are
    # no-ops on these stand-ins; its custom all-reduce records its registration.
    stream = object()
    monkeypatch.setattr(parallel_state, "get_current_device_stream_fast", lambda: stream)
    gc.device_module = types.SimpleNamespace(stream=lambda s: contextlib.nullcontext())
    gc.pynccl_comm = gc.pymscclpp_comm = None
    gc.ca_comm = OwnCapture(seen)
    with gc.graph_capture(parallel_state.GraphCaptureContext(stream)):
        gc.all_reduce(message(n))
    gc.all_reduce(message(n))
    b = seen[0].split()[1]
    assert seen == [f"artune {b} registered", "SGLang registered", "artune registered 1",
                    f"artune {b}"], seen
    assert op.graph_calls() == (1, 0)
