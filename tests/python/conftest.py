"""Shared fixtures: simulated profiles tuned by the artune binary (ARTUNE_BIN), and an
environment that lets the plugins follow them on a machine without GPUs."""

import os
import subprocess

import pytest

BIN = os.environ.get("ARTUNE_BIN", "target/release/artune")
#: Set by .ci/python.sh when it tests the newest releases on the package index: tests that
#: pin the release artune was read against are skipped there, so only patch breakage shows.
NEWEST = os.environ.get("ARTUNE_NEWEST_RELEASE") == "1"


def tune(tmp, preset, *args, name=None):
    out = os.path.join(tmp, f"{name or preset}.json")
    if not os.path.exists(out):
        subprocess.run(
            [BIN, "tune", "--sim", preset, "--sizes", "1K:64M", "--no-contention", "--out", out,
             *args],
            check=True, stdout=subprocess.DEVNULL,
        )
    return out


@pytest.fixture(scope="session")
def profiles(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("profiles"))
    return {
        # The simulator's model bands keep a plain pcie-2x on NCCL at every size; with NCCL's
        # variants made twice as slow (a fault knob) the pair has a custom band (to 1.6M) and
        # NCCL above, so the plugins' custom and NCCL paths are both exercised.
        # A 4 MiB memory budget keeps its largest custom size under custom AR's 8 MiB.
        "pair": tune(tmp, "pcie-2x", "--sim-faults",
                     "slow=nccl+nccl_ring_ll+nccl_ring_simple+nccl_tree_ll+nccl_tree_simple:2",
                     "--mem-budget", "4MiB"),
        # The plain pair: NCCL at every size.
        "pair_nccl": tune(tmp, "pcie-2x", name="pair-nccl"),
        "nvswitch": tune(tmp, "nvswitch-8x", "--tp", "2,8"),
        "story": tune(tmp, "pcie-8x-2switch", "--tp", "8"),
        # Memory budgets make NCCL win where the custom kernels' buffers do not fit: custom
        # to 512 KiB and NCCL above, or NCCL at every size (simulated, like all of these).
        "nv_mid": tune(tmp, "nvswitch-8x", "--tp", "8", "--mem-budget", "4MiB", name="nv-mid"),
        "nv_nccl": tune(tmp, "nvswitch-8x", "--tp", "8", "--mem-budget", "1MiB", name="nv-nccl"),
        # NCCL made twice as slow: custom from the smallest size to a few hundred KiB at TP8,
        # NCCL above (the fusion rules' cut inside the profile).
        "nv_prefix": tune(tmp, "nvswitch-8x", "--tp", "8", "--sim-faults",
                          "slow=nccl+nccl_ring_ll+nccl_ring_simple+nccl_tree_ll+nccl_tree_simple:2",
                          name="nv-prefix"),
    }


@pytest.fixture
def follow(monkeypatch):
    """Sets ARTUNE_PROFILE to a simulated profile and allows following it here."""

    def set_profile(path):
        monkeypatch.setenv("ARTUNE_PROFILE", path)
        monkeypatch.setenv("ARTUNE_ALLOW_SIMULATED", "1")
        # No NVML here: the staleness check cannot read this machine.
        monkeypatch.setenv("ARTUNE_ALLOW_STALE", "1")
        monkeypatch.delenv("NCCL_TUNER_PLUGIN", raising=False)

    return set_profile
