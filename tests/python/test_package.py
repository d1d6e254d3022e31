"""The artune Python package itself: the same validation, selection and messages as Rust."""

import collections
import copy
import json
import os
import pickle
import subprocess

import artune
import artune.sglang
import artune.vllm
import pytest

from conftest import BIN, tune


def test_select_matches_the_binary(profiles):
    p = artune.Profile.load(profiles["story"])
    assert p.simulated and p.tp_sizes == [8]
    for nbytes in (1024, 14336, 114688, 1 << 20, 64 << 20):
        for mode in ("graph", "eager"):
            out = subprocess.run(
                [BIN, "select", profiles["story"], "--tp", "8", "--bytes", str(nbytes),
                 "--mode", mode, "--json"],
                check=True, capture_output=True, text=True,
            ).stdout
            want = json.loads(out)
            got = p.select(8, nbytes, mode)
            assert (got.backend, got.bucket_bytes, got.buffer_bytes) == (
                want["backend"], want["bucket_bytes"], want["buffer_bytes"])
            assert got.nccl == want["nccl_variant"]
    assert p.select(8, 1 << 40) is None
    assert p.select(3, 4096) is None


def test_explain_is_artune_why(profiles):
    p = artune.Profile.load(profiles["story"])
    text = p.explain(8, 114688)
    out = subprocess.run([BIN, "why", profiles["story"], "--tp", "8", "--bytes", "114688"],
                         check=True, capture_output=True, text=True).stdout
    assert text == out
    # No answer is why's no-answer line, as select's None, not an exception.
    why = subprocess.run([BIN, "why", profiles["story"], "--tp", "3", "--bytes", "4096"],
                         capture_output=True, text=True)
    assert why.returncode == 6 and p.select(3, 4096) is None
    assert p.explain(3, 4096).startswith("no answer (keep the engine's default): ")


def test_bands_memory_and_check(profiles, tmp_path):
    p = artune.Profile.load(profiles["pair"])
    bands = p.bands(2)
    assert bands and bands[-1].up_to_bytes == 64 << 20
    assert all(a.up_to_bytes < b.up_to_bytes for a, b in zip(bands, bands[1:]))
    # Bands tile what select answers: each starts just above the one before, the first where
    # select starts answering (from 1 byte where the smallest size is 4 KiB or less, else there).
    assert all(b.from_bytes == a.up_to_bytes + 1 for a, b in zip(bands, bands[1:]))
    assert bands[0].from_bytes == 1 and p.select(2, 1) is not None
    narrow = tmp_path / "from-14k.json"
    subprocess.run([BIN, "tune", "--sim", "pcie-8x-2switch", "--tp", "8", "--mode", "graph",
                    "--sizes", "14K:224K", "--no-contention", "--out", str(narrow)],
                   check=True, capture_output=True)
    story = artune.Profile.load(narrow)
    first = story.bands(8)[0]
    assert first.from_bytes == story.sizes(8)[0] == 14336, first
    assert story.select(8, first.from_bytes - 1) is None
    assert story.select(8, first.from_bytes) is not None
    mem = p.memory(2)
    top_custom = max(b.up_to_bytes for b in bands if b.custom)
    assert any(v > top_custom for k, v in mem.items() if k != "nccl")
    assert p.check(sim="pcie-2x").valid
    other = p.check(sim="pcie-4x-1switch")
    assert not other.valid and any("GPU count" in c for c in other.reasons)


def test_errors_are_exceptions_with_artunes_sentences(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(artune.ProfileError, match=r"is not a valid profile: it is not valid JSON.*name a profile that `artune tune` wrote$"):
        artune.Profile.load(bad)
    with pytest.raises(artune.ProfileError, match="cannot read"):
        artune.Profile.load(tmp_path / "missing.json")
    assert issubclass(artune.ProfileError, artune.ArtuneError)


def test_mode_must_be_graph_or_eager(profiles):
    p = artune.Profile.load(profiles["pair"])
    with pytest.raises(artune.BadInputError, match="neither"):
        p.select(2, 4096, "warp")


def test_plugin_path_is_the_plain_library():
    path = artune.plugin_path()
    assert os.path.basename(path) == "libartune.so"
    syms = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                          text=True, check=True).stdout
    assert "ncclTunerPlugin_v5" in syms and "artune_select" in syms
    undefined = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True,
                               text=True, check=True).stdout
    assert " Py" not in undefined, "the NCCL plugin must not need the Python interpreter"


def test_the_engine_paths_page_is_the_engine_model():
    """docs/ENGINE-PATHS.md is rendered from python/artune/engines.json; the installed
    package ships the same model the plugins read."""
    import engine_paths
    from artune import _engine

    with open(os.path.join(engine_paths.ROOT, "docs", "ENGINE-PATHS.md")) as f:
        assert f.read() == engine_paths.render(engine_paths.model()), (
            "regenerate: python3 tests/python/engine_paths.py > docs/ENGINE-PATHS.md")
    with open(os.path.join(os.path.dirname(_engine.__file__), "engines.json")) as f:
        assert json.load(f) == engine_paths.model()


def test_check_without_nvml_is_not_valid_and_loads_no_nccl(profiles):
    """In a fresh process (no torch): no NVML here is a reason the profile is not valid (the
    validity rule: nothing could be compared), and the check maps no NCCL library (it used to
    load one, through a python3 child, for its version)."""
    import sys

    code = (
        "import artune\n"
        f"p = artune.Profile.load({profiles['pair']!r})\n"
        "c = p.check()\n"
        "print('valid' if c.valid else 'not valid', c.reasons)\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('nccl mapped' if 'libnccl' in maps else 'no nccl')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    assert out.splitlines()[0].startswith("not valid"), out
    assert "this machine could not be read (" in out and "NVIDIA management library" in out
    assert out.splitlines()[-1] == "no nccl", out


def test_a_negative_size_is_a_bad_input_error_in_artunes_words(profiles):
    p = artune.Profile.load(profiles["pair"])
    for call in (lambda: p.select(2, -1), lambda: p.explain(2, -4096),
                 lambda: p.select(-2, 4096), lambda: p.bands(-2), lambda: p.memory(-2),
                 lambda: p.sglang_plan(-2)):
        with pytest.raises(artune.BadInputError, match=r"^(tp|nbytes)=-\d+[: ]"):
            call()


def test_arguments_are_refused_as_the_binary_refuses_them_naming_keywords(profiles):
    p = artune.Profile.load(profiles["story"])
    for call, flags, needle in (
        (lambda: p.select(8, 0), ["--tp", "8", "--bytes", "0"], r"^nbytes=0 is not a message"),
        (lambda: p.select(0, 4096), ["--tp", "0", "--bytes", "4096"],
         r"^tp=0: an allreduce needs at least 2 GPUs.*e\.g\. tp=2$"),
    ):
        # A BadInputError: an ArtuneError, as the docs promise.
        with pytest.raises(artune.BadInputError, match=needle):
            call()
        cli = subprocess.run([BIN, "select", profiles["story"], *flags], capture_output=True)
        assert cli.returncode == 2, cli.stderr
    with pytest.raises(artune.BadInputError, match=r"^nbytes=1180591620717411303424 is too large"):
        p.select(8, 1 << 70)
    # Where select has no answer, explain gives why's line for it, not an exception.
    for tp, nbytes, needle in ((3, 4096, "has no TP3 graph group (it has"),
                               (8, 1 << 40, "above the largest size the profile measured "
                                "for TP8 graph on GPUs 0-7")):
        assert p.select(tp, nbytes) is None
        text = p.explain(tp, nbytes)
        assert text.startswith("no answer (keep the engine's default): ") and needle in text, text
        assert "--" not in text
    assert p.explain(8, 1 << 40).endswith("; tune larger sizes for an answer")
    check = p.check(sim="pcie-4x-1switch")
    assert repr(check).startswith("Check(valid=False, followed=False, reasons=["), repr(check)


def test_check_refuses_two_machines_and_a_version_that_is_none(profiles, tmp_path):
    """check() names one machine, as the CLI's --sim and --topology conflict; an NCCL version
    that is not one is refused, not ignored; and an empty path is said to be empty."""
    p = artune.Profile.load(profiles["story"])
    topo = tmp_path / "t.json"
    topo.write_text(subprocess.run([BIN, "topo", "--sim", "nvswitch-8x", "--json"], check=True,
                                   capture_output=True, text=True).stdout)
    with pytest.raises(artune.BadInputError, match="pass one of them"):
        p.check(sim="nvswitch-8x", topology=str(topo))
    with pytest.raises(artune.BadInputError, match="is not an NCCL version"):
        p.check(sim="pcie-8x-2switch", nccl="garbage")
    with pytest.raises(artune.BadInputError, match="path is empty"):
        artune.Profile.load("")
    with pytest.raises(artune.BadInputError, match="too large"):
        p.fused_up_to(8, 2**63)


def test_select_and_explain_answer_for_the_gpus_asked(tmp_path):
    """A profile with several placements of a TP size answers each as the CLI's --gpus does,
    and says which GPUs answered (an engine on GPUs 3,4 is not given GPUs 0,1's answers
    without a word)."""
    out = tmp_path / "box.json"
    subprocess.run([BIN, "tune", "--sim", "pcie-8x-2switch", "--tp", "2", "--mode", "graph",
                    "--out", str(out)], check=True, capture_output=True)
    p = artune.Profile.load(str(out))
    assert p.select(2, 4096).gpus == [0, 1]
    differs = 0
    for nbytes in p.sizes(2):
        cli = json.loads(subprocess.run(
            [BIN, "select", str(out), "--tp", "2", "--gpus", "3,4", "--bytes", str(nbytes),
             "--json"], check=True, capture_output=True, text=True).stdout)
        got = p.select(2, nbytes, gpus=[3, 4])
        assert (got.backend, got.gpus) == (cli["backend"], [3, 4]), nbytes
        differs += got.backend != p.select(2, nbytes).backend
        why = subprocess.run([BIN, "why", str(out), "--tp", "2", "--gpus", "3,4", "--bytes",
                              str(nbytes)], check=True, capture_output=True, text=True).stdout
        assert p.explain(2, nbytes, gpus=[3, 4]) == why
    assert differs > 0, "the placements answer alike: the test proves nothing"
    with pytest.raises(artune.BadInputError, match="must name 2 different GPUs"):
        p.select(2, 4096, gpus=[3, 3])
    assert p.select(2, 4096, gpus=[5, 6]) is None
    assert "no TP2 graph group on GPUs 5,6" in p.explain(2, 4096, gpus=[5, 6])


SLOW_NCCL = ("--sim-faults",
             "slow=nccl+nccl_ring_ll+nccl_ring_simple+nccl_tree_ll+nccl_tree_simple:2")


def test_choice_band_and_check_are_values(profiles):
    """What select, bands and check answer compare and hash by their fields, and pickle
    (multiprocessing and Ray move them between processes)."""
    p = artune.Profile.load(profiles["pair"])
    answers = [(p.select(2, 4096), p.select(2, 4096), p.select(2, 64 << 20)),
               (p.bands(2)[0], p.bands(2)[0], p.bands(2)[-1]),
               (p.check(sim="pcie-2x"), p.check(sim="pcie-2x"),
                p.check(sim="pcie-4x-1switch"))]
    for a, same, other in answers:
        assert a is not same and a == same and hash(a) == hash(same), a
        assert a != other and len({a, same, other}) == 2, (a, other)
        assert a != repr(a) and a != None  # noqa: E711 - == against another type is False
        for back in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a), copy.copy(a)):
            assert type(back) is type(a) and back == a and hash(back) == hash(a), back
            assert repr(back) == repr(a)
    assert pickle.loads(pickle.dumps(answers)) == answers
    with pytest.raises(AttributeError):
        answers[0][0].backend = "nccl"


def test_a_graph_only_profile_leaves_eager_calls_to_the_engine(profiles, tmp_path):
    """The settings an engine has once for both modes (v1's build and max_size, vLLM's custom
    all-reduce max_size, the fusion cut) follow a profile only where it answers both modes: a
    graph-only profile has no answer for eager calls, so the engine's own rule stays there;
    v2's eager limits stay SGLang's. The same profile tuned in both modes is cut."""
    tmp = str(tmp_path)
    both = artune.Profile.load(profiles["pair"])
    pair = artune.Profile.load(tune(tmp, "pcie-2x", "--mode", "graph", *SLOW_NCCL,
                                    "--mem-budget", "5MiB", name="pair-graph"))
    nccl = artune.Profile.load(tune(tmp, "pcie-2x", "--mode", "graph", "--mem-budget", "1MiB",
                                    name="pair-nccl-graph"))
    engine = 1 << 30
    kind, build, cut = both.sglang_setup(2)
    assert (kind, build) == ("v1", True) and 0 < cut < engine
    assert both.largest_custom(2) == cut and both.fused_up_to(2, engine) < engine
    for p in (pair, nccl):
        assert p.sizes(2, "eager") == [] and p.sizes(2, "graph")
        assert all(p.custom_at(2, n, "eager") is None for n in p.sizes(2, "graph"))
        # The graph answers still hold: NCCL sizes in graph mode.
        assert any(p.custom_at(2, n, "graph") is False for n in p.sizes(2, "graph"))
        assert p.sglang_setup(2) == ("v1", True, None)
        assert p.largest_custom(2) is None and p.custom_prefix(2) is None
        assert p.fused_up_to(2, engine) == engine
        bands = artune._engine.Bands(p)
        assert bands.largest_custom(2) is None and bands.fused_up_to(2, engine) == engine
        assert artune.sglang.Decided(p).fused_up_to(2, engine) == engine
        vllm_pass = artune.vllm._fusion_follows(lambda self, ws: engine, bands)
        assert vllm_pass(None, 2) == engine

    nv = artune.Profile.load(tune(tmp, "nvswitch-8x", "--tp", "8", "--mode", "graph",
                                  name="nv-graph"))
    kind, limits = nv.sglang_setup(8)
    assert kind == "v2" and limits["eager"] is None and limits["graph"] is not None
    Range = collections.namedtuple("Range", "min_bytes max_bytes")
    Hint = collections.namedtuple("Hint", "one_shot_push_threshold one_shot_pull_threshold "
                                          "two_shot_pull_threshold two_shot_push_threshold mc")
    Config = collections.namedtuple("Config", "graph eager")
    sglangs = Hint(1000, 2000, 3000, 4000, Range(100, 5000))  # no profile limit is these
    get = artune.sglang._v2_follows(lambda ws: Config(sglangs, sglangs), artune.sglang.plans(nv))
    assert get(8).eager == sglangs
    assert get(8).graph.two_shot_pull_threshold == limits["graph"][2] != sglangs[2]
