"""The validity rule (src/profile/validity/) as the Python package and both engine plugins
apply it: the hardware that decides (GPU model and count, link widths, paths) must be the
profile's; other GPUs of the same class (UUIDs) and a driver bump leave it valid, with a note;
a machine that cannot be read (no NVML here) is not valid unless ARTUNE_ALLOW_INVALID=1, which
the start-up line then names. Runs in either engine's environment (.ci/python.sh)."""

import importlib
import logging

import artune
import pytest

from conftest import topology, tune

#: The box the profiles here are tuned on: a topology file with GPU UUIDs and versions.
PRESET = "pcie-4x-1switch"


def node(t, tag="tuned", driver="570.86.15"):
    for i, g in enumerate(t["gpus"]):
        g["uuid"] = f"GPU-{tag}-{i}"
        g["bus_id"] = f"0000:{0x20 + 0x10 * i + (tag != 'tuned'):02x}:00.0"
    t.setdefault("host", {})["driver"] = driver
    t["host"]["hostname"] = f"node-{tag}"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("validity"))
    tuned = topology(tmp, "tuned", PRESET, node)
    profile = tune(tmp, PRESET, "--topology", tuned, "--tp", "4", name="tuned")

    def machine(name, edit):
        def both(t):
            node(t, "other")
            edit(t)
        return topology(tmp, name, PRESET, both)

    return profile, machine


def test_an_identical_node_is_valid_and_a_driver_bump_is_a_note(box):
    profile, machine = box
    p = artune.Profile.load(profile)
    c = p.check(topology=machine("twin", lambda t: None))
    assert c.valid and c.followed and not c.reasons, c
    assert c.notes == ["tuned on another node of this class"], c.notes
    c = p.check(topology=machine("upgraded", lambda t: t["host"].update(driver="580.159.04")))
    assert c.valid and c.followed, c
    assert "driver 570.86.15 → 580.159.04" in c.notes, c.notes
    assert c.verdict.startswith("valid here; driver 570.86.15 → 580.159.04"), c.verdict
    assert c.verdict.endswith(
        ": re-timing its decisive sizes (artune check --measure) tells whether its choices still "
        "hold"), c.verdict


@pytest.mark.parametrize("name,edit,reason", [
    ("model", lambda t: t["gpus"][1].update(name="NVIDIA L40S"), "GPU 1 "),
    ("width", lambda t: t["gpus"][2]["pcie"].update(max_width=8, width=8),
     "GPU 2 PCIe link Gen5 x16 → Gen5 x8"),
    ("count", lambda t: t.update(gpus=t["gpus"][:2], pairs=[]), "GPU count 4 → 2"),
])
def test_other_hardware_is_not_valid_unless_overridden_and_said(box, name, edit, reason):
    profile, machine = box
    p = artune.Profile.load(profile)
    c = p.check(topology=machine(name, edit))
    assert not c.valid and not c.followed, c
    assert any(r.startswith(reason) for r in c.reasons), c.reasons
    assert "set ARTUNE_ALLOW_INVALID=1 to follow it anyway" in c.verdict, c.verdict
    c = p.check(topology=machine(name, edit), allow_invalid=True)
    assert c.followed and "), followed because ARTUNE_ALLOW_INVALID=1" in c.verdict, c


def engine(key):
    """The installed engine's plugin module and its logger's name, or skip."""
    pytest.importorskip(key, reason=f"needs the {key} test environment (.ci/python.sh)")
    return importlib.import_module(f"artune.{key}"), f"{key}.artune"


#: Where each engine's CustomAllreduce is, which the plugin marks as patched.
CAR_MODULE = {"vllm": "vllm.distributed.device_communicators.custom_all_reduce",
              "sglang": "sglang.srt.distributed.device_communicators.custom_all_reduce"}


@pytest.fixture
def undo():
    """Puts each engine registered in the test back as it was (as its own tests do)."""
    keys = []
    yield keys
    for key in keys:
        plugin = importlib.import_module(f"artune.{key}")
        if plugin.applied is not None:
            plugin.applied.undo()
            plugin.applied = None
        car = importlib.import_module(CAR_MODULE[key]).CustomAllreduce
        if hasattr(car, "_artune_patched"):
            delattr(car, "_artune_patched")


@pytest.mark.parametrize("key", ["vllm", "sglang"])
def test_a_machine_that_cannot_be_read_leaves_the_engine_alone_and_says_why(
        key, box, monkeypatch, caplog, undo):
    plugin, log_name = engine(key)
    undo.append(key)
    profile, _ = box
    if not any("could not be read" in r for r in artune.Profile.load(profile).check().reasons):
        pytest.skip("NVML reads this machine: the rule compares it with the profile's instead")
    for k in ("ARTUNE_ALLOW_INVALID", "ARTUNE_ALLOW_STALE", artune._engine.ENV_SAID):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ARTUNE_PROFILE", profile)
    monkeypatch.setenv("ARTUNE_ALLOW_SIMULATED", "1")
    with caplog.at_level(logging.INFO, logger=log_name):
        plugin.register()
    assert plugin.applied is None
    said = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(said) == 1 and said[0].startswith(f"artune: {profile} is not valid here ("), said
    assert "this machine could not be read (" in said[0], said
    assert "or set ARTUNE_ALLOW_INVALID=1 to follow it anyway;" in said[0], said
    assert said[0].endswith("starts as without artune"), said
    # The old override is read no more, and says so; the rule still applies.
    monkeypatch.setenv("ARTUNE_ALLOW_STALE", "1")
    monkeypatch.delenv(artune._engine.ENV_SAID, raising=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=log_name):
        plugin.register()
    assert plugin.applied is None
    said = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert said[0].startswith("artune: ARTUNE_ALLOW_STALE is no longer read"), said
    assert "is not valid here" in said[1], said
    # The override follows it, and the verdict reaches every group's start-up line.
    monkeypatch.delenv("ARTUNE_ALLOW_STALE")
    monkeypatch.setenv("ARTUNE_ALLOW_INVALID", "1")
    plugin.register()
    assert plugin.applied is not None and plugin.applied.applied


def test_the_sglang_startup_line_says_the_verdict_and_what_it_steers(
        profiles, follow, monkeypatch, caplog):
    """Through SGLang's own GroupCoordinator (test_sglang.real_gc): the short line at INFO names
    the profile, its verdict here (overridden: this machine cannot be read), how many sizes it
    steers and where artune's kernels run; the full list follows at DEBUG."""
    pytest.importorskip("sglang", reason="needs the SGLang test environment (.ci/python.sh)")
    import test_sglang

    follow(profiles["pair"])
    artune.sglang.register()
    try:
        with caplog.at_level(logging.DEBUG, logger=test_sglang.log_name):
            test_sglang.real_gc(2, monkeypatch, [], "tp")
    finally:
        test_sglang.unregister()
    lines = [r for r in caplog.records if r.name == test_sglang.log_name]
    info = [r.getMessage() for r in lines if r.levelno >= logging.INFO]
    assert len(info) == 1, info
    p = artune.Profile.load(profiles["pair"])
    sizes = len(set(p.sizes(2, "graph")) | set(p.sizes(2, "eager")))
    assert info[0].startswith(f"artune: TP2 group tp follows {profiles['pair']} (NOT valid "
                              "here ("), info
    assert "this machine could not be read (" in info[0], info
    assert "followed because ARTUNE_ALLOW_INVALID=1 and ARTUNE_ALLOW_SIMULATED=1)" in info[0]
    assert f"; {sizes} sizes steered (" in info[0], info
    assert "artune's own kernels" in info[0], info
    full = [r.getMessage() for r in lines if r.levelno == logging.DEBUG and "follows" in
            r.getMessage()]
    assert len(full) == 1 and "NCCL sizes run NCCL" in full[0], full
