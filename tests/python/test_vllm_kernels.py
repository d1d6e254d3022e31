"""artune's own kernels inside vLLM, through vLLM's own dispatch: ``CudaCommunicator`` built
by its own constructor through the plugin's wrapper, which builds artune's op
(artune.allreduce) on the group; ``CudaCommunicator.all_reduce`` then picks what runs. The op
is the real one (its routing, its agreement over the group, its checks of each tensor); only
its device layer, which needs GPUs, is a fake that records each launch (the op's ``_native``
seam). The process group answers as every rank of it would, as in test_vllm.py."""

import contextlib
import json
import logging
import subprocess
import types

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.vllm  # noqa: E402
import torch  # noqa: E402
from artune import _engine, allreduce  # noqa: E402

from conftest import BIN, tune  # noqa: E402
from device_layer import (Device, Fake, check_routes, every_rank_alike, fake_device,  # noqa: E402
                          message, sizes)
from machines import MACHINES, MODES, Machine  # noqa: E402
from test_vllm import log_name, on_machine, restore, unregister  # noqa: E402,F401

#: Eight PCIe GPUs on two sockets: vLLM has no peer-to-peer path at TP8 on PCIe, and the
#: profile chooses the island schedules at some sizes.
BOX = Machine("RTX PRO 6000 TP8 PCIe, two sockets", (12, 0), 8, False, False, "islands")


@pytest.fixture(scope="module")
def islands(tmp_path_factory):
    return tune(str(tmp_path_factory.mktemp("kernels")), "pcie-8x-direct-2socket", "--tp", "8",
                name="islands")


@pytest.fixture
def group(monkeypatch):
    every_rank_alike(monkeypatch)
    for k in ("ARTUNE_KERNELS", "ARTUNE_VLLM_KERNELS"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def device(group, monkeypatch):
    return fake_device(monkeypatch)


def run(m, mode, monkeypatch, nbytes, dtype=torch.bfloat16):
    """What vLLM's dispatch runs for one message on a communicator built for it."""
    seen = []
    Device.seen = seen
    comm = on_machine(m, mode, monkeypatch, seen)
    comm.all_reduce(message(nbytes, dtype))
    assert len(seen) == 1, seen
    return seen[0]


def table(m, monkeypatch, p, dtype=torch.bfloat16):
    """What vLLM's dispatch runs at every size of ``sizes``, per mode, on one communicator
    built per mode."""
    out = {}
    for mode in MODES:
        seen = []
        Device.seen = seen
        comm = on_machine(m, mode, monkeypatch, seen)
        for n in sizes(p, m.tp):
            seen.clear()
            comm.all_reduce(message(n, dtype))
            assert len(seen) == 1, (mode, n, seen)
            out[(mode, n)] = seen[0]
    return out


def register(path, follow, monkeypatch, kernels=None):
    unregister()
    follow(path)
    if kernels is not None:
        monkeypatch.setenv("ARTUNE_VLLM_KERNELS", kernels)
    else:
        monkeypatch.delenv("ARTUNE_VLLM_KERNELS", raising=False)
    artune.vllm.register()
    assert artune.vllm.applied is not None and "artune" in artune.vllm.applied.applied


@pytest.mark.parametrize("kernels", [None, "artune"])
def test_the_op_takes_the_sizes_the_profile_gives_it_through_vllms_dispatch(
        kernels, islands, follow, monkeypatch, device):
    """By default the op takes exactly the sizes where the profile chose an island schedule;
    with ARTUNE_VLLM_KERNELS=artune every size it gives a custom kernel. Every other size
    runs what vLLM runs with the plugin and no op (ARTUNE_VLLM_KERNELS=engine)."""
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch, "engine")
    without = table(BOX, monkeypatch, p)
    assert set(without.values()) == {"pynccl"}, without  # vLLM has nothing else here
    register(islands, follow, monkeypatch, kernels)
    got = table(BOX, monkeypatch, p)
    check_routes(p, BOX.tp, kernels, without, got)
    # Another dtype than the profile's keeps vLLM's path at a routed size.
    n = next(n for (mode, n), r in got.items() if mode == "eager" and r.startswith("artune"))
    assert run(BOX, "eager", monkeypatch, n, torch.float32) == "pynccl"


def test_the_startup_line_says_what_the_op_takes_and_its_buffers(
        islands, follow, monkeypatch, device, caplog):
    register(islands, follow, monkeypatch)
    with caplog.at_level(logging.DEBUG, logger=log_name):
        on_machine(BOX, "graph", monkeypatch, [])
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
    assert "island_two_shot" in line and "MiB" in line and "per GPU measured" in line, line
    assert "before vLLM sizes its KV cache" in line, line
    # Allocated while vLLM builds the communicator, before it returns.
    assert device.allocated == [("artune", routes.buffers)], device.allocated


@pytest.mark.parametrize("where", ["open", "connect"])
def test_an_op_that_cannot_be_built_leaves_vllms_paths_with_one_warning(
        where, islands, follow, monkeypatch, device, caplog):
    """A rank whose GPU cannot open the peers' buffers (no P2P) or another failure of the
    device layer: vLLM keeps its own path at every size, one warning line says why, nothing
    raises."""
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
    assert len(lines) == len(MODES), [r.getMessage() for r in lines]  # one per communicator
    for r in lines:
        msg = r.getMessage()
        assert r.levelname == "WARNING", msg
        assert "artune's own kernels not used: rank 0: GPU 0 cannot reach" in msg, msg
        assert "vLLM runs its own paths" in msg, msg


def test_without_a_gpu_the_real_device_layer_refuses_in_the_line(islands, follow, monkeypatch,
                                                                 group, caplog):
    """The op's real device layer here: no GPU (and a simulated profile, which records no
    kernel images): refused in the start-up line, vLLM's paths everywhere."""
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch)
    with caplog.at_level(logging.INFO, logger=log_name):
        got = table(BOX, monkeypatch, p)
    assert set(got.values()) == {"pynccl"}, got
    msg = next(r.getMessage() for r in caplog.records if r.name == log_name)
    assert "artune's own kernels not used: rank 0: " in msg, msg
    assert "no CUDA device" in msg or "records no kernel" in msg, msg


def test_engine_and_a_profile_without_islands_build_no_op(profiles, islands, follow,
                                                         monkeypatch, device, caplog):
    register(islands, follow, monkeypatch, "engine")
    with caplog.at_level(logging.INFO, logger=log_name):
        on_machine(BOX, "graph", monkeypatch, [])
    assert device.allocated == []
    assert "artune's own kernels off (ARTUNE_VLLM_KERNELS=engine)" in caplog.text
    # An NVSwitch box is one island: no island schedule at TP8, nothing to build by default.
    caplog.clear()
    register(profiles["nv_prefix"], follow, monkeypatch)
    with caplog.at_level(logging.INFO, logger=log_name):
        on_machine(BOX, "graph", monkeypatch, [])
    assert device.allocated == []
    assert "artune's own kernels take no size here (the profile chooses none of" in caplog.text


def test_custom_ar_off_builds_none_where_the_op_takes_every_custom_size(
        profiles, follow, monkeypatch, device, caplog):
    """ARTUNE_VLLM_CUSTOM_AR=off on a PCIe pair whose profile has a custom band: with
    ARTUNE_VLLM_KERNELS=artune the op takes every custom size, so vLLM builds no custom AR (no
    IPC buffers) and the line says why; by default (no island schedule on a pair) vLLM's
    custom AR is built as without the setting, since it serves the custom band, and the op
    only where the profile chooses a backend no engine has (a copy-engine band)."""
    pair = next(m for m in MACHINES if m.name == "L40S TP2 PCIe")
    p = artune.Profile.load(profiles["pair"])
    assert any(b.custom for mode in MODES for b in p.bands(2, mode))
    monkeypatch.setenv(artune.vllm.ENV_CUSTOM_AR, "off")
    register(profiles["pair"], follow, monkeypatch)
    mem = []
    on_machine(pair, "graph", monkeypatch, [], mem)
    unpathed = {b.backend for m in MODES for b in p.bands(2, m)
                if b.backend in artune._artune.engine_kernels("islands")}
    assert bool(device.allocated) == bool(unpathed), (unpathed, device.allocated)
    assert [k for k, _ in mem] == ["ipc", "ipc"], mem
    register(profiles["pair"], follow, monkeypatch, "artune")
    mem.clear()
    caplog.clear()
    seen = []
    with caplog.at_level(logging.DEBUG, logger=log_name):
        comm = on_machine(pair, "graph", monkeypatch, seen, mem)
    assert mem == [] and device.allocated, (mem, device.allocated)
    line = next(r.getMessage() for r in caplog.records  # the full list, at DEBUG
                if r.name == log_name and r.levelno == logging.DEBUG)
    assert ("custom AR not built (ARTUNE_VLLM_CUSTOM_AR=off; artune's own kernels take every "
            "custom size)") in line, line
    Device.seen = seen
    for n in sizes(p, 2):
        c = p.select(2, n, "graph")
        seen.clear()
        comm.all_reduce(message(n))
        want = f"artune {c.backend}" if c is not None and c.custom else "pynccl"
        assert seen == [want], (n, seen)


@pytest.mark.parametrize("var", ["ARTUNE_KERNELS", "ARTUNE_VLLM_KERNELS"])
def test_an_unknown_kernels_setting_is_refused_once(var, islands, follow, monkeypatch, device,
                                                    caplog):
    follow(islands)
    monkeypatch.setenv(var, "fastest")
    unregister()
    with caplog.at_level(logging.INFO, logger=log_name):
        artune.vllm.register()
        artune.vllm.register()  # a second process of the job: said at DEBUG only
    assert artune.vllm.applied is None
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(lines) == 1 and f"{var}=fastest is none of" in lines[0], lines


def test_the_global_setting_and_the_engines_own(islands, follow, monkeypatch):
    monkeypatch.setenv("ARTUNE_KERNELS", "ON")
    assert _engine.kernels("vllm") == ("artune", "ARTUNE_KERNELS=artune")
    monkeypatch.setenv("ARTUNE_VLLM_KERNELS", "engine")
    assert _engine.kernels("vllm") == ("engine", "ARTUNE_VLLM_KERNELS=engine")
    monkeypatch.delenv("ARTUNE_KERNELS")
    monkeypatch.delenv("ARTUNE_VLLM_KERNELS")
    assert _engine.kernels("vllm") == ("islands", "the default")


def test_why_says_what_vllms_dispatch_runs_with_the_op(islands, follow, monkeypatch, device):
    """`artune why` (Rust, from the same Routes rule) against vLLM's dispatch with the op:
    the line "vLLM + artune's plugin" names artune's kernel where the op runs one."""
    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch)
    got = table(BOX, monkeypatch, p)
    compared = 0
    for (mode, n), ran in got.items():
        if p.select(BOX.tp, n, mode) is None:
            continue  # above the largest size measured: why answers nothing (exit 6)
        out = subprocess.run([BIN, "why", islands, "--tp", "8", "--bytes", str(n), "--mode",
                              mode, "--json"], check=True, capture_output=True, text=True)
        line = next(e for e in json.loads(out.stdout)["engines"]
                    if e["engine"] == "vLLM + artune's plugin")
        said = line["runs"]
        name = ("artune " + said.removeprefix("artune's kernels, ")
                if said.startswith("artune's kernels") else
                "pynccl" if said == "NCCL" else said)
        assert name == ran, (mode, n, line, ran)
        compared += ran.startswith("artune")
    assert compared >= 4, compared


class OwnCapture:
    """vLLM's custom all-reduce as its graph_capture() uses it: ``capture()`` registers its
    graph buffers as it exits (CustomAllreduce.capture), recorded in ``seen``."""

    disabled = False

    def __init__(self, seen):
        self.seen = seen

    @contextlib.contextmanager
    def capture(self):
        yield
        self.seen.append("vLLM registered")


def test_calls_captured_in_vllms_graph_capture_are_registered_after_vllms_own(
        islands, follow, monkeypatch, device):
    """vLLM's own GroupCoordinator.graph_capture (through the plugin's wrapper): the op's calls
    captured inside take the registered form, and the op registers them once vLLM's context,
    which registers its custom all-reduce's, has exited; graph calls outside it stage."""
    from vllm.distributed import parallel_state

    p = artune.Profile.load(islands)
    register(islands, follow, monkeypatch, "artune")
    seen = []
    Device.seen = seen
    comm = on_machine(BOX, "graph", monkeypatch, seen)
    comm.ca_comm = OwnCapture(seen)
    op = comm._artune_op
    n = next(n for n in sizes(p, BOX.tp) if op.should_run(message(n)))
    stream = object()  # no GPU here: vLLM's stream switch is a no-op on this stand-in
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    gc = types.SimpleNamespace(device_communicator=comm)
    with parallel_state.GroupCoordinator.graph_capture(
            gc, parallel_state.GraphCaptureContext(stream)):
        comm.all_reduce(message(n))
    comm.all_reduce(message(n))
    b = seen[0].split()[1]
    assert seen == [f"artune {b} registered", "vLLM registered", "artune registered 1",
                    f"artune {b}"], seen
    assert op.graph_calls() == (1, 0)
