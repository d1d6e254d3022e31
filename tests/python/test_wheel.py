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


def test_python_m_artune_is_the_cli_where_its_script_is_off_path(cli, tmp_path):
    """`python -m artune` runs the CLI the wheel installed (a `pip install --user` puts it in
    ~/.local/bin, often off PATH in an engine's container): same output, same exit code."""
    env = dict(os.environ, PATH="/nonexistent")
    r = subprocess.run([sys.executable, "-m", "artune", "--version"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == subprocess.run([cli, "--version"], capture_output=True, text=True,
                                      check=True).stdout
    bad = subprocess.run([sys.executable, "-m", "artune", "show", str(tmp_path / "none.json")],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: cannot read"), bad.stderr


def test_errors_pickle_as_engines_move_them_between_processes(tmp_path):
    """vLLM and SGLang send exceptions across processes (multiprocessing, Ray): artune's
    errors are importable as artune.X, so they pickle, and keep their message."""
    import pickle

    with pytest.raises(artune.ProfileError) as e:
        artune.Profile.load(str(tmp_path / "none.json"))
    assert type(e.value).__module__ == "artune"
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is artune.ProfileError and str(back) == str(e.value)
