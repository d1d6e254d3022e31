"""artune.vllm against the released vLLM installed beside it, through vLLM's own dispatch:
``CudaCommunicator`` built by its own constructor (through the plugin's wrapper), whose
``all_reduce``, ``custom_all_gather`` and ``custom_reduce_scatter`` pick what runs; custom
all-reduce and FlashInfer are built by their own constructors, torch symmetric memory and
pynccl are recording stand-ins that keep vLLM's real ``should_*`` methods. Only what needs a
GPU is stubbed: the platform's capability and topology probes, the process group, the IPC
and multicast allocations, the kernels (recorded), FlashInfer's workspace, and a tensor that
says it is on CUDA."""

import logging
import types
import os

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.vllm  # noqa: E402
import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.config.compilation import PassConfig  # noqa: E402
from vllm.distributed.device_communicators import (  # noqa: E402
    all_reduce_utils,
    cuda_communicator,
    custom_all_reduce,
    flashinfer_all_reduce,
    symm_mem,
)
from vllm.platforms.interface import DeviceCapability  # noqa: E402

from conftest import NEWEST  # noqa: E402
from machines import MACHINES, MODES, SIZES, message, rows  # noqa: E402

def _fusion_table():
    """vLLM's FI_ALLREDUCE_FUSION_MAX_SIZE_MB, read from its source: the module that holds it
    needs vLLM's CUDA ops to import."""
    import ast
    import importlib.util

    path = os.path.join(os.path.dirname(importlib.util.find_spec("vllm").origin), "compilation",
                        "passes", "fusion", "allreduce_rms_fusion.py")
    import engine_sites

    for node in engine_sites.parse(open(path).read()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == \
                "FI_ALLREDUCE_FUSION_MAX_SIZE_MB":
            return ast.literal_eval(node.value)
    raise AssertionError("vLLM no longer defines FI_ALLREDUCE_FUSION_MAX_SIZE_MB")


FUSION_MB = _fusion_table()
REAL_PLATFORM = vllm.platforms.current_platform
CAR = custom_all_reduce.CustomAllreduce
FI = flashinfer_all_reduce.FlashInferAllReduce
SYMM = symm_mem.SymmMemCommunicator
COMM = cuda_communicator.CudaCommunicator
PATCHED = [(COMM, "__init__"), (CAR, "__init__"), (CAR, "should_custom_ar"),
           (SYMM, "should_use_symm_mem"), (FI, "should_use_fi_ar"),
           (PassConfig, "flashinfer_max_size")]
log_name = "vllm.artune"


@pytest.fixture(autouse=True)
def restore(monkeypatch):
    saved = [(cls, name, cls.__dict__[name]) for cls, name in PATCHED]
    for k in ("VLLM_BATCH_INVARIANT", "ARTUNE_VLLM", artune.vllm.RAY_PREFIXES,
              artune.vllm.ENV_FUSION, artune.vllm.ENV_CUSTOM_AR, artune._engine.ENV_SAID):
        monkeypatch.delenv(k, raising=False)
    yield
    unregister()
    for cls, name, f in saved:
        setattr(cls, name, f)
    if hasattr(CAR, "_artune_patched"):
        delattr(CAR, "_artune_patched")


class Platform:
    """vLLM's current_platform for a GPU class."""

    def __init__(self, cap):
        self.cap = DeviceCapability(*cap)

    def is_cuda(self):
        return True

    def is_rocm(self):
        return False

    def get_device_capability(self, device_id=0):
        return self.cap

    def has_device_capability(self, c, device_id=0):
        return self.cap.to_int() >= (c if isinstance(c, int) else c[0] * 10 + c[1])

    def __getattr__(self, name):
        return getattr(REAL_PLATFORM, name)


def stub_platform(monkeypatch, cap):
    plat = Platform(cap)
    monkeypatch.setattr(vllm.platforms, "current_platform", plat, raising=False)
    monkeypatch.setattr(flashinfer_all_reduce, "current_platform", plat)
    table = FUSION_MB.get(plat.cap.to_int(), {})
    monkeypatch.setattr(PassConfig, "default_fi_allreduce_fusion_max_size_mb",
                        staticmethod(lambda: table))


class Workspace:
    """Stands for FlashInfer's workspace, which needs GPUs to exist."""

    def is_buffer_size_sufficient(self, **_):
        return True


class Group:
    """A stateless process group (vLLM's base constructor asks it for rank and size)."""

    def __init__(self, ws):
        self.ws = ws

    def rank(self):
        return 0

    def size(self):
        return self.ws


class OnMachine(Platform):
    """The platform as custom all-reduce's constructor probes it on machine ``m``."""

    def __init__(self, m):
        super().__init__(m.cap)
        self.nvlink = m.nvlink

    def is_cuda_alike(self):
        return True

    def visible_device_id_to_physical_device_id(self, i):
        return 0

    def is_fully_connected(self, ids):
        return self.nvlink


def on_machine(m, mode, monkeypatch, seen, allocated=None):
    """A TP communicator built by vLLM's own ``CudaCommunicator.__init__`` on machine ``m``
    (through the plugin's wrapper when registered). CustomAllreduce is built by its own
    constructor, whose GPU probes answer as on ``m`` and whose IPC and multicast buffers are
    recorded in ``allocated`` instead of allocated; its kernels, pynccl, FlashInfer and torch
    symmetric memory record in ``seen`` what runs."""
    from vllm import _custom_ops as ops
    from vllm.distributed.device_communicators import pynccl

    allocated = [] if allocated is None else allocated
    stub_platform(monkeypatch, m.cap)
    plat = OnMachine(m)
    for mod in (cuda_communicator, custom_all_reduce):
        monkeypatch.setattr(mod, "current_platform", plat)
    monkeypatch.setattr(flashinfer_all_reduce, "fi_ar_available", True)
    monkeypatch.setattr(flashinfer_all_reduce, "_node_count", lambda g: 1)
    monkeypatch.setattr(flashinfer_all_reduce, "get_fi_ar_workspace", lambda **k: Workspace())
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: m.tp)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(torch.distributed, "all_gather", lambda out, t, group=None: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: mode == "graph")
    key = f"{m.cap[0]}.{m.cap[1]}"

    monkeypatch.setattr(custom_all_reduce, "custom_ar", True)
    monkeypatch.setattr(custom_all_reduce, "in_the_same_node_as",
                        lambda group, source_rank=0: [True] * m.tp)
    monkeypatch.setattr(custom_all_reduce, "_can_p2p", lambda rank, ws: m.p2p)
    monkeypatch.setattr(custom_all_reduce, "_supports_mnnvl_multimem_reduce_scatter",
                        lambda device, ws: False)
    monkeypatch.setattr(custom_all_reduce, "_all_ranks_true", lambda group, v: v)
    monkeypatch.setattr(ops, "meta_size", lambda: 2048, raising=False)  # vLLM's signals
    monkeypatch.setattr(ops, "init_custom_ar", lambda *a: 1, raising=False)  # its handle
    for op, name in (("register_buffer", None), ("dispose", None),
                     ("all_reduce", "custom"), ("custom_all_gather", "custom all_gather"),
                     ("custom_reduce_scatter", "custom reduce_scatter"),
                     ("mnnvl_lamport_all_gather", "multicast all_gather"),
                     ("mnnvl_lamport_reduce_scatter", "multicast reduce_scatter")):
        monkeypatch.setattr(ops, op, (lambda *a, _n=name: seen.append(_n)) if name else
                            (lambda *a: 0), raising=False)
    monkeypatch.setattr(CAR, "create_shared_buffer", staticmethod(
        lambda n, group=None, uncached=False: allocated.append(("ipc", n)) or [0] * m.tp))
    monkeypatch.setattr(CAR, "free_shared_buffer", staticmethod(
        lambda pointers, group=None, rank=None: allocated.append(("free", 0))))

    def multicast_buffer(self, stage):
        # torch symmetric memory gives a multicast pointer only on NVSwitch (NVLS).
        if m.multicast:
            allocated.append(("multicast", 6 * stage))
            self.mnnvl_multicast_ptr, self.mnnvl_buffer_size = 1, stage

    monkeypatch.setattr(CAR, "_init_mnnvl_buffer", multicast_buffer)
    monkeypatch.setattr(CAR, "__del__", lambda self: None)

    # Recorded on vLLM's own classes, not subclasses: the plugin patches those classes.
    def fi_all_reduce(self, x):
        seen.append("flashinfer")
        return x

    def symm_init(self, group, device):
        table = all_reduce_utils.SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(key, {})
        self.disabled = not (m.multicast and m.tp in table)
        self.dtype, self.world_size = torch.bfloat16, m.tp
        self.max_size = table.get(m.tp, 0)

    def symm_all_reduce(self, x, *, out=None):
        seen.append("torch_symm_mem")
        return x

    monkeypatch.setattr(FI, "all_reduce", fi_all_reduce)
    monkeypatch.setattr(SYMM, "__init__", symm_init)
    monkeypatch.setattr(SYMM, "all_reduce", symm_all_reduce)

    class RecNccl:
        disabled, nccl_version = False, 22903

        def __init__(self, group, device):
            self.world_size = m.tp

        def all_reduce(self, x):
            seen.append("pynccl")
            return x

        def all_gather(self, out, x):
            seen.append("nccl all_gather")

        def reduce_scatter(self, out, x):
            seen.append("nccl reduce_scatter")

    monkeypatch.setattr(pynccl, "PyNcclCommunicator", RecNccl)
    comm = COMM(Group(m.tp), device=torch.device("meta"), unique_name="tp:0",
                global_ranks=list(range(m.tp)), global_world_size=m.tp)
    if comm.ca_comm is not None:
        comm.ca_comm._IS_CAPTURING = mode == "graph"  # vLLM's graph_capture() sets it
    return comm


def dispatch(m, nbytes, mode, monkeypatch):
    seen = []
    on_machine(m, mode, monkeypatch, seen).all_reduce(message(nbytes))
    assert len(seen) == 1, seen
    return seen[0]


def unregister():
    if artune.vllm.applied is not None:
        artune.vllm.applied.undo()
        artune.vllm.applied = None
    if hasattr(CAR, "_artune_patched"):
        delattr(CAR, "_artune_patched")


def test_every_row_runs_what_the_profile_says_through_vllms_own_dispatch(
        profiles, follow, monkeypatch):
    """5 GPU classes x 4 sizes x 2 modes, one profile registered at a time as in an engine
    process. Where the profile says NCCL, pynccl runs; where it says custom, vLLM's own order
    (what it runs without artune) applies."""
    changed = 0
    native = {}
    for prof in sorted({m.profile for m in MACHINES}):
        machines = [m for m in MACHINES if m.profile == prof]
        for m in machines:
            for n in SIZES:
                for mode in MODES:
                    native[(m.name, n, mode)] = dispatch(m, n, mode, monkeypatch)
        follow(profiles[prof])
        artune.vllm.register()
        p = artune.Profile.load(profiles[prof])
        for m in machines:
            for n in SIZES:
                for mode in MODES:
                    c = p.select(m.tp, n, mode)
                    was = native[(m.name, n, mode)]
                    want = was if c is None or c.custom else "pynccl"
                    got = dispatch(m, n, mode, monkeypatch)
                    assert got == want, (m.name, n, mode, c and c.backend, was)
                    changed += got != was
        unregister()
    # The table must hold rows where the plugin changes what vLLM runs, or it proves nothing.
    assert changed >= 4, changed
    # Without artune, FlashInfer takes 4 KiB to 512 KiB on H200 TP8 (vLLM 0.33.0), torch
    # symmetric memory above; B200 TP8 FlashInfer to 128 MiB; A100 custom AR.
    assert [native[("H200 TP8 NVSwitch", n, "eager")] for n in SIZES] == [
        "flashinfer", "flashinfer", "flashinfer", "torch_symm_mem"]
    assert {native[("B200 TP8 NVSwitch", n, "graph")] for n in SIZES} == {"flashinfer"}
    assert native[("A100 TP8 NVLink", 64 << 10, "graph")] == "custom"
    assert {native[("RTX PRO 6000 TP8 PCIe", n, "graph")] for n in SIZES} == {"pynccl"}


def test_batch_invariance_and_the_off_switch_leave_vllm_alone(profiles, follow, monkeypatch,
                                                              caplog):
    before = [cls.__dict__[name] for cls, name in PATCHED]
    follow(profiles["nvswitch"])
    for var in ("VLLM_BATCH_INVARIANT", "ARTUNE_VLLM"):
        monkeypatch.setenv(var, "1" if var == "VLLM_BATCH_INVARIANT" else "0")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=log_name):
            artune.vllm.register()
        assert [cls.__dict__[name] for cls, name in PATCHED] == before
        assert len(caplog.records) == 1 and var in caplog.text, caplog.text
        monkeypatch.delenv(var)


def test_artune_settings_reach_ray_workers(profiles, follow):
    from vllm.ray.ray_env import get_env_vars_to_copy

    follow(profiles["pair"])
    assert "ARTUNE_PROFILE" not in get_env_vars_to_copy()
    artune.vllm.register()
    assert {"ARTUNE_PROFILE", "ARTUNE_ALLOW_SIMULATED"} <= get_env_vars_to_copy()


def test_one_startup_line_per_tp_group_through_vllms_logger(profiles, follow, monkeypatch,
                                                             caplog):
    """Through the plugin's real constructor wrapper; vLLM's constructor (which needs GPUs)
    is replaced by one that records whether custom AR was enabled for it."""
    from vllm.distributed import parallel_state

    real = COMM.__init__
    seen = []

    def recording(self, *a, **k):
        seen.append(parallel_state._ENABLE_CUSTOM_ALL_REDUCE)

    recording.__wrapped__ = real  # the plugin binds arguments by vLLM's signature
    monkeypatch.setattr(COMM, "__init__", recording)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    follow(profiles["pair"])
    artune.vllm.register()
    with caplog.at_level(logging.DEBUG, logger=log_name):
        COMM(None, unique_name="tp:0")
        COMM(None, unique_name="pp:0")
    said = [r.getMessage() for r in caplog.records
            if r.name == log_name and r.levelno >= logging.INFO]
    full = [r.getMessage() for r in caplog.records
            if r.name == log_name and r.levelno == logging.DEBUG and "follows" in r.getMessage()]
    # The short line at INFO, the full list at DEBUG.
    assert len(said) == 1 and said[0].startswith("artune: TP2 group tp:0 follows"), said
    assert "sizes steered" in said[0] and "NCCL sizes run NCCL" in full[0], full
    p = artune.Profile.load(profiles["pair"])
    assert seen == [any(b.custom for m in MODES for b in p.bands(2, m)), True]


def test_a_patch_point_not_as_read_is_skipped_and_said(profiles, follow, monkeypatch):
    def changed(self, input_tensor, extra):
        return True

    monkeypatch.setattr(FI, "should_use_fi_ar", changed)
    should = CAR.__dict__["should_custom_ar"]
    follow(profiles["nvswitch"])
    artune.vllm.register()
    assert FI.__dict__["should_use_fi_ar"] is changed
    assert CAR.__dict__["should_custom_ar"] is not should
    assert any(s.startswith("flashinfer (") for s in artune.vllm.applied.skipped)
    line = artune.vllm.startup_line(artune._engine.Bands(artune.Profile.load(
        profiles["nvswitch"])), artune.vllm.applied, "tp:0", 8, False, True)
    assert "not applied: flashinfer" in line


def test_no_profile_bad_profile_or_simulated_leaves_vllm_as_it_was(
        profiles, follow, monkeypatch, tmp_path, caplog):
    before = [cls.__dict__[name] for cls, name in PATCHED]
    monkeypatch.delenv("ARTUNE_PROFILE", raising=False)
    artune.vllm.register()
    assert [cls.__dict__[name] for cls, name in PATCHED] == before
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    follow(str(bad))
    with caplog.at_level(logging.WARNING, logger=log_name):
        artune.vllm.register()
    assert [cls.__dict__[name] for cls, name in PATCHED] == before
    assert len(caplog.records) == 1 and "bad.json" in caplog.text
    caplog.clear()
    follow(profiles["pair"])
    monkeypatch.delenv("ARTUNE_ALLOW_SIMULATED")
    with caplog.at_level(logging.WARNING, logger=log_name):
        artune.vllm.register()
    assert [cls.__dict__[name] for cls, name in PATCHED] == before
    assert len(caplog.records) == 1 and "SIMULATED" in caplog.text
    assert "NCCL_TUNER_PLUGIN" not in os.environ


def test_the_engine_model_holds_vllms_own_tables():
    """python/artune/engines.json (read by the plugin and by `artune why`) against the
    installed vLLM's tables."""
    m = artune._engine.MODEL["vllm"]

    def by_ws(t):
        return {str(k): int(v) for k, v in t.items()}

    for cap, t in all_reduce_utils.CUSTOM_ALL_REDUCE_MAX_SIZES.items():
        assert m["custom_max_bytes"][cap] == by_ws(t), cap
    for cap, t in all_reduce_utils.SYMM_MEM_ALL_REDUCE_MAX_SIZES.items():
        assert m["symm_mem_max_bytes"][cap] == by_ws(t), cap
    assert m["flashinfer_world_sizes"] == [2, 4, 8, 16]  # PassConfig's FI_SUPPORTED_WORLD_SIZES
    for cap_int, t in FUSION_MB.items():
        cap = f"{cap_int // 10}.{cap_int % 10}"
        assert m["fusion_max_bytes"][cap] == {
            str(w): int(mb * (1 << 20)) for w, mb in t.items()}, cap
        # FlashInfer standalone: the fusion table, unless MNNVL has a tuned single-node size.
        want = {str(w): int(mb * (1 << 20)) for w, mb in t.items()}
        for (c, w, nodes), mb in all_reduce_utils.FI_MNNVL_ALLREDUCE_MAX_SIZE_MB.items():
            if c == cap_int and nodes == 1:
                want[str(w)] = int(mb * (1 << 20))
        assert m["flashinfer_max_bytes"][cap] == want, cap


def test_the_nccl_plugin_is_named_for_nccl(profiles, follow):
    follow(profiles["pair"])
    artune.vllm.register()
    assert os.environ["NCCL_TUNER_PLUGIN"] == artune.plugin_path()


def test_an_unread_release_is_said_once_and_only_verified_patches_apply(
        profiles, follow, monkeypatch, caplog):
    """A faked vLLM version, and one patch point whose signature changed in it: one line
    names both versions; the changed one is left alone and named; the rest apply."""
    monkeypatch.setattr(vllm, "__version__", "0.99.0")

    def changed(self, input_tensor, extra):
        return True

    monkeypatch.setattr(FI, "should_use_fi_ar", changed)
    follow(profiles["nvswitch"])
    with caplog.at_level(logging.INFO, logger=log_name):
        artune.vllm.register()
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    read = artune._engine.MODEL["vllm"]["read_against"]
    assert len(lines) == 1 and "0.99.0" in lines[0] and read in lines[0], lines
    assert FI.__dict__["should_use_fi_ar"] is changed
    applied = artune.vllm.applied
    assert "flashinfer" not in applied.applied
    assert any(s.startswith("flashinfer (") for s in applied.skipped), applied.skipped
    assert {"custom", "torch_symm_mem", "fusion_pass"} <= set(applied.applied)


def custom_ar_pair(monkeypatch, allocated):
    """vLLM's own CustomAllreduce constructor on a PCIe pair; the IPC buffers it asks for are
    recorded instead of allocated, and the GPU probes answer as on two P2P-capable GPUs."""
    from vllm import _custom_ops as ops

    class Pair:
        def get_device_capability(self, device_id=0):
            return DeviceCapability(8, 9)

        def is_cuda(self):
            return True

        def is_cuda_alike(self):
            return True

        def is_rocm(self):
            return False

        def visible_device_id_to_physical_device_id(self, i):
            return 0

        def is_fully_connected(self, ids):
            return False

    monkeypatch.setattr(custom_all_reduce, "custom_ar", True)
    monkeypatch.setattr(custom_all_reduce, "current_platform", Pair())
    monkeypatch.setattr(custom_all_reduce, "in_the_same_node_as",
                        lambda group, source_rank=0: [True, True])
    monkeypatch.setattr(custom_all_reduce, "_can_p2p", lambda rank, ws: True)
    monkeypatch.setattr(custom_all_reduce, "_supports_mnnvl_multimem_reduce_scatter",
                        lambda device, ws: False)
    monkeypatch.setattr(custom_all_reduce, "_all_ranks_true", lambda group, v: False)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(torch.distributed, "all_gather", lambda out, t, group=None: None)
    monkeypatch.setattr(ops, "meta_size", lambda: 0, raising=False)
    monkeypatch.setattr(ops, "init_custom_ar", lambda *a: 1, raising=False)
    monkeypatch.setattr(ops, "register_buffer", lambda *a: None, raising=False)
    monkeypatch.setattr(CAR, "create_shared_buffer", staticmethod(
        lambda n, group=None, uncached=False: allocated.append(n) or [0, 0]))
    monkeypatch.setattr(CAR, "_init_mnnvl_buffer", lambda self, n: None)
    monkeypatch.setattr(CAR, "__del__", lambda self: None)
    return CAR(group=None, device="meta")


def test_custom_ar_max_size_is_cut_to_the_profiles_largest_custom_size(profiles, follow,
                                                                       monkeypatch):
    """Through vLLM's own constructor and its own size check (``should_custom_ar`` as vLLM
    ships it, not the plugin's per-call rule): sizes above the largest one the profile leaves
    to a custom kernel engines have (``custom_at``: a bucket whose choice no engine has counts
    by its fallback, as a copy-engine choice whose fallback is NCCL) are refused by vLLM
    itself, and its metadata buffer shrinks with max_size (the IPC buffer stays at vLLM's
    reduce-scatter size, 16 MiB)."""
    engine_should = CAR.__dict__["should_custom_ar"]
    allocated = []
    ca = custom_ar_pair(monkeypatch, allocated)
    assert not ca.disabled and ca.max_size == 8 << 20 and allocated[0] == 8 << 20
    follow(profiles["pair"])
    artune.vllm.register()
    p = artune.Profile.load(profiles["pair"])
    top = max(b.up_to_bytes for m in MODES for b in p.bands(2, m)
              if p.custom_at(2, b.up_to_bytes, m))
    assert 0 < top < 8 << 20 and top % 4096 == 0, top
    allocated.clear()
    ca = custom_ar_pair(monkeypatch, allocated)
    assert ca.max_size == top + 16 and allocated == [top + 16, 16 << 20], allocated
    assert engine_should(ca, message(top))
    assert not engine_should(ca, message(top + 4096))


def sequence_parallel(comm, monkeypatch):
    """vLLM's sequence-parallel all-gather and reduce-scatter
    (vllm/models/common/ops/sequence_parallel.py) on ``comm``: the communicator's custom
    collective first, the TP group's own (which ends in ``comm.all_gather`` /
    ``comm.reduce_scatter``) where that declines."""
    import types

    from vllm.models.common.ops import sequence_parallel as sp

    monkeypatch.setattr(sp, "get_tp_group",
                        lambda: types.SimpleNamespace(device_communicator=comm))
    monkeypatch.setattr(sp, "get_tensor_model_parallel_world_size", lambda: comm.world_size)
    monkeypatch.setattr(sp, "tensor_model_parallel_all_gather",
                        lambda x, dim=-1: comm.all_gather(x, dim))
    monkeypatch.setattr(sp, "tensor_model_parallel_reduce_scatter",
                        lambda x, dim=-1: comm.reduce_scatter(x, dim))
    return sp


def collectives(m, monkeypatch, seen, allocated):
    """Builds the TP communicator on ``m`` and runs through vLLM's own dispatch: a 64 KiB
    sequence-parallel all-gather, a 1 MiB reduce-scatter, and an all-reduce per size and
    mode. Returns (what the all-gather and reduce-scatter ran, the all-reduces' paths)."""
    runs = {}
    for mode in MODES:
        seen.clear()
        comm = on_machine(m, mode, monkeypatch, seen, allocated if mode == "graph" else [])
        if mode == "graph":
            sp = sequence_parallel(comm, monkeypatch)
            sp.sp_all_gather(message(64 << 10))
            sp.sp_reduce_scatter(message(1 << 20))
            ag_rs = list(seen)
        for n in SIZES:
            seen.clear()
            comm.all_reduce(message(n))
            runs[(n, mode)] = seen[0]
    return ag_rs, runs


@pytest.mark.parametrize("machine", ["H200 TP8 NVSwitch", "A100 TP8 NVLink"])
def test_nccl_everywhere_keeps_vllms_custom_all_gather_and_reduce_scatter(
        machine, profiles, follow, monkeypatch, caplog):
    """A profile that gives NCCL at every TP8 size: every all-reduce runs NCCL, while vLLM's
    custom all-gather and reduce-scatter (which the profile did not measure) run as without
    artune, on the IPC buffers vLLM allocates as without artune; the start-up line gives
    that memory as the constructor asked for it. ARTUNE_VLLM_CUSTOM_AR=off is the other
    choice: nothing allocated, and those collectives run NCCL."""
    m = next(x for x in MACHINES if x.name == machine)._replace(profile="nv_nccl")
    p = artune.Profile.load(profiles["nv_nccl"])
    assert not any(b.custom for mode in MODES for b in p.bands(8, mode))
    seen, native_mem = [], []
    native_ag_rs, native = collectives(m, monkeypatch, seen, native_mem)
    kind = "multicast" if m.multicast else "custom"
    assert native_ag_rs == [f"{kind} all_gather", f"{kind} reduce_scatter"], native_ag_rs
    assert any(r != "pynccl" for r in native.values()), native

    follow(profiles["nv_nccl"])
    artune.vllm.register()
    mem = []
    with caplog.at_level(logging.DEBUG, logger=log_name):
        ag_rs, runs = collectives(m, monkeypatch, seen, mem)
    assert set(runs.values()) == {"pynccl"}, runs
    assert ag_rs == native_ag_rs and mem == native_mem, (ag_rs, mem)
    line = next(r.getMessage() for r in caplog.records  # the full list, at DEBUG
                if r.name == log_name and r.levelno == logging.DEBUG)
    ipc = sum(n for k, n in mem if k == "ipc")
    assert f"{artune.vllm.mib(ipc)} of IPC buffers per GPU allocated" in line, line
    assert "kept for vLLM's custom all-gather" in line, line
    assert (f"{artune.vllm.mib(sum(n for k, n in mem if k == 'multicast'))} of multicast"
            in line) == m.multicast, line

    unregister()
    monkeypatch.setenv(artune.vllm.ENV_CUSTOM_AR, "off")
    artune.vllm.register()
    mem.clear()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=log_name):
        ag_rs, runs = collectives(m, monkeypatch, seen, mem)
    assert set(runs.values()) == {"pynccl"} and mem == [], (runs, mem)
    assert ag_rs == ["nccl all_gather", "nccl reduce_scatter"], ag_rs
    line = next(r.getMessage() for r in caplog.records  # the full list, at DEBUG
                if r.name == log_name and r.levelno == logging.DEBUG)
    assert "custom AR not built" in line and "no IPC buffers" in line, line


def test_on_a_pcie_pair_nccl_everywhere_frees_custom_ars_buffers(profiles, follow, monkeypatch,
                                                                caplog):
    """Where vLLM runs no custom all-gather or reduce-scatter (PCIe), a profile with NCCL at
    every size leaves custom all-reduce's buffers serving nothing: vLLM's constructor builds
    it, the plugin closes it at once (vLLM's own close(), freeing both IPC buffers), nothing
    changes path, and the line gives the memory freed."""
    m = next(x for x in MACHINES if x.name == "L40S TP2 PCIe")
    p = artune.Profile.load(profiles["pair_nccl"])
    assert not any(b.custom for mode in MODES for b in p.bands(2, mode))
    seen, native_mem = [], []
    native_ag_rs, _ = collectives(m, monkeypatch, seen, native_mem)
    assert native_ag_rs == ["nccl all_gather", "nccl reduce_scatter"], native_ag_rs
    assert [k for k, _ in native_mem] == ["ipc", "ipc"], native_mem
    follow(profiles["pair_nccl"])
    artune.vllm.register()
    mem = []
    with caplog.at_level(logging.DEBUG, logger=log_name):
        ag_rs, runs = collectives(m, monkeypatch, seen, mem)
    assert set(runs.values()) == {"pynccl"}, runs
    assert ag_rs == native_ag_rs, ag_rs
    assert [k for k, _ in mem] == ["ipc", "ipc", "free", "free"], mem
    line = next(r.getMessage() for r in caplog.records  # the full list, at DEBUG
                if r.name == log_name and r.levelno == logging.DEBUG)
    ipc = sum(n for k, n in mem if k == "ipc")
    assert f"custom AR closed as soon as vLLM built it, {artune.vllm.mib(ipc)} of IPC" in line, line


@pytest.mark.skipif(NEWEST, reason="the newest-release CI run: a new release is expected to differ "
                    "from the pinned one; only patch breakage is reported there")
def test_the_engine_model_was_read_against_the_installed_release():
    import vllm

    assert artune._engine.MODEL["vllm"]["read_against"] == vllm.__version__


def test_every_all_reduce_site_is_modelled():
    """Every call site of the installed vLLM that names an all-reduce mechanism is listed
    by a path of engines.json or its dispatch (or lies where no all-reduce is): a release that
    adds a path is seen here as "a new path is unmodelled" (.ci/verdict.py)."""
    import engine_sites

    found = engine_sites.sites("vllm")
    assert any("cuda_communicator.py" in f for f in found), found  # the scan reads vLLM
    missing = engine_sites.unmodelled("vllm")
    assert not missing, "unmodelled all-reduce sites: " + ", ".join(missing)


def test_a_new_communicator_file_or_call_path_reads_as_not_modelled(tmp_path):
    """The scan is per call site: a copy of the installed vLLM's communicators folder
    and of a model file the model lists, with a new communicator file and a new function in
    that model file added, has exactly those two as unmodelled sites, though their folder
    and file are listed."""
    import shutil

    import engine_sites

    src = engine_sites.package_dir("vllm")
    for rel in ("distributed/device_communicators", "models/beam/nvidia/model.py"):
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if os.path.isdir(os.path.join(src, rel)) else shutil.copy)(
            os.path.join(src, rel), dst)
    assert engine_sites.unmodelled("vllm", str(tmp_path)) == []
    (tmp_path / "distributed/device_communicators" / "new_ar.py").write_text(
        "class NewAllReduce:\n    def should_new_allreduce(self, inp):\n        return True\n")
    with open(tmp_path / "models/beam/nvidia/model.py", "a") as f:
        f.write("\n\ndef another_path(x):\n    return flashinfer_allreduce_fusion(x)\n")
    assert sorted(engine_sites.unmodelled("vllm", str(tmp_path))) == [
        "distributed/device_communicators/new_ar.py::NewAllReduce.should_new_allreduce",
        "models/beam/nvidia/model.py::another_path"]


def test_a_message_is_sized_by_its_own_element_size(held_out, follow, monkeypatch):
    """fp32 and fp16 messages through vLLM's dispatch on the held-out H100 TP4 shape (custom
    to 16K in graph, 64K in eager, then NCCL): the gates size a message in bytes of its own
    dtype, so an fp32 message just above the custom band, which counted as two bytes an
    element would fall inside it, runs NCCL."""
    from test_why import MACHINES as SHAPES

    path, tp = held_out["H100 TP4 NVSwitch"]
    m = SHAPES["H100 TP4 NVSwitch"]
    p = artune.Profile.load(path)
    grid = [n << 10 for n in (4, 8, 16, 32, 64, 128, 256)]
    dtypes = [torch.bfloat16, torch.float16, torch.float32]

    def run(n, mode, dtype):
        seen = []
        hidden = 4096 // torch.empty((), dtype=dtype).element_size()  # 4 KiB a token
        on_machine(m, mode, monkeypatch, seen).all_reduce(message(n, hidden, dtype))
        assert len(seen) == 1, seen
        return seen[0]

    native = {(n, mode, d): run(n, mode, d) for n in grid for mode in MODES for d in dtypes}
    follow(path)
    artune.vllm.register()
    halves = 0
    for (n, mode, d), was in native.items():
        nccl = not p.select(tp, n, mode).custom
        assert run(n, mode, d) == ("pynccl" if nccl else was), (n, mode, d, was)
        halves += d == torch.float32 and nccl and was != "pynccl" and p.select(
            tp, n // 2, mode).custom
    assert halves >= 2, halves
