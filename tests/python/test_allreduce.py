"""artune.allreduce on a machine without a GPU: the real torch process groups (gloo, one process
per rank) and artune's real routing and kernel-record checks; the device layer, which needs a
GPU, is replaced by a fake that records what the op asks of it (it moves no data). What a GPU
proves is in profiles/hardware/h200/ (the op's run script there)."""

import functools
import json
import logging
import math
import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import artune
from artune import allreduce
from conftest import tune

RECORD = {
    "nvrtc": "13.0",
    "target": "sm_90",
    "programs": [{"program": "allreduce.cu", "source_sha256": "a" * 64,
                  "image_sha256": "b" * 64}],
}


def _measured(src, dst, kernels=True):
    with open(src) as f:
        p = json.load(f)
    p["simulated"] = False
    p["fabric"] = "a simulated profile relabelled for tests"
    if kernels:
        p["kernels"] = [RECORD]
    dst.write_text(json.dumps(p))
    return str(dst)


@pytest.fixture(scope="module")
def measured(profiles, tmp_path_factory):
    """Simulated profiles with a custom band, then NCCL, dressed as measured ones with a kernel
    record: the pair (TP2) and four GPUs under one switch (TP4); the pair without the record
    too, as older artune wrote them."""
    tmp = tmp_path_factory.mktemp("op")
    slow = "slow=nccl+nccl_ring_ll+nccl_ring_simple+nccl_tree_ll+nccl_tree_simple:4"
    quad = tune(str(tmp), "pcie-4x-1switch", "--tp", "4", "--sim-faults", slow, name="quad")
    return {
        "measured": _measured(profiles["pair"], tmp / "measured.json"),
        "quad": _measured(quad, tmp / "quad-measured.json"),
        "old": _measured(profiles["pair"], tmp / "old.json", kernels=False),
        "simulated": profiles["pair"],
    }


class Fake:
    """The device layer's surface (artune._allreduce.AllreduceKernels), recording its calls.
    `plot` makes it fail where a real one would: {"open": msg, "connect": msg} per rank, a
    bus id per rank, and `launch` failing."""

    plot: dict = {}

    def __init__(self, rank):
        self.rank = rank
        self.calls = []
        self.graph = False
        self.routes = None

    @classmethod
    def open(cls, profile, ordinal):
        rank = dist.get_rank()
        why = cls.plot.get("open", {}).get(rank)
        if why:
            raise artune.ArtuneError(why)
        return cls(rank)

    @property
    def bus_id(self):
        return self.plot.get("bus", {}).get(self.rank, "0000:00:06.0")

    def allocate(self, rank, world, ranks_on_gpu, routes):
        self.routes = routes
        self.calls.append(("allocate", rank, world, ranks_on_gpu, routes.buffers))
        return f"handles of rank {rank}"

    def connect(self, handles):
        self.calls.append(("connect", list(handles)))
        why = self.plot.get("connect", {}).get(self.rank)
        if why:
            raise artune.ArtuneError(why)

    def memory(self):
        return [(b, m, 1 << 20, 1 << 20) for b, m in self.routes.buffers]

    def route(self, nbytes, graph):
        # The real routing (artune's Routes over the profile), as the native op answers it.
        b = self.routes.backend(nbytes, "graph" if graph else "eager")
        return -1 if b is None else artune.backends().index(b)

    def launch(self, code, inp, out, nbytes, stream, repeat=1, registered=False):
        if self.plot.get("launch"):
            raise artune.ArtuneError("scripted launch failure")
        self.calls.append(("launch", artune.backends()[code], nbytes, self.graph))
        if registered:
            self.calls.append(("recorded", artune.backends()[code]))
        self.pointers = (inp, out)
        # The kernel of this launch finds a wait of the group given up, as the real one
        # reports it: in the host word the op reads.
        if self.plot.get("fault_at") == len([c for c in self.calls if c[0] == "launch"]):
            self.fault_word = 1

    def faulted(self):
        return getattr(self, "fault_word", 0) != 0

    def failed(self):
        return []

    def disconnect(self):
        self.calls.append(("disconnect",))

    # The registered form's bookkeeping, as the native op keeps it: calls recorded while
    # capturing, published and registered by the group's exchange.
    def publish_graph_inputs(self):
        return [f"rank {self.rank} call {i}" for i, c in enumerate(self.pending())]

    def pending(self):
        done = sum(c[1] for c in self.calls if c[0] == "registered")
        return [c for c in self.calls if c[0] == "recorded"][done:]

    def register_graph_inputs(self, published):
        n = len(self.pending())
        self.calls.append(("registered", n))
        return n

    def graph_calls(self):
        n = len(self.pending())
        return len([c for c in self.calls if c[0] == "recorded"]) - n, n

    def missed_registration(self):
        # A replay found a call unregistered: once, after the launch the plot says.
        launches = len([c for c in self.calls if c[0] == "launch"])
        if self.plot.get("missed_at") == launches and not getattr(self, "told", False):
            self.told = True
            return True
        return False

    def registration_bytes(self):
        return 2 << 20

    def stream(self):
        return 0

    def capturing(self):
        return self.graph


def _rank(rank, world, store, fn, args, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    try:
        result = fn(rank, *args)
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def ranks(world, fn, *args):
    """Runs fn(rank, *args) in `world` processes of one gloo group; returns their results."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        mp.spawn(_rank, args=(world, os.path.join(d, "store"), fn, args, out), nprocs=world)
        results = []
        for r in range(world):
            with open(f"{out}.{r}") as f:
                results.append(json.load(f))
        return results


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def _create(path, plot=None, **kw):
    Fake.plot = plot or {}
    log = logging.getLogger(f"engine-{dist.get_rank()}")
    log.setLevel(logging.INFO)
    h = Lines()
    log.addHandler(h)
    op = allreduce.Allreduce.create(dist.group.WORLD, path, logger=log, **kw)
    return op, h.lines


def _dispatch(rank, path):
    op, lines = _create(path, _native=Fake)
    assert op is not None, lines
    p = artune.Profile.load(path)
    seen = []
    for graph in (False, True):
        op._native.graph = graph
        mode = "graph" if graph else "eager"
        for nbytes in (1024, 4096, 65536, 1 << 20, 4 << 20, 64 << 20, 128 << 20):
            t = torch.ones(nbytes // 2, dtype=torch.bfloat16)
            choice = p.select(2, nbytes, mode)
            want = choice is not None and choice.custom
            got = op.should_run(t)
            seen.append([mode, nbytes, want, got])
            if got:
                op.all_reduce(t)
                assert op._native.calls[-1] == ("launch", choice.backend, nbytes, graph)
    t = torch.ones(2048, dtype=torch.bfloat16)
    others = [op.should_run(t.float()), op.should_run(t[::2]), op.should_run(t[1:-7])]
    # In place: the kernel gets a tensor of its own to write, never its input.
    assert op.all_reduce(t, out=t) is t
    inp, out = op._native.pointers
    assert inp == t.data_ptr() and out != inp
    native = op._native
    op.close()
    return {"seen": seen, "others": others, "lines": lines,
            "closed": native.calls[-1] == ("disconnect",) and not op.should_run(t)}


def test_the_op_takes_the_sizes_the_profile_gives_its_kernels_and_no_others(measured):
    for r in ranks(2, _dispatch, measured["measured"]):
        for mode, nbytes, want, got in r["seen"]:
            assert got == want, (mode, nbytes)
        assert any(w for _, _, w, _ in r["seen"]) and not all(w for _, _, w, _ in r["seen"])
        # Another dtype than the profile's, a strided view, a misaligned one: the engine's.
        assert r["others"] == [False, False, False]
        info = [m for lvl, m in r["lines"] if lvl == "INFO"]
        assert len(info) == 1 and "TP2 bf16" in info[0], r["lines"]
        assert r["closed"]


def _exchange(rank, path, bus):
    op, lines = _create(path, {"bus": bus}, _native=Fake)
    return {"calls": op._native.calls if op else None, "lines": lines}


def test_every_rank_connects_with_every_ranks_handles_in_rank_order(measured):
    world = 4
    buses = {r: f"0000:0{r}:00.0" for r in range(world)}
    res = ranks(world, _exchange, measured["quad"], buses)
    for r, got in enumerate(res):
        allocate, connect = got["calls"]
        assert allocate[1:4] == [r, world, 1]
        assert connect == ["connect", [f"handles of rank {i}" for i in range(world)]]
    # Ranks on one GPU (loopback) plan for sharing it, every one alike.
    res = ranks(world, _exchange, measured["quad"], {0: "a", 1: "a", 2: "b", 3: "c"})
    assert [g["calls"][0][3] for g in res] == [2] * world
    res = ranks(2, _exchange, measured["measured"], {})
    assert [g["calls"][0][3] for g in res] == [2, 2]


def _refused(rank, path, plot, kw):
    native = {"fake": Fake, "real": allreduce.AllreduceKernels}
    kw = {k: native.get(v, v) for k, v in kw.items()}
    op, lines = _create(path, plot, **kw)
    return {"op": op is not None, "lines": lines}


@pytest.mark.parametrize("where", ["open", "connect"])
def test_one_ranks_failure_leaves_every_rank_on_the_engines_path(measured, where):
    plot = {where: {1: "GPU 1 could not open rank 0's flags (no P2P)"}}
    for r in ranks(2, _refused, measured["measured"], plot, {"_native": "fake"}):
        assert not r["op"]
        assert len(r["lines"]) == 1, r["lines"]
        lvl, msg = r["lines"][0]
        assert lvl == "WARNING" and "rank 1: GPU 1 could not open" in msg, msg
        assert msg.endswith("the engine keeps its own allreduce")


def test_a_profile_without_kernel_hashes_or_a_gpu_is_refused_in_one_line(measured):
    # The real device layer: an older profile is refused before any GPU is touched.
    for r in ranks(2, _refused, measured["old"], {}, {}):
        assert not r["op"] and len(r["lines"]) == 1, r["lines"]
        msg = r["lines"][0][1]
        if torch.cuda.is_available():
            assert "records no kernel hashes" in msg, msg
        else:
            assert "torch sees no CUDA device" in msg, msg
    for r in ranks(2, _refused, measured["old"], {}, {"_native": "real"}):
        assert "records no kernel hashes" in r["lines"][0][1], r["lines"]
    # A simulated profile records none either.
    for r in ranks(2, _refused, measured["simulated"], {}, {"_native": "real"}):
        assert "records no kernel hashes" in r["lines"][0][1], r["lines"]
    # With the hashes, the real device layer finds no driver here.
    for r in ranks(2, _refused, measured["measured"], {}, {"_native": "real"}):
        assert not r["op"] and len(r["lines"]) == 1
        if not os.path.exists("/dev/nvidiactl"):
            assert "driver" in r["lines"][0][1] or "GPU" in r["lines"][0][1], r["lines"]


def test_what_the_profile_does_not_route_is_refused_in_one_line(measured, profiles):
    # TP3: no group; the plain pair: NCCL at every size.
    for r in ranks(3, _refused, measured["measured"], {}, {"_native": "fake"}):
        assert not r["op"] and "has no TP3 group" in r["lines"][0][1], r["lines"]
    for r in ranks(2, _refused, profiles["pair_nccl"], {}, {"_native": "fake"}):
        assert not r["op"] and "chooses no custom kernel" in r["lines"][0][1], r["lines"]


def _failing_launch(rank, path):
    op, _ = _create(path, _native=Fake)
    log = logging.getLogger(f"engine-{rank}")
    h = Lines()
    log.addHandler(h)
    Fake.plot = {"launch": True}
    t = torch.full((2048,), float(rank + 1), dtype=torch.bfloat16)
    assert op.should_run(t)
    out = op.all_reduce(t)
    return {"sum": out.float().tolist()[:4], "after": op.should_run(t), "lines": h.lines}


def test_a_failing_launch_falls_back_to_the_groups_own_allreduce_once(measured):
    for r in ranks(2, _failing_launch, measured["measured"]):
        assert r["sum"] == [3.0] * 4
        assert r["after"] is False
        assert len(r["lines"]) == 1 and "are off from now on" in r["lines"][0][1]


def _peer_fault(rank, path):
    """Two ops in a row: the fault seen first by should_run, then by all_reduce alone (an
    engine that calls it without asking, as under its own routing)."""
    out = {}
    for first in ("should_run", "all_reduce"):
        op, _ = _create(path, {"fault_at": 2}, _native=Fake)
        log = logging.getLogger(f"engine-{rank}")
        h = Lines()
        log.addHandler(h)
        t = torch.full((2048,), float(rank + 1), dtype=torch.bfloat16)
        asked, sums = [], []
        for call in range(4):
            if first == "should_run" or call < 2:
                asked.append(op.should_run(t))
            sums.append(op.all_reduce(t).float().tolist()[:2])
        # The engine's own allreduce, where it gives one.
        mine = op.all_reduce(t, fallback=lambda x: x * 10)
        launches = [c for c in op._native.calls if c[0] == "launch"]
        log.removeHandler(h)
        op.close()
        out[first] = {"asked": asked, "sums": sums, "launches": len(launches),
                      "own": mine.float().tolist()[:2], "lines": h.lines}
    return out


def test_a_wait_that_gave_up_answers_nan_on_every_rank_in_one_line_and_never_falls_back(
        measured):
    for rank, r in enumerate(ranks(2, _peer_fault, measured["measured"])):
        for first, got in r.items():
            # Two calls ran the kernels (the second one's set the fault word); every call
            # after answers NaN without launching and without the engine's own allreduce,
            # which could pair different calls on different ranks.
            assert got["launches"] == 2, (first, got)
            assert all(math.isnan(x) for s in got["sums"][2:] for x in s), (first, got)
            assert all(math.isnan(x) for x in got["own"]), (first, got)
            if first == "should_run":
                # The routes stay: every rank takes the same calls as before.
                assert got["asked"] == [True] * 4, got
            assert len(got["lines"]) == 1, got["lines"]
            lvl, msg = got["lines"][0]
            assert lvl == "WARNING", msg
            assert msg == (f"artune: a barrier on rank {rank} gave up waiting for a peer for 5 s:"
                           " the TP group is broken (a peer died or stalled); artune's allreduce"
                           " answers NaN from now on, as on every rank, rather than pair"
                           " different calls through the engine's own; restart the engine"), msg


def _no_exchange(rank, path):
    def broken(*a, **k):
        raise RuntimeError("connection reset by peer")

    dist.all_gather_object, saved = broken, dist.all_gather_object
    try:
        op, lines = _create(path, _native=Fake)
    finally:
        dist.all_gather_object = saved
    return {"op": op is not None, "lines": lines}


def test_a_group_that_cannot_exchange_handles_leaves_the_engines_path(measured):
    for r in ranks(2, _no_exchange, measured["measured"]):
        assert not r["op"] and len(r["lines"]) == 1
        assert "could not exchange handles (RuntimeError: connection reset" in r["lines"][0][1]
    log = logging.getLogger("no-group")
    h = Lines()
    log.addHandler(h)
    assert allreduce.Allreduce.create(None, measured["measured"], logger=log) is None
    assert len(h.lines) == 1 and "process group cannot be read" in h.lines[0][1]


def test_routes_match_the_selector_and_force_sizes_as_the_tune(measured):
    p = artune.Profile.load(measured["measured"])
    r = allreduce.Routes.from_profile(p, 2)
    for mode in ("graph", "eager"):
        for nbytes in (4096, 1 << 20, 64 << 20):
            c = p.select(2, nbytes, mode)
            assert r.backend(nbytes, mode) == (c.backend if c and c.custom else None)
    f = allreduce.Routes.forced(p, 2, "two_stage_push")
    ((b, up_to),) = f.buffers
    assert b == "two_stage_push" and up_to == 64 << 20  # the tune's largest size
    with pytest.raises(artune.BadInputError):
        allreduce.Routes.forced(p, 2, "nccl")
    assert allreduce.ranks_per_gpu(["a", "a", "b"]) == 2


def _captures(rank, path):
    op, lines = _create(path, _native=Fake)
    t = torch.ones(2048, dtype=torch.bfloat16)
    native = op._native
    seen = {}
    # Captured outside capture(), without register_graphs: the staged form, nothing recorded.
    native.graph = True
    op.all_reduce(t)
    seen["outside"] = native.graph_calls()
    with op.capture():
        op.all_reduce(t)
        native.graph = False
        op.all_reduce(t)  # an eager call inside the block stages
        native.graph = True
        op.all_reduce(t)
        seen["inside"] = native.graph_calls()
    seen["after"] = native.graph_calls()
    op.all_reduce(t)
    seen["later"] = native.graph_calls()
    seen["registered"] = [c[1] for c in native.calls if c[0] == "registered"]
    op.close()
    return seen


def test_calls_captured_inside_capture_take_the_registered_form_and_are_registered_at_its_end(
        measured):
    for r in ranks(2, _captures, measured["measured"]):
        # (registered, waiting): two graph calls recorded inside, registered by the exit on
        # every rank alike; outside the block graph calls stage as before.
        assert r["outside"] == [0, 0], r
        assert r["inside"] == [0, 2], r
        assert r["after"] == [2, 0], r
        assert r["later"] == [2, 0], r
        assert r["registered"] == [2], r


def _forms(rank, path, form):
    """One op's calls through ``form``: the op's own ``all_reduce`` and ``should_run`` (the
    native path) or the Python form of each (``Allreduce.all_reduce(op, ...)``): per call what
    the device layer was asked, where the result lies, its values where the kernels did not
    write it, and the lines logged."""
    op, _ = _create(path, {"missed_at": 2}, _native=Fake, register_graphs=True)
    log = logging.getLogger(f"engine-{rank}")
    h = Lines()
    log.addHandler(h)
    native = op._native
    if form == "native":
        call, ask = op.all_reduce, op.should_run
    else:
        call = functools.partial(allreduce.Allreduce.all_reduce, op)
        ask = functools.partial(allreduce.Allreduce.should_run, op)
    bf = dict(dtype=torch.bfloat16)
    t = torch.full((2048,), float(rank + 1), **bf)
    outs = {
        "none": None,
        "given": torch.empty(2048, **bf),
        "in place": t,
        "fp32": torch.empty(2048),
        "strided": torch.empty(4096, **bf)[::2],
        "misaligned": torch.empty(2056, **bf)[1:2049],
    }
    seen = []

    def record(what, fn):
        t.fill_(rank + 1)  # the fake's in-place call copied back what it never wrote
        before, lines = len(native.calls), len(h.lines)
        got = fn()
        new = [list(c) for c in native.calls[before:]]
        if isinstance(got, torch.Tensor):
            launched = any(c[0] == "launch" for c in new)
            # The values only where no kernel was to write them (a fake writes nothing).
            got = {"out ptr": native.pointers[1] == got.data_ptr() if launched else None,
                   "input ptr": got.data_ptr() == t.data_ptr(),
                   "values": None if launched else got.float().tolist()[:2]}
        seen.append([what, new, got, h.lines[lines:]])

    for graph in (False, True):
        native.graph = graph
        for name, out in outs.items():
            record(f"{graph} {name}", lambda: call(t, out))
        for name, x in (("t", t), ("fp32", t.float()), ("strided", t[::2]),
                        ("misaligned", t[1:-7]), ("1 MiB", torch.ones(1 << 19, **bf))):
            record(f"{graph} should_run {name}", lambda: ask(x))
    native.graph = False
    record("backend", lambda: call(t, backend="two_stage_push"))
    record("unknown backend", lambda: call(t, backend="no such kernel"))
    record("off", lambda: call(t))
    record("off, should_run", lambda: ask(t))
    record("off, its fallback", lambda: call(t, fallback=lambda x: x * 10))
    op.close()
    return {"seen": seen, "native path": isinstance(call, type(len))}


def test_the_native_call_answers_every_call_as_the_python_form_does(measured):
    """Every kind of call (outputs the kernels can and cannot write, graph and eager, the
    registered form, a missed registration, a launch that fails, the op off) asked of the
    op's native call and of the Python form, on ops alike: the same launches, the same result
    and the same lines."""
    native = ranks(2, _forms, measured["measured"], "native")
    python = ranks(2, _forms, measured["measured"], "python")
    for n, p in zip(native, python):
        assert n["native path"] and not p["native path"]
        assert len(n["seen"]) == len(p["seen"])
        for a, b in zip(n["seen"], p["seen"]):
            assert a == b, (a, b)
    seen = {w: (calls, got, lines) for w, calls, got, lines in native[0]["seen"]}
    # The cases are what they say: the kernels wrote a given output that fits, never the
    # input; the registered form while capturing; the missed line once; off after a failure.
    assert seen["False given"][1]["out ptr"] is True
    assert seen["False in place"][1] == {"out ptr": False, "input ptr": True, "values": None}
    assert any(c[0] == "recorded" for c in seen["True none"][0]), seen["True none"]
    assert not any(c[0] == "recorded" for c in seen["False none"][0]), seen["False none"]
    assert sum(1 for _, _, lines in seen.values() for ln in lines
               if ln[1] == allreduce.MISSED) == 1
    assert seen["False should_run t"][1] is True
    assert seen["False should_run fp32"][1] is False
    assert "are off from now on" in seen["unknown backend"][2][0][1]
    assert seen["off"][0] == [] and seen["off"][1]["values"] == [3.0, 3.0]
    assert seen["off, its fallback"][1]["values"] == [10.0, 10.0]


def _frames(rank, path):
    op, _ = _create(path, _native=Fake)
    t, o = torch.ones(2048, dtype=torch.bfloat16), torch.empty(2048, dtype=torch.bfloat16)
    frames = {}
    for form, call in (("native", lambda: (op.should_run(t), op.all_reduce(t, o),
                                           op.all_reduce(t))),
                       ("python", lambda: (allreduce.Allreduce.should_run(op, t),
                                           allreduce.Allreduce.all_reduce(op, t, o)))):
        got = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename == allreduce.__file__:
                got.append(frame.f_code.co_name)

        sys.setprofile(profile)
        try:
            call()
        finally:
            sys.setprofile(None)
        frames[form] = got
    launches = len([c for c in op._native.calls if c[0] == "launch"])
    op.close()
    return {"frames": frames, "launches": launches}


def test_an_eager_call_runs_no_python_of_the_op(measured):
    """The op's eager call is one native call: no frame of artune.allreduce runs in it (the
    device layer here is the tests' fake, in Python; on a GPU it is Rust too)."""
    for r in ranks(2, _frames, measured["measured"]):
        assert r["launches"] == 3
        assert r["frames"]["native"] == [], r["frames"]
        assert "all_reduce" in r["frames"]["python"], r["frames"]
