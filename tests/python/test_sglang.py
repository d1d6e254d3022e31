"""artune.sglang against the released SGLang installed beside it, through SGLang's own
dispatch: ``GroupCoordinator.all_reduce`` and ``_resolve_outplace_all_reduce_method`` on a
coordinator holding SGLang's own custom all-reduce (v2 built by its real constructor, whose
``_pick_config`` picks the kernel). Only what needs a GPU is stubbed: the capability, the
process group, v2's symmetric-memory workspace and JIT module, and a tensor that says it is
on CUDA."""

import inspect
import logging
import os
import types

import pytest

pytest.importorskip("sglang", reason="needs the SGLang test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.sglang  # noqa: E402
import torch  # noqa: E402
from sglang.srt.distributed import parallel_state  # noqa: E402
from sglang.srt.distributed.device_communicators import (  # noqa: E402
    custom_all_reduce,
    custom_all_reduce_v2,
)
from sglang.srt.distributed.device_communicators.configs import (  # noqa: E402
    custom_all_reduce_v2 as v2_configs,
)
from sglang.srt.entrypoints.engine import Engine  # noqa: E402

from conftest import NEWEST  # noqa: E402
from machines import MACHINES, MODES, SIZES, message  # noqa: E402

CAR = custom_all_reduce.CustomAllreduce
GET_DEVICE_MODULE = torch.get_device_module
IS_CAPTURING = torch.cuda.is_current_stream_capturing
V2 = custom_all_reduce_v2.CustomAllReduceV2
GC = parallel_state.GroupCoordinator
log_name = "sglang.artune"
PATCHED = [(CAR, "__init__"), (CAR, "should_custom_ar"), (V2, "__init__"),
           (V2, "should_custom_ar"), (GC, "__init__"),
           (GC, "_can_use_flashinfer_allreduce"), (Engine, "_launch_subprocesses")]


def unregister():
    if artune.sglang.applied is not None:
        artune.sglang.applied.undo()
        artune.sglang.applied = None
    if hasattr(CAR, "_artune_patched"):
        delattr(CAR, "_artune_patched")


def current():
    return [c.__dict__[n] for c, n in PATCHED] + [custom_all_reduce_v2.get_all_reduce_config]


@pytest.fixture(autouse=True)
def restore(monkeypatch):
    for k in ("ARTUNE_SGLANG", "SGLANG_ENABLE_DETERMINISTIC_INFERENCE", artune.sglang.ENV_FUSION,
              artune._engine.ENV_SAID):
        monkeypatch.delenv(k, raising=False)
    yield
    unregister()


def on_machine(m, mode, monkeypatch):
    """A TP coordinator as SGLang builds it on machine ``m``: SGLang's own
    ``GroupCoordinator.__init__`` (through the plugin's wrapper when registered) and its own
    ``dispatch_custom_allreduce``, which picks v2 on full NVLink (built by its own
    constructor) and v1 otherwise (its own constructor, whose NVLink probe answers as SGLang's
    does on ``m``: None, with SGLang's warning, on more than two PCIe-only GPUs)."""
    from sglang.srt.distributed.device_communicators import pynccl

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: m.cap)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: mode == "graph")
    for f in (v2_configs._get_all_reduce_configs, v2_configs.get_supported_world_sizes,
              v2_configs.get_all_reduce_config):
        f.cache_clear()
    # v1: SGLang's constructor with its IPC buffers recorded, not allocated.
    v1_pair(monkeypatch, [], build=False)
    monkeypatch.setattr(custom_all_reduce, "can_use_custom_all_reduce_with_nvlink",
                        lambda **k: None if (m.tp > 2 and not m.nvlink) or not m.p2p
                        else m.nvlink)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: m.tp)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(torch.distributed, "new_group", lambda ranks, **k: object())
    monkeypatch.setattr(parallel_state, "_group_coordinator_device",
                        lambda local_rank: torch.device("meta"))
    monkeypatch.setattr(torch, "get_device_module", lambda d=None: torch.cuda)
    monkeypatch.setattr(pynccl, "PyNcclCommunicator", lambda **k: object())
    monkeypatch.setattr(custom_all_reduce, "_is_cuda", True)  # SGLang's CUDA branch
    # v2: full NVLink only; symmetric memory and the JIT module need GPUs.
    monkeypatch.setattr(custom_all_reduce_v2, "can_use_custom_all_reduce_v2",
                        lambda group, device: m.nvlink)
    monkeypatch.setattr(custom_all_reduce_v2, "in_the_same_node_as",
                        lambda group, source_rank=0: [True] * m.tp)
    monkeypatch.setattr(custom_all_reduce_v2, "IPCManager", lambda: None)
    monkeypatch.setattr(custom_all_reduce_v2, "VmmGraphInputManager", lambda **k: None)
    monkeypatch.setattr(custom_all_reduce_v2, "get_all_reduce_module", lambda d, w: "jit")

    def workspace(self):
        # SGLang keeps multicast only where rendezvous gave a multicast pointer.
        self.has_multicast = m.multicast
        if not m.multicast:
            self.config = self.config._replace(num_mc_blocks=None)

    monkeypatch.setattr(V2, "_init_workspace", workspace)
    monkeypatch.setattr(V2, "__del__", lambda self: None)
    gc = GC(group_ranks=[list(range(m.tp))], group_name="tp", local_rank=0,
            torch_distributed_backend="nccl", use_pynccl=True, use_mscclpp=False,
            use_custom_allreduce=True, use_torch_symm_mem_all_reduce=False,
            use_hpu_communicator=False, use_xpu_communicator=False)
    ca = gc.ca_comm
    if isinstance(ca, V2):
        ca._graph_mode_allowed = mode == "graph"
    elif ca is not None:
        ca._IS_CAPTURING = mode == "graph"
    return gc


def dispatch(m, nbytes, mode, monkeypatch, flashinfer_tokens=None, dtype=torch.bfloat16):
    """What SGLang runs: the outplace method its all_reduce picks, and for v2 the kernel.
    ``flashinfer_tokens``: the group is one SGLang tags for FlashInfer's allreduce, whose
    workspace (it needs GPUs) takes messages of up to that many tokens; its kernel records
    "flashinfer". The message is ``nbytes`` bytes of ``dtype``."""
    seen = []
    monkeypatch.setattr(parallel_state, "outplace_all_reduce",
                        lambda x, group_name, outplace_all_reduce_method: seen.append(
                            outplace_all_reduce_method))
    monkeypatch.setattr(parallel_state, "inplace_all_reduce",
                        lambda x, group_name: seen.append("nccl"))
    gc = on_machine(m, mode, monkeypatch)
    if flashinfer_tokens is not None:
        from sglang.srt.layers import flashinfer_comm_fusion

        monkeypatch.setattr(flashinfer_comm_fusion, "can_use_flashinfer_allreduce",
                            lambda x, **k: x.shape[0] <= flashinfer_tokens)
        monkeypatch.setattr(parallel_state, "flashinfer_allreduce",
                            lambda x, group_name: seen.append("flashinfer"))
        gc._fi_workspace_hint = "tp"
    # 4 KiB a token in every dtype, so the smallest size is one whole token.
    hidden = 4096 // torch.empty((), dtype=dtype).element_size()
    gc.all_reduce(message(nbytes, hidden=hidden, dtype=dtype))
    assert len(seen) == 1, seen
    if seen[0] == "ca" and isinstance(gc.ca_comm, V2):
        cfg = gc.ca_comm._pick_config(nbytes, gc.ca_comm._can_use_graph())
        return f"v2 {cfg.algo.algo_name}" + (" multicast" if cfg.use_multicast else "")
    return "v1" if seen[0] == "ca" else seen[0]


V2_KERNEL = ["1shot_push", "1shot_pull", "2shot_pull"]


def nccl_here(p, tp, n, mode):
    """The profile (artune's select) gives NCCL to this message: no peer-to-peer path of
    SGLang may take it, inside v2's limits or not. An island choice no engine has counts as
    its fallback, what SGLang runs without artune's kernels."""
    c = p.select(tp, n, mode)
    return c is not None and (not c.custom or c.fallback.startswith("nccl"))


def expected(p, m, n, mode, was):
    """By the rule: NCCL where the profile says NCCL; inside its custom band SGLang's own
    order, which for v2 runs at the limits artune's plan gives (push, pull, two-shot)."""
    if p.select(m.tp, n, mode) is None:
        return {was}
    if nccl_here(p, m.tp, n, mode):
        return {"nccl"}
    plan = p.sglang_plan(m.tp, mode)
    if plan[0] == "v2":
        band = next((i for i, lim in enumerate(plan[1]) if n <= lim), 3)
        if band == 3:
            return {"nccl"}
        # Inside the two-shot band SGLang's order may run it over multicast.
        return {f"v2 {V2_KERNEL[band]}"} | ({"v2 2shot_pull multicast"} if band == 2 else set())
    return {was}


def test_every_row_runs_what_the_profile_says_through_sglangs_own_dispatch(
        profiles, follow, monkeypatch):
    """5 GPU classes x 4 sizes x 2 modes, one profile registered at a time."""
    changed, native = 0, {}
    for prof in sorted({m.profile for m in MACHINES}):
        machines = [m for m in MACHINES if m.profile == prof]
        for m in machines:
            for n in SIZES:
                for mode in MODES:
                    native[(m.name, n, mode)] = dispatch(m, n, mode, monkeypatch)
        follow(profiles[prof])
        artune.sglang.register()
        p = artune.Profile.load(profiles[prof])
        for m in machines:
            for n in SIZES:
                for mode in MODES:
                    was = native[(m.name, n, mode)]
                    want = expected(p, m, n, mode, was)
                    got = dispatch(m, n, mode, monkeypatch)
                    assert got in want, (m.name, n, mode, was, p.sglang_plan(m.tp, mode))
                    changed += got != was
        unregister()
    assert changed >= 4, changed
    # Without artune, SGLang 0.5.23 on H200 TP8 runs v2 two-shot over multicast from 512 KiB
    # in graph mode and at every size above the one-shot limit in eager mode.
    assert native[("H200 TP8 NVSwitch", 4 << 20, "graph")] == "v2 2shot_pull multicast"
    assert native[("H200 TP8 NVSwitch", 512 << 10, "eager")] == "v2 2shot_pull multicast"
    assert native[("A100 TP8 NVLink", 4 << 10, "graph")] == "v2 1shot_push"
    assert native[("L40S TP2 PCIe", 64 << 10, "graph")] == "v1"


def real_gc(tp, monkeypatch, allocated, name="tp", rank=0):
    """A group coordinator built by SGLang's own ``GroupCoordinator.__init__`` (through the
    plugin's wrapper when registered) on a PCIe box of ``tp`` GPUs: process groups are
    stand-ins, pynccl is a stand-in, and SGLang's own v1 constructor records the IPC buffers
    it asks for in ``allocated`` (``dispatch_custom_allreduce`` answers v1, as on PCIe)."""
    from sglang.srt.distributed.device_communicators import pcie_ipc_ar, pynccl

    v1_pair(monkeypatch, allocated, build=False)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: tp)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(torch.distributed, "new_group", lambda ranks, **k: object())
    monkeypatch.setattr(parallel_state, "_group_coordinator_device",
                        lambda local_rank: torch.device("meta"))
    monkeypatch.setattr(torch, "get_device_module", lambda d=None: torch.cuda)
    monkeypatch.setattr(pynccl, "PyNcclCommunicator", lambda **k: object())
    monkeypatch.setattr(pcie_ipc_ar, "eligible_group", lambda **k: False)
    monkeypatch.setattr(custom_all_reduce, "dispatch_custom_allreduce", lambda **k: CAR)
    return GC(group_ranks=[list(range(tp))], group_name=name, local_rank=0,
              torch_distributed_backend="nccl", use_pynccl=True, use_mscclpp=False,
              use_custom_allreduce=True, use_torch_symm_mem_all_reduce=False,
              use_hpu_communicator=False, use_xpu_communicator=False)


@pytest.mark.parametrize("group", ["tp", "attention_tp"])
def test_a_profile_that_gives_nccl_everything_builds_no_custom_all_reduce(
        group, profiles, follow, monkeypatch, caplog):
    """A PCIe pair's TP group and attention-TP group (SGLang names it "attention_tp",
    parallel_state.py), each built by SGLang's own constructor: without artune it builds v1
    and its IPC buffers; with a profile that gives NCCL at every size SGLang is told not to
    build one (no buffers, no 'Setup Custom allreduce failed'), and one line says what runs.
    A group that is not TP keeps SGLang's choice."""
    allocated = []
    assert real_gc(2, monkeypatch, allocated, group).ca_comm is not None and allocated
    follow(profiles["pair_nccl"])
    artune.sglang.register()
    allocated.clear()
    with caplog.at_level(logging.INFO), caplog.at_level(logging.DEBUG, logger=log_name):
        gc = real_gc(2, monkeypatch, allocated, group)
    assert gc.ca_comm is None and allocated == [], allocated
    lines = [r.getMessage() for r in caplog.records
             if r.name == log_name and r.levelno >= logging.INFO]
    assert len(lines) == 1 and f"TP2 group {group}" in lines[0], lines
    # What SGLang built is in the full list, at DEBUG.
    full = [r.getMessage() for r in caplog.records
            if r.name == log_name and r.levelno == logging.DEBUG and "follows" in r.getMessage()]
    assert len(full) == 1 and "not built" in full[0], full
    assert "failed" not in caplog.text
    assert real_gc(2, monkeypatch, allocated, "pp").ca_comm is not None


def test_deterministic_inference_and_the_off_switch_leave_sglang_alone(profiles, follow,
                                                                       monkeypatch, caplog):
    before = current()
    follow(profiles["nvswitch"])
    for var, val in (("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "1"), ("ARTUNE_SGLANG", "0")):
        monkeypatch.setenv(var, val)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=log_name):
            artune.sglang.register()
        assert current() == before
        assert len(caplog.records) == 1, caplog.text
        monkeypatch.delenv(var)


def test_no_profile_or_a_bad_one_leaves_sglang_as_it_was(follow, monkeypatch, tmp_path,
                                                          caplog):
    before = current()
    monkeypatch.delenv("ARTUNE_PROFILE", raising=False)
    artune.sglang.register()
    assert current() == before
    bad = tmp_path / "truncated.json"
    bad.write_text('{"schema_version": 1')
    follow(str(bad))
    with caplog.at_level(logging.WARNING, logger=log_name):
        artune.sglang.register()
    assert current() == before
    assert len(caplog.records) == 1 and "truncated.json" in caplog.text
    assert "NCCL_TUNER_PLUGIN" not in os.environ


def test_every_patch_point_is_as_read(profiles, follow):
    follow(profiles["nvswitch"])
    artune.sglang.register()
    # ROCm-only quick AR imports here too; MSCCL++ may not: each is said, none is guessed.
    assert not [s for s in artune.sglang.applied.skipped
                if not s.startswith(("mscclpp", "quick_ar"))], artune.sglang.applied.skipped
    assert {"custom_v2", "custom_v2 gate", "custom_v1", "flashinfer", "pcie_ipc",
            "torch_symm_mem"} <= set(artune.sglang.applied.applied)



def test_the_engine_model_holds_sglangs_own_multicast_table():
    """python/artune/engines.json (read by the plugin and by `artune why`) against the
    installed SGLang's tuned configs."""
    import math

    m = artune._engine.MODEL["sglang"]
    import sglang

    for arch, configs in (("9.0", v2_configs._sm90_configs), ("10.0", v2_configs._sm100_configs),
                          ("10.7", v2_configs._sm107_configs)):
        want = {}
        for ws, c in configs(132).items():
            if c.num_mc_blocks is None:
                continue
            e = {mode: (None if getattr(c, mode).mc.max_bytes == 0 else
                        [math.ceil(getattr(c, mode).mc.min_bytes),
                         math.ceil(getattr(c, mode).mc.max_bytes)]) for mode in MODES}
            if e["graph"] or e["eager"]:
                want[str(ws)] = e
        assert m["v2_multicast"][arch] == want, arch
    assert custom_all_reduce_v2._DEFAULT_MAX_SIZE == m["v2_workspace_bytes"]


def test_flashinfer_standalone_gives_nccl_sizes_back(profiles, follow, monkeypatch):
    """A group tagged for FlashInfer's allreduce (fusion on): SGLang's all_reduce tries it
    before its custom all-reduce. FlashInfer's workspace needs GPUs, so its availability
    check answers yes; SGLang's own _can_use_flashinfer_allreduce and order decide the rest."""
    from sglang.srt.layers import flashinfer_comm_fusion

    monkeypatch.setattr(flashinfer_comm_fusion, "can_use_flashinfer_allreduce",
                        lambda x, **k: True)
    b200 = next(m for m in MACHINES if m.name.startswith("B200"))

    def run(n, mode):
        seen = []
        monkeypatch.setattr(parallel_state, "flashinfer_allreduce",
                            lambda x, group_name: seen.append("flashinfer"))
        monkeypatch.setattr(parallel_state, "outplace_all_reduce",
                            lambda x, group_name, outplace_all_reduce_method: seen.append(
                                outplace_all_reduce_method))
        monkeypatch.setattr(parallel_state, "inplace_all_reduce",
                            lambda x, group_name: seen.append("nccl"))
        gc = on_machine(b200, mode, monkeypatch)
        gc._fi_workspace_hint = "tp"
        gc.all_reduce(message(n))
        return seen

    assert all(run(n, mode) == ["flashinfer"] for n in SIZES for mode in MODES)
    follow(profiles[b200.profile])
    artune.sglang.register()
    p = artune.Profile.load(profiles[b200.profile])
    for n in SIZES:
        for mode in MODES:
            assert not p.select(8, n, mode).custom
            assert run(n, mode) == ["nccl"], (n, mode)


def test_the_v2_workspace_is_the_profiles_in_an_engine_style_start(profiles, follow,
                                                                  monkeypatch):
    """As with ``sglang.Engine(...)``: SGLang is imported before the plugin loads and nothing
    sets SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB. SGLang's own v2 constructor sizes its
    workspaces from the config the plugin patched, so it allocates what the profile's limits
    need. The nvswitch profile's custom band reaches 48 MiB at TP8, but the plan keeps v2 in
    SGLang's 16 MiB default workspace and gives larger sizes to NCCL."""
    monkeypatch.delenv("SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB", raising=False)
    align = custom_all_reduce_v2._ALIGN_BYTES
    h200 = {tp: MACHINES[0]._replace(name=f"H200 TP{tp}", tp=tp, profile="nvswitch")
            for tp in (2, 8)}
    native = {tp: on_machine(m, "graph", monkeypatch).ca_comm for tp, m in h200.items()}
    follow(profiles["nvswitch"])
    artune.sglang.register()
    p = artune.Profile.load(profiles["nvswitch"])
    followed = {}
    for tp, m in h200.items():
        lims = [p.sglang_plan(tp, mode)[1] for mode in MODES]
        ca = on_machine(m, "graph", monkeypatch).ca_comm
        want_pull = -(-max(lim[2] for lim in lims) // align) * align
        # SGLang keeps at least one aligned push slot even where no size is pushed.
        want_push = -(-max(max(lim[0] for lim in lims), align) // align) * align
        assert (ca.max_pull_size, ca.max_push_size) == (want_pull, want_push), tp
        followed[tp] = (ca.max_pull_size, ca.max_push_size)
    # The profile's workspaces differ from SGLang's own at some TP size, so the comparison
    # above is not one the unpatched constructor passes by coincidence.
    assert (native[2].max_pull_size, native[2].max_push_size) == (16 << 20, 16 << 20)
    assert any(followed[tp] != (native[tp].max_pull_size, native[tp].max_push_size)
               for tp in h200), (followed, native)
    # The plan never grows v2 past SGLang's 16 MiB default: 32 MiB goes to NCCL.
    assert all(max(f) <= 16 << 20 for f in followed.values()), followed
    for mode in MODES:
        assert dispatch(h200[8], 32 << 20, mode, monkeypatch) == "nccl", mode


def v1_pair(monkeypatch, allocated, build=True):
    """SGLang's own v1 constructor on a PCIe pair; the IPC buffers it asks for are recorded
    instead of allocated."""
    from sglang.srt.distributed.device_communicators import custom_all_reduce_ops as ops

    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(ops, "IS_CUSTOM_AR_AVAILABLE", True)
    monkeypatch.setattr(ops, "meta_size", lambda: 0, raising=False)
    monkeypatch.setattr(ops, "init_custom_ar", lambda *a: 1, raising=False)
    monkeypatch.setattr(ops, "register_buffer", lambda *a: None, raising=False)
    monkeypatch.setattr(custom_all_reduce, "can_use_custom_all_reduce_with_nvlink",
                        lambda **k: False)
    monkeypatch.setattr(CAR, "create_shared_buffer",
                        staticmethod(lambda n, group=None: allocated.append(n) or [0, 0]))
    monkeypatch.setattr(CAR, "__del__", lambda self: None)
    return CAR(group=None, device="meta") if build else None


def test_v1_max_size_is_cut_to_the_profiles_largest_custom_size(profiles, follow,
                                                                monkeypatch):
    """Through SGLang's own v1 constructor and its own size check (``should_custom_ar`` as
    SGLang ships it, not the plugin's per-call gate): sizes above the profile's largest custom
    size are refused by SGLang itself, and their IPC buffers are never allocated."""
    engine_should = CAR.__dict__["should_custom_ar"]
    allocated = []
    ca = v1_pair(monkeypatch, allocated)
    assert ca.max_size == 8 << 20 and allocated == [8 << 20, 8 << 20]
    follow(profiles["pair"])
    artune.sglang.register()
    # The largest custom size of either mode: v1's buffers serve eager and graph calls alike.
    prof = artune.Profile.load(profiles["pair"])
    setup = prof.sglang_setup(2)
    assert setup[0] == "v1" and setup[1], setup
    top = setup[2]
    assert 0 < top < 8 << 20 and top % 4096 == 0, top
    for mode in ("eager", "graph"):
        plan = prof.sglang_plan(2, mode)
        assert plan[0] == "v1" and plan[1][1] <= top, (mode, plan, top)
    allocated.clear()
    ca = v1_pair(monkeypatch, allocated)
    assert ca.max_size == top and allocated == [top, top]
    assert engine_should(ca, message(top))
    assert not engine_should(ca, message(top + 4096))


def test_an_unread_release_is_said_once_and_only_verified_patches_apply(
        profiles, follow, monkeypatch, caplog):
    """A faked SGLang version, and one patch point whose signature changed in it: one line
    names both versions; the changed one is left alone and named; the rest apply."""
    import sglang

    monkeypatch.setattr(sglang, "__version__", "0.9.0")

    def changed(self, input_, extra):
        return True

    monkeypatch.setattr(GC, "_can_use_flashinfer_allreduce", changed)
    follow(profiles["nvswitch"])
    with caplog.at_level(logging.INFO, logger=log_name):
        artune.sglang.register()
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    read = artune._engine.MODEL["sglang"]["read_against"]
    assert len(lines) == 1 and "0.9.0" in lines[0] and read in lines[0], lines
    assert GC.__dict__["_can_use_flashinfer_allreduce"] is changed
    applied = artune.sglang.applied
    assert "flashinfer" not in applied.applied
    assert any(s.startswith("flashinfer (") for s in applied.skipped), applied.skipped
    assert {"custom_v2", "custom_v1", "pcie_ipc", "torch_symm_mem"} <= set(applied.applied)


def fake_ray(monkeypatch):
    """Just enough of Ray for SGLang's Ray launch modules to import here (Ray is an extra
    of SGLang's, not installed): ``ray.remote`` leaves the actor class as SGLang wrote it."""
    import importlib
    import sys

    ray = types.ModuleType("ray")
    ray.remote = lambda cls=None, **k: cls if cls is not None else (lambda c: c)
    util = types.ModuleType("ray.util")
    pg = types.ModuleType("ray.util.placement_group")
    pg.PlacementGroup = object
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.PlacementGroupSchedulingStrategy = object
    ray.util, util.placement_group, util.scheduling_strategies = util, pg, strategies
    for mod in (ray, util, pg, strategies):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    for name in ("sglang.srt.ray.engine", "sglang.srt.ray.scheduler_actor"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("sglang.srt.ray.engine")


def test_a_ray_launch_is_said_to_leave_the_schedulers_without_artune(profiles, follow,
                                                                     monkeypatch, caplog):
    """SGLang's Ray scheduler actor builds its Scheduler without load_plugins(), unlike the
    forked scheduler process, so no ARTUNE_* setting could make the plugin run there; the
    driver's plugin says so when SGLang launches through Ray (RayEngine, or --use-ray), and
    says nothing otherwise. SGLang's launch itself (which needs GPUs) is a recording stand-in
    with its signature, so the plugin's wrapper binds as on the real one."""
    from sglang.srt.entrypoints import engine as engine_mod
    from sglang.srt.managers.scheduler import run_scheduler_process

    ray_engine = fake_ray(monkeypatch)
    from sglang.srt.ray.scheduler_actor import SchedulerActor

    assert "load_plugins()" in inspect.getsource(run_scheduler_process)
    assert "load_plugins" not in inspect.getsource(SchedulerActor)
    launched = []
    real = inspect.getattr_static(engine_mod.Engine, "_launch_subprocesses").__func__

    def launch(cls, server_args, init_tokenizer_manager_func, run_scheduler_process_func,
               run_detokenizer_process_func, port_args=None, placement_group=None):
        launched.append(cls.__name__)

    assert list(inspect.signature(launch).parameters) == list(
        inspect.signature(real).parameters)
    monkeypatch.setattr(engine_mod.Engine, "_launch_subprocesses", classmethod(launch))
    follow(profiles["nvswitch"])
    artune.sglang.register()
    for cls, use_ray in ((ray_engine.RayEngine, False), (engine_mod.Engine, True),
                         (engine_mod.Engine, False)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=log_name):
            cls._launch_subprocesses(types.SimpleNamespace(use_ray=use_ray), None, None, None)
        lines = [r.getMessage() for r in caplog.records if r.name == log_name]
        if cls is engine_mod.Engine and not use_ray:
            assert lines == [], lines
        else:
            assert len(lines) == 1 and "Ray actors" in lines[0], lines
            assert "cannot apply " + profiles["nvswitch"] in lines[0], lines
    assert launched == ["RayEngine", "Engine", "Engine"]


def test_a_failure_inside_the_constructor_wrapper_falls_back_to_sglangs_call(
        profiles, follow, monkeypatch, caplog):
    """Any failure of artune's own logic in GroupCoordinator's wrapper: SGLang's constructor
    runs with the caller's arguments (so it builds its custom all-reduce), one warning."""
    follow(profiles["pair_nccl"])
    artune.sglang.register()
    monkeypatch.setattr(artune.sglang, "_deterministic", lambda: 1 / 0)
    with caplog.at_level(logging.WARNING, logger=log_name):
        gc = real_gc(2, monkeypatch, [], "tp")
    assert gc.ca_comm is not None
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(lines) == 1 and "GroupCoordinator.__init__ failed inside artune" in lines[0]


def test_a_renamed_constructor_parameter_leaves_sglangs_constructor_alone(
        profiles, follow, monkeypatch, caplog):
    real = GC.__init__

    def renamed(self, group_ranks, local_rank, torch_distributed_backend, use_pynccl,
                use_mscclpp, use_ca, **k):
        real(self, group_ranks, local_rank, torch_distributed_backend, use_pynccl,
             use_mscclpp, use_ca, **k)

    monkeypatch.setattr(GC, "__init__", renamed)
    follow(profiles["pair_nccl"])
    with caplog.at_level(logging.WARNING, logger=log_name):
        artune.sglang.register()
    assert GC.__dict__["__init__"] is renamed
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert sum("GroupCoordinator.__init__" in x for x in lines) == 1, lines


def test_the_startup_line_is_printed_once_per_group_by_its_rank_0(profiles, follow,
                                                                  monkeypatch, caplog):
    follow(profiles["pair_nccl"])
    artune.sglang.register()
    for rank in (0, 1):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=log_name):
            gc = real_gc(2, monkeypatch, [], "tp", rank=rank)
        assert gc.rank_in_group == rank and gc.ca_comm is None
        lines = [r.getMessage() for r in caplog.records if r.name == log_name]
        assert len(lines) == (rank == 0), (rank, lines)


@pytest.mark.skipif(NEWEST, reason="the newest-release CI run: a new release is expected to differ "
                    "from the pinned one; only patch breakage is reported there")
def test_the_engine_model_was_read_against_the_installed_release():
    import sglang

    assert artune._engine.MODEL["sglang"]["read_against"] == sglang.__version__


def fused_norm(tp, nbytes, monkeypatch, dtype=torch.bfloat16):
    """What a layer's norm runs (sglang/srt/layers/layernorm.py
    ``_forward_with_allreduce_fusion``, SGLang's own code, with the fusion on): FlashInfer's
    fused allreduce+RMSNorm where ``flashinfer_allreduce_residual_rmsnorm`` takes it, else the
    attention-TP all-reduce. That op runs only on CUDA tensors, so the kernel behind it is a
    recording stand-in with its signature, installed before the plugin registers (see
    ``fused_standin``)."""
    import sglang.srt.distributed as dist_mod
    from sglang.srt.layers import flashinfer_comm_fusion as fc
    from sglang.srt.layers import layernorm

    monkeypatch.setattr(fc, "resolve_fusion_world_size", lambda use_attn_tp_group: tp)
    monkeypatch.setattr(layernorm, "get_parallel",
                        lambda: types.SimpleNamespace(attn_tp_size=tp))
    monkeypatch.setattr(dist_mod, "attention_tensor_model_parallel_all_reduce",
                        lambda x: FUSED.append("all_reduce") or x)
    norm = types.SimpleNamespace(variance_epsilon=1e-6, forward=lambda x, r, p: (x, r))
    x = message(nbytes, hidden=2048 // torch.empty((), dtype=dtype).element_size(),
                dtype=dtype)  # 2 KiB a token
    FUSED.clear()
    layernorm._forward_with_allreduce_fusion(norm, x, x, None, x, use_attn_tp_group=True)
    assert len(FUSED) == 1, FUSED
    return FUSED[0]


FUSED = []


def fused_standin(input_tensor, residual, weight, eps=1e-6, max_token_num=2048,
                  use_oneshot=None, trigger_completion_at_end=False, fp32_acc=True,
                  use_attn_tp_group=True):
    FUSED.append("flashinfer fused")
    return input_tensor, residual


def test_flashinfer_fusion_fuses_only_inside_the_profiles_custom_prefix(
        profiles, follow, monkeypatch, caplog):
    """SGLang's FlashInfer allreduce+RMSNorm fusion, governed by default (ENGINE-PATHS.md):
    fused up to the profile's custom prefix, the group's all-reduce above; none where the
    profile starts with NCCL; ARTUNE_SGLANG_FUSION=engine leaves SGLang's own choice."""
    from sglang.srt.layers import flashinfer_comm_fusion as fc

    real = fc.flashinfer_allreduce_residual_rmsnorm
    assert list(inspect.signature(fused_standin).parameters) == list(
        inspect.signature(real).parameters)
    monkeypatch.setattr(fc, "flashinfer_allreduce_residual_rmsnorm", fused_standin)
    top = artune._engine.Bands(artune.Profile.load(profiles["nv_prefix"])).custom_prefix(8)
    assert 4 << 10 <= top < 2 << 20, top  # the simulator must still give such a prefix
    top -= top % (2 << 10)
    sizes = [2 << 10, top, top + (2 << 10), 2 << 20]
    native = {n: fused_norm(8, n, monkeypatch) for n in sizes}
    assert set(native.values()) == {"flashinfer fused"}, native
    for prof, cut in (("nv_prefix", top), ("nv_nccl", 0)):
        follow(profiles[prof])
        artune.sglang.register()
        got = {n: fused_norm(8, n, monkeypatch) for n in sizes}
        assert got == {n: "flashinfer fused" if n <= cut else "all_reduce" for n in sizes}, (
            prof, cut, got)
        unregister()
    monkeypatch.setenv(artune.sglang.ENV_FUSION, "engine")
    artune.sglang.register()
    assert "flashinfer_fusion" not in artune.sglang.applied.applied
    assert {n: fused_norm(8, n, monkeypatch) for n in sizes} == native


def test_the_fusion_auto_list_is_sglangs():
    """engines.json's flashinfer_fusion_auto against the installed SGLang's own
    _FLASHINFER_ALLREDUCE_FUSION_ARCHS, and the MiMo (cutedsl) architectures against the
    tuple its auto-enable reads them from, so neither can go stale silently."""
    import ast

    import engine_sites
    from sglang.srt.arg_groups import overrides

    m = artune._engine.MODEL["sglang"]
    assert sorted(overrides._FLASHINFER_ALLREDUCE_FUSION_ARCHS) == m["flashinfer_fusion_auto"]
    src = inspect.getsource(overrides._flashinfer_allreduce_fusion_auto_enable)
    mimo = next(n for n in ast.walk(engine_sites.parse(src))
                if isinstance(n, ast.Compare) and isinstance(n.left, ast.Name)
                and n.left.id == "model_arch" and isinstance(n.comparators[0], ast.Tuple))
    assert sorted(ast.literal_eval(mimo.comparators[0])) == m["flashinfer_fusion_auto_cutedsl"]


def test_a_failure_inside_the_v1_wrapper_falls_back_to_sglangs_call(profiles, follow,
                                                                    monkeypatch, caplog):
    follow(profiles["pair"])
    artune.sglang.register()

    def broken(n):
        raise KeyError("max_size")

    monkeypatch.setattr(artune._engine, "round_up16", broken)
    allocated = []
    with caplog.at_level(logging.WARNING, logger=log_name):
        ca = v1_pair(monkeypatch, allocated)
    assert ca.max_size == 8 << 20 and allocated == [8 << 20, 8 << 20]
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(lines) == 1 and "CustomAllreduce.__init__ failed inside artune" in lines[0]


def test_every_all_reduce_site_is_modelled():
    """Every call site of the installed SGLang that names an all-reduce mechanism is listed
    by a path of engines.json or its dispatch (or lies where no all-reduce is): a release that
    adds a path is seen here as "a new path is unmodelled" (.ci/verdict.py)."""
    import engine_sites

    found = engine_sites.sites("sglang")
    assert any("parallel_state.py" in f for f in found), found  # the scan reads SGLang
    missing = engine_sites.unmodelled("sglang")
    assert not missing, "unmodelled all-reduce sites: " + ", ".join(missing)


def test_no_construction_path_raises_with_the_plugin_what_it_does_not_raise_without(
        profiles, held_out, follow, monkeypatch):
    """The general guard: every SGLang construction path these tests can drive (the TP and
    attention-TP coordinators on each machine and mode, v1 on a PCIe pair, and Qwen4-exp's
    own push plane built from the TP group's v2 by its own code) ends the same way without
    the plugin and with each profile applied: built, or the same exception."""
    from sglang.srt.layers.moe import qwen4_decode

    h200_tp4 = MACHINES[0]._replace(name="H200 TP4", tp=4)
    paths = [(f"GroupCoordinator on {m.name} ({mode})",
              lambda m=m, mode=mode: on_machine(m, mode, monkeypatch))
             for m in MACHINES + [h200_tp4] for mode in MODES]
    paths += [(f"GroupCoordinator {g} on a PCIe pair",
               lambda g=g: real_gc(2, monkeypatch, [], g)) for g in ("tp", "attention_tp", "pp")]
    paths.append(("v1 on a PCIe pair", lambda: v1_pair(monkeypatch, [])))
    paths.append(("Qwen4-exp's decode push plane",
                  lambda: qwen4_decode._get_decode_comm.__wrapped__(
                      on_machine(h200_tp4, "graph", monkeypatch).ca_comm)))

    def outcome(call):
        try:
            call()
            return "built"
        except Exception as e:  # noqa: BLE001 - the outcome compared is what it raises
            return f"{type(e).__name__}: {e}"

    native = {name: outcome(call) for name, call in paths}
    assert list(native.values()).count("built") == len(paths), native
    every = dict(profiles, **{k: v[0] for k, v in held_out.items()})
    for prof, path in sorted(every.items()):
        follow(path)
        artune.sglang.register()
        for name, call in paths:
            assert outcome(call) == native[name], (prof, name)
        unregister()


def h100_tp4(held_out):
    """The held-out H100 TP4 shape (custom to 16K in graph, 64K in eager, NCCL, custom again
    from 512K to 1M) and the machine it describes."""
    from test_why import MACHINES as SHAPES

    path, tp = held_out["H100 TP4 NVSwitch"]
    return artune.Profile.load(path), path, SHAPES["H100 TP4 NVSwitch"]


GRID = [n << 10 for n in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)]


def test_v2_runs_nccl_where_the_profile_says_nccl_inside_its_limits(held_out, follow,
                                                                     monkeypatch, caplog):
    """v2's limits are bands (push, pull, two-shot, NCCL by size); a profile whose choice
    goes custom, NCCL, custom is covered by limits that take the NCCL sizes between. Per
    call, v2 (SGLang's own should_custom_ar and _pick_config) must still leave those sizes
    to NCCL, as the profile's select says, not as the plugin's plan says."""
    p, path, m = h100_tp4(held_out)
    follow(path)
    artune.sglang.register()
    # The start-up list says so: v2's limits are not the whole of what runs.
    with caplog.at_level(logging.DEBUG, logger=log_name):
        on_machine(m, "graph", monkeypatch)
    full = [r.getMessage() for r in caplog.records
            if r.name == log_name and r.levelno == logging.DEBUG and "follows" in r.getMessage()]
    assert len(full) == 1 and ", gated per call (a size inside them the profile gives NCCL " \
        "runs NCCL;" in full[0], full
    inside = 0
    for n in GRID:
        for mode in MODES:
            got = dispatch(m, n, mode, monkeypatch)
            if nccl_here(p, m.tp, n, mode):
                assert got == "nccl", (n, mode, got, p.sglang_plan(m.tp, mode))
                inside += n <= p.sglang_plan(m.tp, mode)[1][2]
            else:
                assert got.startswith("v2 "), (n, mode, got)
    # The plan's limits do cover NCCL sizes, so the limits alone would run v2 there.
    assert inside >= 2, inside


DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def test_a_message_is_sized_by_its_own_element_size(held_out, follow, monkeypatch):
    """fp32 and fp16 messages through SGLang's dispatch: the gates size a message in bytes of
    its own dtype. The shape's NCCL band starts just above its custom band, so an fp32
    message sized as if its elements were 2 bytes would land in the custom band."""
    p, path, m = h100_tp4(held_out)
    follow(path)
    artune.sglang.register()
    halves = 0
    for dtype in DTYPES:
        for n in GRID:
            for mode in MODES:
                got = dispatch(m, n, mode, monkeypatch, dtype=dtype)
                want = "nccl" if nccl_here(p, m.tp, n, mode) else "v2"
                assert got.startswith(want), (dtype, n, mode, got)
                halves += (dtype == torch.float32 and want == "nccl"
                           and not nccl_here(p, m.tp, n // 2, mode))
    assert halves >= 2, halves


def test_v2_runs_the_kernel_the_profile_chose_below_each_of_its_three_limits(
        profiles, follow, monkeypatch):
    """A profile whose one-stage push, one-stage pull and two-stage pull bands all differ
    (every other fixture gives two of v2's limits the same value): through SGLang's own
    _pick_config each size runs the kernel of the profile's choice, so the plugin cannot
    swap one limit for another unseen."""
    m = next(x for x in MACHINES if x.name.startswith("A100"))._replace(profile="v2_steps")
    follow(profiles["v2_steps"])
    artune.sglang.register()
    p = artune.Profile.load(profiles["v2_steps"])
    for mode in MODES:
        lims = p.sglang_plan(m.tp, mode)[1]
        assert lims[0] < lims[1] < lims[2], (mode, lims)
    kernel = {"one_stage_push": "v2 1shot_push", "one_stage_pull": "v2 1shot_pull",
              "two_stage_pull": "v2 2shot_pull"}
    seen = set()
    for n in GRID + [4 << 20]:
        for mode in MODES:
            c = p.select(m.tp, n, mode)
            want = "nccl" if not c.custom else kernel[c.backend]
            got = dispatch(m, n, mode, monkeypatch)
            assert got == want, (n, mode, got, c.backend)
            seen.add(got)
    assert seen == set(kernel.values()) | {"nccl"}, seen


def test_the_fused_norm_sizes_an_fp32_message_by_its_bytes(profiles, follow, monkeypatch):
    """SGLang's fused allreduce+RMSNorm on fp32 and fp16 hidden states: the cut is in bytes
    of the message's own dtype, so an fp32 message just above the profile's custom prefix
    (which holds half as many bytes as two-byte elements would count) is declined."""
    from sglang.srt.layers import flashinfer_comm_fusion as fc

    monkeypatch.setattr(fc, "flashinfer_allreduce_residual_rmsnorm", fused_standin)
    top = artune._engine.Bands(artune.Profile.load(profiles["nv_prefix"])).custom_prefix(8)
    top -= top % (8 << 10)
    assert top >= 8 << 10, top
    follow(profiles["nv_prefix"])
    artune.sglang.register()
    for dtype in DTYPES:
        for n in (top, top + (8 << 10), 2 * top):
            got = fused_norm(8, n, monkeypatch, dtype)
            assert got == ("flashinfer fused" if n <= top else "all_reduce"), (dtype, n, got)


def test_sglangs_traced_all_reduce_is_decided_from_plain_data(held_out, follow, monkeypatch):
    """Under torch.compile (``--enable-torch-compile``) SGLang's ``all_reduce`` asks its
    FlashInfer check inside the trace and leaves everything else to its ``outplace_all_reduce``
    op (method "auto", resolved when the graph runs). With the plugin loaded the whole call
    must still trace under fullgraph=True: nothing in it may call the extension (Dynamo
    cannot trace a pyo3 method) or read the CUDA capture state (which the traced graph does
    not keep). The traced decision is the profile's in either mode: FlashInfer only where
    both modes give a custom kernel. The group is in eager mode, so a gate that read the
    mode would let FlashInfer take the sizes where only eager is custom."""
    from sglang.srt.layers import flashinfer_comm_fusion

    p, path, m = h100_tp4(held_out)
    seen = []
    monkeypatch.setattr(flashinfer_comm_fusion, "can_use_flashinfer_allreduce",
                        lambda x, **k: True)
    monkeypatch.setattr(parallel_state, "flashinfer_allreduce",
                        lambda x, group_name: seen.append("flashinfer") or x)
    monkeypatch.setattr(parallel_state, "outplace_all_reduce",
                        lambda x, group_name, outplace_all_reduce_method: seen.append(
                            outplace_all_reduce_method) or x)
    follow(path)
    artune.sglang.register()
    gc = on_machine(m, "eager", monkeypatch)
    gc._fi_workspace_hint = "tp"
    # Built; Dynamo needs torch's own get_device_module (the build's stand-in lacks its
    # __wrapped__) and the real capture query, which it would record into the graph.
    monkeypatch.setattr(torch, "get_device_module", GET_DEVICE_MODULE)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", IS_CAPTURING)
    wants = set()
    for n in GRID:
        torch._dynamo.reset()
        traced = torch.compile(gc.all_reduce, fullgraph=True, backend="eager", dynamic=False)
        seen.clear()
        traced(torch.empty((n // 4096, 2048), dtype=torch.bfloat16, device="meta"))
        want = "auto" if any(nccl_here(p, m.tp, n, mode) for mode in MODES) else "flashinfer"
        assert seen == [want], (n, seen)
        wants.add((want, nccl_here(p, m.tp, n, "eager")))
    # FlashInfer and SGLang's op both traced; a size where eager alone is custom among them.
    assert wants == {("flashinfer", False), ("auto", True), ("auto", False)}, wants


def test_sglangs_traced_fused_norm_is_decided_from_plain_data(profiles, follow, monkeypatch):
    """SGLang's fused allreduce+RMSNorm traced with fullgraph=True with the plugin's cut in
    it: fused up to the profile's custom prefix, the group's all-reduce above."""
    from sglang.srt.layers import flashinfer_comm_fusion as fc
    from sglang.srt.layers import layernorm

    monkeypatch.setattr(fc, "flashinfer_allreduce_residual_rmsnorm", fused_standin)
    top = artune._engine.Bands(artune.Profile.load(profiles["nv_prefix"])).custom_prefix(8)
    top -= top % (2 << 10)
    follow(profiles["nv_prefix"])
    artune.sglang.register()
    for n in (top, top + (2 << 10)):
        fused_norm(8, n, monkeypatch)  # the stand-ins, installed
        monkeypatch.setattr(torch, "get_device_module", GET_DEVICE_MODULE)
        parallel = types.SimpleNamespace(attn_tp_size=8)  # Dynamo builds no namespace
        monkeypatch.setattr(layernorm, "get_parallel", lambda: parallel)
        norm = types.SimpleNamespace(variance_epsilon=1e-6, forward=lambda x, r, p: (x, r))
        torch._dynamo.reset()
        traced = torch.compile(
            lambda x: layernorm._forward_with_allreduce_fusion(norm, x, x, None, x, True),
            fullgraph=True, backend="eager", dynamic=False)
        FUSED.clear()
        traced(torch.empty((n // 2048, 1024), dtype=torch.bfloat16, device="meta"))
        assert FUSED == ["flashinfer fused" if n <= top else "all_reduce"], (n, FUSED)


def test_a_new_communicator_file_or_call_path_reads_as_not_modelled(tmp_path):
    """The scan is per call site: a copy of the installed SGLang's communicators folder
    and of a model file the model lists, with a new communicator file and a new function in
    that model file added, has exactly those two as unmodelled sites, though their folder
    and file are listed."""
    import shutil

    import engine_sites

    src = engine_sites.package_dir("sglang")
    for rel in ("srt/distributed/device_communicators", "srt/models/beam.py"):
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if os.path.isdir(os.path.join(src, rel)) else shutil.copy)(
            os.path.join(src, rel), dst)
    assert engine_sites.unmodelled("sglang", str(tmp_path)) == []
    (tmp_path / "srt/distributed/device_communicators" / "new_ar.py").write_text(
        "class NewAllReduce:\n    def should_new_allreduce(self, inp):\n        return True\n")
    with open(tmp_path / "srt/models/beam.py", "a") as f:
        f.write("\n\ndef another_path(x):\n    return flashinfer_allreduce_fusion(x)\n")
    assert sorted(engine_sites.unmodelled("sglang", str(tmp_path))) == [
        "srt/distributed/device_communicators/new_ar.py::NewAllReduce.should_new_allreduce",
        "srt/models/beam.py::another_path"]


def test_the_plain_data_answers_as_the_profile_does(profiles, held_out):
    """Decided (the plugin's start-up copy of the rule) against the extension's own
    ``custom_at`` and ``fused_up_to`` on every fixture, at, around and between every bound."""
    every = dict(profiles, **{k: v[0] for k, v in held_out.items()})
    for name, path in sorted(every.items()):
        p = artune.Profile.load(path)
        d = artune.sglang.Decided(p)
        for tp in p.tp_sizes + [3]:
            bounds = {b.up_to_bytes for m in MODES for b in p.bands(tp, m)} if tp != 3 else {1}
            sizes = sorted({0, 1, 4095, 4096, 4097} | {b + k for b in bounds for k in (-1, 0, 1)})
            for n in sizes + [1 << 40]:
                for mode in MODES:
                    assert d.custom_at(tp, n, mode) == p.custom_at(tp, n, mode), (name, tp, n)
                either = [p.custom_at(tp, n, m) for m in MODES]
                assert d.custom_at(tp, n, None) == (
                    False if False in either else True if True in either else None)
            for engine in (None, 1, 4096, 1 << 20, 1 << 40):
                assert d.fused_up_to(tp, engine) == p.fused_up_to(tp, engine), (name, tp, engine)
