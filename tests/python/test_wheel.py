"""What `pip install artune` gives, run from the environment the wheel was installed in: the
`artune` CLI (bin/artune, from the wheel's scripts), which tunes with nothing else installed,
and the NCCL plugin library its exports name. .ci/python.sh runs every Python test with the CLI
the wheel installed (ARTUNE_BIN); these fail where the wheel lacks it."""

import os
import subprocess
import sys

import artune
import pytest

#: pip installs a wheel's scripts beside the interpreter of the environment.
CLI = os.path.join(os.path.dirname(sys.executable), "artune")


@pytest.fixture(scope="module")
def cli():
    if not os.path.isfile(CLI):
        pytest.fail(f"{CLI} is missing: the artune wheel installed no `artune` command")
    return CLI


def test_the_wheel_installs_the_cli_that_tunes(cli, tmp_path):
    out = tmp_path / "p.json"
    r = subprocess.run([cli, "tune", "--sim", "pcie-8x-2switch", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    p = artune.Profile.load(str(out))
    assert p.simulated and 8 in p.tp_sizes
    v = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    assert artune.__version__ in v


def test_the_cli_names_the_plugin_library_the_wheel_ships(cli, tmp_path):
    out = tmp_path / "p.json"
    subprocess.run([cli, "tune", "--sim", "pcie-2x", "--sizes", "1K:1M", "--out", str(out)],
                   check=True, capture_output=True)
    text = subprocess.run([cli, "export", str(out), "--engine", "nccl"], check=True,
                          capture_output=True, text=True).stdout
    assert f"export NCCL_TUNER_PLUGIN={os.path.realpath(artune.plugin_path())}\n" in text, text
