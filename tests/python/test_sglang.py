"""artune.sglang against the released SGLang installed beside it."""

import functools
import inspect
import json
import logging
import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang", reason="needs the SGLang test environment (.ci/python.sh)")

import artune  # noqa: E402
import artune.sglang  # noqa: E402
import torch  # noqa: E402
from sglang.srt.distributed.device_communicators import (  # noqa: E402
    custom_all_reduce,
    custom_all_reduce_v2,
)

from conftest import BIN  # noqa: E402

CAR = custom_all_reduce.CustomAllreduce
MODULE_PATCHES = [
    (custom_all_reduce, "dispatch_custom_allreduce"),
    (custom_all_reduce_v2, "get_all_reduce_config"),
]
CLASS_PATCHES = [(CAR, "__init__"), (CAR, "should_custom_ar")]


def current():
    return [getattr(m, n) for m, n in MODULE_PATCHES] + [c.__dict__[n] for c, n in CLASS_PATCHES]


@pytest.fixture(autouse=True)
def restore(monkeypatch):
    saved = current()
    monkeypatch.delenv(artune.sglang.ENV_V2_WORKSPACE, raising=False)
    yield
    for (m, n), f in zip(MODULE_PATCHES, saved):
        setattr(m, n, f)
    for (c, n), f in zip(CLASS_PATCHES, saved[len(MODULE_PATCHES):]):
        setattr(c, n, f)
    if hasattr(CAR, "_artune_patched"):
        delattr(CAR, "_artune_patched")


def test_the_symbols_the_plugin_patches_exist_as_expected():
    assert list(inspect.signature(CAR.__init__).parameters) == [
        "self", "group", "device", "max_size"]
    assert list(inspect.signature(CAR.should_custom_ar).parameters) == ["self", "inp"]
    assert list(inspect.signature(custom_all_reduce.dispatch_custom_allreduce).parameters) == [
        "group", "device"]
    cfg = custom_all_reduce_v2.get_all_reduce_config
    assert list(inspect.signature(cfg).parameters) == ["world_size"]
    fields = custom_all_reduce_v2.get_all_reduce_config.__wrapped__ if hasattr(
        cfg, "__wrapped__") else cfg
    assert fields is not None


def test_v2_thresholds_follow_the_profile_on_nvswitch(profiles, follow, monkeypatch):
    follow(profiles["nvswitch"])
    base = custom_all_reduce_v2.get_all_reduce_config
    # SGLang's table is per GPU architecture; on a machine without a GPU, ask for one.
    monkeypatch.setattr(custom_all_reduce_v2, "get_all_reduce_config",
                        functools.wraps(base)(lambda ws: fake_config(ws)))
    artune.sglang.register()
    p = artune.Profile.load(profiles["nvswitch"])
    cfg = custom_all_reduce_v2.get_all_reduce_config(8)
    for mode in ("graph", "eager"):
        kind, lim = p.sglang_plan(8, mode)
        h = getattr(cfg, mode)
        assert kind == "v2"
        assert (h.one_shot_push_threshold, h.one_shot_pull_threshold,
                h.two_shot_pull_threshold, h.two_shot_push_threshold) == (*lim, 0)
        assert h.mc == getattr(fake_config(8), mode).mc, "the multicast range stays SGLang's"
    assert cfg.num_push_blocks == fake_config(8).num_push_blocks


def test_the_v2_workspace_is_sized_before_sglang_reads_it(profiles):
    """SGLang reads the workspace variable when custom_all_reduce_v2 is imported: in a fresh
    process, register() first, then the import sees the profile's size."""
    p = artune.Profile.load(profiles["nvswitch"])
    top = max(max(p.sglang_plan(tp, m)[1]) for tp in (2, 8) for m in ("graph", "eager"))
    env = dict(os.environ, ARTUNE_PROFILE=profiles["nvswitch"], ARTUNE_ALLOW_SIMULATED="1",
               ARTUNE_ALLOW_STALE="1")
    env.pop(artune.sglang.ENV_V2_WORKSPACE, None)
    out = subprocess.run(
        [sys.executable, "-c",
         "import artune.sglang; artune.sglang.register(); "
         "from sglang.srt.distributed.device_communicators import custom_all_reduce_v2 as m; "
         "print(m._DEFAULT_MAX_SIZE)"],
        env=env, check=True, capture_output=True, text=True).stdout
    assert int(out.split()[-1]) == -(-top // 1024) * 1024


def fake_config(ws):
    from sglang.srt.distributed.device_communicators.configs.custom_all_reduce_v2 import (
        AllReduceConfig, Heuristic, Range)
    mb = 1 << 20
    h = Heuristic(mb, 4 * mb, 64 * mb, Range(mb, 32 * mb))
    return AllReduceConfig(graph=h, eager=h, num_push_blocks=132, num_pull_blocks=96,
                           num_mc_blocks=32)


def fake_v1(capturing):
    ca = object.__new__(CAR)
    ca._ptr = 0  # so SGLang's __del__ has nothing to free
    ca.disabled = False
    ca.world_size = 2
    ca.full_nvlink = False
    ca.max_size = 8 << 20
    ca._IS_CAPTURING = capturing
    return ca


def test_v1_on_a_pcie_pair_follows_the_profile_per_size(profiles, follow, monkeypatch):
    follow(profiles["pair"])
    seen = []
    real = CAR.__init__

    @functools.wraps(real)
    def recording(self, group, device, max_size=8 << 20):
        self.disabled, self._ptr = True, 0
        seen.append(max_size)

    monkeypatch.setattr(CAR, "__init__", recording)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    artune.sglang.register()
    p = artune.Profile.load(profiles["pair"])
    plans = [p.sglang_plan(2, m) for m in ("graph", "eager")]
    assert {k for k, _ in plans} == {"v1"}
    keep = all(k for _, (k, _) in plans)
    top = max(t for _, (_, t) in plans)
    CAR(group=None, device="cpu")
    if keep and top:
        assert seen == [min(8 << 20, (top + 15) // 16 * 16)]
    for capturing, mode in ((True, "graph"), (False, "eager")):
        for nbytes in (1 << 10, 64 << 10, 1 << 20, 4 << 20, 8 << 20):
            inp = torch.empty(nbytes // 2, dtype=torch.bfloat16)
            assert CAR.should_custom_ar(fake_v1(capturing), inp) is p.select(2, nbytes,
                                                                             mode).custom


def test_the_story_box_builds_no_custom_all_reduce_and_says_so(profiles, follow, monkeypatch,
                                                              capsys):
    """8 PCIe GPUs, TP8 (the story): SGLang's v1 needs NVLink beyond two GPUs and v2 always
    does, so the profile's custom bands cannot run there; the plugin keeps SGLang from building
    one, and `artune why` agrees at every size."""
    follow(profiles["story"])
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 8)
    artune.sglang.register()
    with pytest.raises(RuntimeError, match="chooses NCCL"):
        custom_all_reduce.dispatch_custom_allreduce(None, "cpu")
    p = artune.Profile.load(profiles["story"])
    assert p.sglang_plan(8, "graph")[0] == "nccl"
    custom_bytes = max(b.up_to_bytes for b in p.bands(8) if b.custom)
    for nbytes in (4096, 65536, custom_bytes):
        why = json.loads(subprocess.run(
            [BIN, "why", profiles["story"], "--tp", "8", "--bytes", str(nbytes), "--json"],
            check=True, capture_output=True, text=True).stdout)
        sgl = next(e for e in why["engines"] if e["engine"] == "SGLang")
        assert sgl["runs"] == "NCCL", sgl
    # v1 forced on would allocate, per GPU: metadata + max_size, the IPC buffer, rank data.
    forced = 3 * (8 << 20)
    print(f"story TP8: artune's profile wants custom kernels up to {custom_bytes} B, which "
          f"SGLang cannot run on 8 PCIe GPUs; IPC buffers with the plugin 0 B, SGLang's "
          f"default 0 B, v1 forced on about {forced} B per GPU")


def test_no_profile_or_a_bad_one_leaves_sglang_as_it_was(follow, monkeypatch, tmp_path,
                                                          caplog):
    before = current()
    monkeypatch.delenv("ARTUNE_PROFILE", raising=False)
    artune.sglang.register()
    assert current() == before
    bad = tmp_path / "truncated.json"
    bad.write_text('{"schema_version": 1')
    follow(str(bad))
    with caplog.at_level(logging.WARNING, logger="artune"):
        artune.sglang.register()
    assert current() == before
    assert len(caplog.records) == 1 and "truncated.json" in caplog.text
    assert artune.sglang.ENV_V2_WORKSPACE not in os.environ
