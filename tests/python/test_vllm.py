"""artune.vllm against the released vLLM installed beside it: the symbols it patches exist as
expected, and after register() vLLM's own functions answer as the profile says."""

import functools
import inspect
import logging

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.vllm  # noqa: E402
import torch  # noqa: E402
from vllm.distributed import parallel_state  # noqa: E402
from vllm.distributed.device_communicators import (  # noqa: E402
    cuda_communicator,
    custom_all_reduce,
    symm_mem,
)

CAR = custom_all_reduce.CustomAllreduce
PATCHED = [
    (cuda_communicator.CudaCommunicator, "__init__"),
    (CAR, "__init__"),
    (CAR, "should_custom_ar"),
    (symm_mem.SymmMemCommunicator, "should_use_symm_mem"),
]


@pytest.fixture(autouse=True)
def restore():
    saved = [(cls, name, cls.__dict__[name]) for cls, name in PATCHED]
    yield
    for cls, name, f in saved:
        setattr(cls, name, f)
    if hasattr(CAR, "_artune_patched"):
        delattr(CAR, "_artune_patched")


def test_the_symbols_the_plugin_patches_exist_as_expected():
    assert "_ENABLE_CUSTOM_ALL_REDUCE" in vars(parallel_state)
    params = list(inspect.signature(cuda_communicator.CudaCommunicator.__init__).parameters)
    assert params[:2] == ["self", "cpu_group"] and "unique_name" in params
    assert list(inspect.signature(CAR.__init__).parameters)[:4] == [
        "self", "group", "device", "max_size"]
    assert list(inspect.signature(CAR.should_custom_ar).parameters) == ["self", "inp"]
    assert list(inspect.signature(symm_mem.SymmMemCommunicator.should_use_symm_mem).parameters) \
        == ["self", "inp"]


def fake_ca(world_size, capturing):
    """A CustomAllreduce as vLLM leaves it once built on a PCIe pair (no GPU needed)."""
    ca = object.__new__(CAR)
    ca._ptr = 0  # so vLLM's __del__ has nothing to free
    ca.disabled = False
    ca.world_size = world_size
    ca.fully_connected = False
    ca.max_size = 8 << 20
    ca.batch_invariant = False
    ca._IS_CAPTURING = capturing
    return ca


SIZES = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, (8 << 20) - 16]


def test_should_custom_ar_follows_the_profile_at_tp2(profiles, follow):
    follow(profiles["pair"])
    p = artune.Profile.load(profiles["pair"])
    artune.vllm.register()
    checked = 0
    for capturing, mode in ((True, "graph"), (False, "eager")):
        for nbytes in SIZES:
            inp = torch.empty(nbytes // 2, dtype=torch.bfloat16)
            want = p.select(2, nbytes, mode).custom
            assert CAR.should_custom_ar(fake_ca(2, capturing), inp) is want, (nbytes, mode)
            checked += want
    assert 0 < checked < 2 * len(SIZES), "the profile should choose both custom and NCCL"


def test_max_size_is_cut_to_the_profiles_largest_custom_band(profiles, follow, monkeypatch):
    seen = []
    real = CAR.__init__

    @functools.wraps(real)
    def recording(self, group, device, max_size=8192 * 1024, *a, **k):
        self.disabled, self._ptr = True, 0
        seen.append(max_size)

    monkeypatch.setattr(CAR, "__init__", recording)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    follow(profiles["pair"])
    artune.vllm.register()
    CAR(group=None, device="cpu")
    p = artune.Profile.load(profiles["pair"])
    top = max(b.up_to_bytes for m in ("graph", "eager") for b in p.bands(2, m) if b.custom)
    assert seen == [min(8 << 20, (top + 16) // 16 * 16)]


def test_no_profile_bad_profile_or_simulated_leaves_vllm_as_it_was(
        profiles, follow, monkeypatch, tmp_path, caplog):
    before = [cls.__dict__[name] for cls, name in PATCHED]
    monkeypatch.delenv("ARTUNE_PROFILE", raising=False)
    artune.vllm.register()
    assert [cls.__dict__[name] for cls, name in PATCHED] == before
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    follow(str(bad))
    with caplog.at_level(logging.WARNING, logger="artune"):
        artune.vllm.register()
    assert [cls.__dict__[name] for cls, name in PATCHED] == before
    assert len(caplog.records) == 1 and "bad.json" in caplog.text
    caplog.clear()
    follow(profiles["pair"])
    monkeypatch.delenv("ARTUNE_ALLOW_SIMULATED")
    with caplog.at_level(logging.WARNING, logger="artune"):
        artune.vllm.register()
    assert [cls.__dict__[name] for cls, name in PATCHED] == before
    assert len(caplog.records) == 1 and "SIMULATED" in caplog.text
    assert "NCCL_TUNER_PLUGIN" not in __import__("os").environ


def test_the_nccl_plugin_is_named_for_nccl(profiles, follow):
    follow(profiles["pair"])
    artune.vllm.register()
    assert __import__("os").environ["NCCL_TUNER_PLUGIN"] == artune.plugin_path()
