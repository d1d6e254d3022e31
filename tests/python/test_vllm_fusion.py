"""artune.vllm's fusion rules and its constructor wrappers, through vLLM's own code: the
fusion pass's size and whether vLLM builds it, the models' own fused allreduce+RMSNorm,
a sub-communicator that keeps no world size, and the wrappers' fallback to vLLM's call.
The stand-ins are test_vllm's (the same GPU probes and kernels stubbed)."""

import logging
import types

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.vllm  # noqa: E402
import torch  # noqa: E402
from vllm.config.compilation import PassConfig  # noqa: E402

from machines import MACHINES, message  # noqa: E402
from test_vllm import (  # noqa: E402,F401 - restore: test_vllm's autouse fixture
    CAR,
    Group,
    Workspace,
    custom_ar_pair,
    log_name,
    on_machine,
    restore,
    stub_platform,
    unregister,
)


def test_the_fusion_pass_fuses_only_inside_the_profiles_custom_prefix(profiles, follow,
                                                                     monkeypatch):
    stub_platform(monkeypatch, (9, 0))
    cfg = PassConfig()
    base = {ws: cfg.flashinfer_max_size(ws) for ws in (2, 8)}
    assert base == {2: 64 << 20, 8: 512 << 10}, "vLLM 0.33.0's table on 9.0"
    follow(profiles["nvswitch"])
    artune.vllm.register()
    p = artune.Profile.load(profiles["nvswitch"])
    for ws in (2, 8):
        top = 0
        for b in p.bands(ws, "graph"):
            if not b.custom:
                break
            top = b.up_to_bytes
        eager_top = 0
        for b in p.bands(ws, "eager"):
            if not b.custom:
                break
            eager_top = b.up_to_bytes
        top = min(top, eager_top)
        assert cfg.flashinfer_max_size(ws) == (min(base[ws], top) if top else None), ws


def test_the_fusion_pass_stays_vllms_when_asked(profiles, follow, monkeypatch):
    stub_platform(monkeypatch, (9, 0))
    monkeypatch.setenv(artune.vllm.ENV_FUSION, "engine")
    follow(profiles["nvswitch"])
    artune.vllm.register()
    assert PassConfig().flashinfer_max_size(8) == 512 << 10


def model_fused_rms_norm(tp, nbytes, monkeypatch):
    """What DeepSeek-V3.2's layers run (vllm/models/common/ops/fused_allreduce_rms_norm.py,
    vLLM's own code): FlashInfer's fused allreduce+RMSNorm where ``_can_use_flashinfer`` (in
    fused_allreduce_gemma_rms_norm) says yes, else the TP all-reduce. The FlashInfer op and
    its workspace need GPUs: recording stand-ins."""
    from vllm.model_executor.layers import fused_allreduce_gemma_rms_norm as gemma
    from vllm.models.common.ops import fused_allreduce_rms_norm as common

    seen = []
    stub_platform(monkeypatch, (10, 3))
    fused = lambda **k: seen.append("flashinfer fused")  # noqa: E731
    for mod in (gemma, common):
        monkeypatch.setattr(mod, "flashinfer_trtllm_fused_allreduce_norm", fused)
    monkeypatch.setattr(gemma, "_AR_RESIDUAL_RMS_NORM", 1)
    monkeypatch.setattr(gemma, "get_fi_ar_workspace", lambda **k: Workspace())
    monkeypatch.setattr(gemma, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(gemma, "get_tp_group", lambda: types.SimpleNamespace(cpu_group=None))
    monkeypatch.setattr(common, "get_tensor_model_parallel_world_size", lambda: tp)
    monkeypatch.setattr(common, "tensor_model_parallel_all_reduce",
                        lambda x: seen.append("all_reduce") or x)
    norm = lambda x, r: (x, r)  # noqa: E731
    norm.weight = norm.variance_epsilon = None
    x = message(nbytes, hidden=1024)  # 2 KiB a token
    common.fused_allreduce_rms_norm(x, x, norm)
    assert len(seen) == 1, seen
    return seen[0]


def prefix_sizes(profiles):
    """Sizes around the nv_prefix profile's custom prefix at TP8 (2 KiB a token): one fused
    at each end of it, one just above, one well above."""
    top = artune._engine.Bands(artune.Profile.load(profiles["nv_prefix"])).custom_prefix(8)
    assert 4 << 10 <= top < 2 << 20, top  # the simulator must still give such a prefix
    top -= top % (2 << 10)
    return top, [2 << 10, top, top + (2 << 10), 2 << 20]


def test_the_models_fused_allreduce_rms_norm_fuses_only_inside_the_custom_prefix(
        profiles, follow, monkeypatch, caplog):
    """DeepSeek-V3.2 / Kimi-K3 / MiniMax-M3 call FlashInfer's fused kernel from model code
    with the fusion pass's table (bypassing the communicator): with the profile it fuses
    only up to the profile's custom prefix; above, the all-reduce goes to the communicator.
    On 10.3 vLLM's own table fuses to 4 MiB at TP8, above every size here."""
    top, sizes = prefix_sizes(profiles)
    native = {n: model_fused_rms_norm(8, n, monkeypatch) for n in sizes}
    assert set(native.values()) == {"flashinfer fused"}, native
    for prof, cut in (("nv_prefix", top), ("nv_nccl", 0)):
        follow(profiles[prof])
        artune.vllm.register()
        assert artune._engine.Bands(artune.Profile.load(profiles[prof])).custom_prefix(8) >= cut
        with caplog.at_level(logging.WARNING):
            got = {n: model_fused_rms_norm(8, n, monkeypatch) for n in sizes}
        assert got == {n: "flashinfer fused" if n <= cut else "all_reduce" for n in sizes}, (
            prof, cut, got)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        unregister()
    monkeypatch.setenv(artune.vllm.ENV_FUSION, "engine")
    artune.vllm.register()
    assert {n: model_fused_rms_norm(8, n, monkeypatch) for n in sizes} == native


def test_aiter_custom_ar_follows_the_profile_though_it_keeps_no_world_size(
        profiles, follow, monkeypatch, caplog):
    """vLLM's AiterCustomAllreduce (ROCm) wraps aiter's object and keeps no world size: its
    gate takes the TP communicator's, stamped when the communicator is built; where no size
    can be told the engine's answer stands and the start-up line says "not applied"."""
    from vllm.distributed.device_communicators import aiter_custom_all_reduce as aiter

    m = next(x for x in MACHINES if x.name.startswith("H200"))._replace(profile="nv_nccl")
    follow(profiles["nv_nccl"])
    artune.vllm.register()
    seen = []
    comm = on_machine(m, "eager", monkeypatch, seen)
    ar = object.__new__(aiter.AiterCustomAllreduce)
    ar._impl = types.SimpleNamespace(disabled=False, should_custom_ar=lambda x: True,
                                     custom_all_reduce=lambda x: seen.append("aiter") or x)
    assert artune._engine.world_size_of(ar) is None
    comm.aiter_ar_comm, comm.use_aiter_allreduce, comm.fi_ar_comm = ar, True, None
    artune.vllm.stamp_world_size(comm)  # what the plugin's constructor wrapper does
    seen.clear()
    comm.all_reduce(message(64 << 10))
    assert seen == ["pynccl"], seen
    bare = object.__new__(aiter.AiterCustomAllreduce)
    bare._impl = ar._impl
    with caplog.at_level(logging.WARNING, logger=log_name):
        assert bare.should_custom_ar(message(64 << 10)) is True
        assert bare.should_custom_ar(message(64 << 10)) is True
    assert len(caplog.records) == 1 and "aiter" in caplog.text, caplog.text
    line = artune.vllm.startup_line(artune._engine.Bands(artune.Profile.load(
        profiles["nv_nccl"])), artune.vllm.applied, "tp:0", 8, False, True)
    assert "not applied: aiter (its TP size cannot be told" in line, line


def test_a_renamed_constructor_parameter_leaves_vllms_constructor_alone(
        profiles, follow, monkeypatch, caplog):
    """A release whose CustomAllreduce.__init__ renamed ``max_size``: the wrapper would bind
    it by name, so it is not applied, said once; vLLM's constructor builds as without it."""
    real = CAR.__init__

    def renamed(self, group, device, max_bytes=8 << 20, **k):
        real(self, group, device, max_size=max_bytes, **k)

    monkeypatch.setattr(CAR, "__init__", renamed)
    follow(profiles["pair"])
    with caplog.at_level(logging.WARNING, logger=log_name):
        artune.vllm.register()
    assert CAR.__dict__["__init__"] is renamed
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert sum("CustomAllreduce.__init__" in x for x in lines) == 1, lines
    assert any(s.startswith("CustomAllreduce.__init__") for s in artune.vllm.applied.skipped)
    assert custom_ar_pair(monkeypatch, []).max_size == 8 << 20


def test_a_failure_inside_the_constructor_wrappers_falls_back_to_vllms_call(
        profiles, follow, monkeypatch, caplog):
    """Any failure of artune's own logic in a constructor wrapper: vLLM's constructor runs
    with the caller's arguments, and one warning says so; nothing raises into vLLM."""
    follow(profiles["pair"])
    monkeypatch.setenv(artune.vllm.ENV_CUSTOM_AR, "off")
    artune.vllm.register()

    def broken(n):
        raise KeyError("max_size")

    monkeypatch.setattr(artune._engine, "round_up16", broken)
    with caplog.at_level(logging.WARNING, logger=log_name):
        ca = custom_ar_pair(monkeypatch, [])
    assert ca.max_size == 8 << 20 and not ca.disabled
    lines = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(lines) == 1 and "failed inside artune" in lines[0], lines
    m = next(x for x in MACHINES if x.name == "L40S TP2 PCIe")
    monkeypatch.setattr(artune._engine.Bands, "covers", lambda self, tp: 1 / 0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=log_name):
        comm = on_machine(m, "eager", monkeypatch, [])
    assert comm.ca_comm is not None
    assert sum("CudaCommunicator.__init__ failed inside artune" in r.getMessage()
               for r in caplog.records) == 1, caplog.text


def test_the_startup_line_is_printed_once_per_group_by_its_rank_0(profiles, follow,
                                                                  monkeypatch, caplog):
    m = next(x for x in MACHINES if x.name == "L40S TP2 PCIe")
    follow(profiles["pair"])
    artune.vllm.register()
    for rank in (0, 1):
        monkeypatch.setattr(Group, "rank", lambda self, _r=rank: _r)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=log_name):
            comm = on_machine(m, "eager", monkeypatch, [])
        assert comm.rank_in_group == rank
        lines = [r.getMessage() for r in caplog.records if r.name == log_name]
        assert len(lines) == (rank == 0), (rank, lines)




def test_a_refused_fusion_pass_is_not_built_so_vllm_reports_no_failure(
        profiles, follow, monkeypatch, caplog):
    """vLLM's own PostGradPassManager.configure at -O2 (fuse_allreduce_rms on). Where the
    profile refuses fusion at the TP size, the pass would log vLLM's WARNING "Flashinfer
    allreduce fusion is not supported..." for artune's refusal: it is not built at all, and
    no WARNING is logged. AllReduceFusionPass itself needs vLLM's CUDA ops to import, so it is
    a recording stand-in that logs vLLM's warning where flashinfer_max_size is None."""
    from vllm.compilation.passes import pass_manager as pm
    from vllm.config.compilation import CompilationConfig

    stub_platform(monkeypatch, (9, 0))
    built = []

    def fusion_pass(config):
        pc = config.compilation_config.pass_config
        if pc.flashinfer_max_size(config.parallel_config.tensor_parallel_size) is None:
            logging.getLogger("vllm.compilation.passes.fusion.allreduce_rms_fusion").warning(
                "Flashinfer allreduce fusion is not supported for world size %s", 8)
        built.append("fusion pass")
        return types.SimpleNamespace()

    monkeypatch.setattr(pm, "AllReduceFusionPass", fusion_pass, raising=False)

    def configure(tp):
        pc = PassConfig(fuse_allreduce_rms=True, eliminate_noops=False)
        cfg = types.SimpleNamespace(
            compilation_config=CompilationConfig(pass_config=pc), model_config=None,
            device_config=None, parallel_config=types.SimpleNamespace(tensor_parallel_size=tp))
        built.clear()
        pm.PostGradPassManager().configure(cfg)
        assert pc.fuse_allreduce_rms  # put back
        return list(built)

    assert configure(8) == ["fusion pass"]
    for prof, want in (("nv_nccl", []), ("nv_prefix", ["fusion pass"])):
        follow(profiles[prof])
        artune.vllm.register()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert configure(8) == want, prof
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        unregister()
    # Fusion left to vLLM (ARTUNE_VLLM_FUSION=engine): vLLM builds its pass as without artune.
    monkeypatch.setenv(artune.vllm.ENV_FUSION, "engine")
    follow(profiles["nv_nccl"])
    artune.vllm.register()
    assert configure(8) == ["fusion pass"]


def qwen3_5_fused(tp, nbytes, monkeypatch, dtype=torch.bfloat16):
    """Whether Qwen3.5's fused allreduce+norm+quant takes a message (vLLM's own
    ``_get_workspace``, which the model calls before FlashInfer's kernel and which returns
    None to run the unfused all-reduce); FlashInfer's quant workspace needs GPUs, so it is
    a stand-in that fits every size; on 10.3 the fusion table reaches 4 MiB at TP8."""
    from vllm.models.qwen3_5.nvidia.ops import fused_allreduce_norm_quant as q

    stub_platform(monkeypatch, (10, 3))
    monkeypatch.setattr(q.fi_ar, "fi_ar_available", True)
    monkeypatch.setattr(q, "_workspace_unsupported", False)
    monkeypatch.setattr(q.fi_ar, "get_fi_ar_quant_workspace", lambda **k: Workspace())
    monkeypatch.setattr(q, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(q, "get_tp_group", lambda: types.SimpleNamespace(cpu_group=None))
    x = message(nbytes, hidden=2048 // torch.empty((), dtype=dtype).element_size(), dtype=dtype)
    return q._get_workspace(x, tp) is not None


def test_qwen3_5s_fused_norm_follows_the_profile_unless_fusion_is_left_to_vllm(
        profiles, follow, monkeypatch):
    """Qwen3.5's fused allreduce+norm+quant (a fused-norm path of its own, not the pass):
    fused up to the profile's custom prefix in bytes of the message's dtype (bf16 and fp16),
    the unfused all-reduce above; ARTUNE_VLLM_FUSION=engine keeps vLLM's sizes there too."""
    top, sizes = prefix_sizes(profiles)
    dtypes = [torch.bfloat16, torch.float16]
    native = {(n, d): qwen3_5_fused(8, n, monkeypatch, d) for n in sizes for d in dtypes}
    assert all(native.values()), native
    follow(profiles["nv_prefix"])
    artune.vllm.register()
    got = {(n, d): qwen3_5_fused(8, n, monkeypatch, d) for n in sizes for d in dtypes}
    assert got == {(n, d): n <= top for n in sizes for d in dtypes}, got
    unregister()
    monkeypatch.setenv(artune.vllm.ENV_FUSION, "engine")
    artune.vllm.register()
    assert {(n, d): qwen3_5_fused(8, n, monkeypatch, d) for n in sizes for d in dtypes} == native


def test_the_models_fused_norm_counts_the_bytes_of_the_messages_dtype(profiles, follow,
                                                                       monkeypatch):
    """The models' fused allreduce+RMSNorm cut (``_max_token_num``) in tokens of the model's
    dtype: an fp32 model's tokens hold twice the bytes, so it fuses half as many tokens."""
    from vllm.model_executor.layers import fused_allreduce_gemma_rms_norm as gemma

    stub_platform(monkeypatch, (10, 3))
    follow(profiles["nv_prefix"])
    artune.vllm.register()
    top = artune._engine.Bands(artune.Profile.load(profiles["nv_prefix"])).custom_prefix(8)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        size = torch.empty((), dtype=dtype).element_size()
        assert gemma._max_token_num(8, 1024, dtype) == top // (1024 * size), dtype
