"""artune's op inside an engine without a GPU, for the engines' dispatch tests
(test_vllm_kernels.py, test_sglang_kernels.py): the op is the real one (artune.allreduce: its
routing over the profile, its agreement over the group, its checks of each tensor); only its
device layer, which needs GPUs, is a fake that records each launch, put in at the op's own
seam (``Allreduce.build``'s ``_native``). The process group answers as every rank of it would,
as the engines' tests stub it."""

import torch

import artune
from artune import allreduce
from machines import MODES
from test_allreduce import Fake

HIDDEN = 256  # values per token where the size allows


class Device(Fake):
    """The op's device layer (artune._artune.AllreduceKernels) without a GPU: launches are
    recorded in ``Device.seen`` as "artune <backend>", beside what the engine's own paths
    record; allocations in ``Device.allocated``. Capture is torch's, as the real op reads it."""

    seen: list = []
    allocated: list = []

    def allocate(self, rank, world, ranks_on_gpu, routes):
        Device.allocated.append(("artune", routes.buffers))
        return super().allocate(rank, world, ranks_on_gpu, routes)

    def launch(self, code, inp, out, nbytes, stream, repeat=1, registered=False):
        super().launch(code, inp, out, nbytes, stream, repeat, registered)
        Device.seen.append(f"artune {artune.backends()[code]}"
                           + (" registered" if registered else ""))

    def register_graph_inputs(self, published):
        n = super().register_graph_inputs(published)
        Device.seen.append(f"artune registered {n}")
        return n

    def capturing(self):
        return torch.cuda.is_current_stream_capturing()


def every_rank_alike(monkeypatch):
    """The group's collectives, answered as every rank of it would: each rank's reply is this
    one's (the engines' tests stub the rest of torch.distributed)."""
    monkeypatch.setattr(torch.distributed, "all_gather_object",
                        lambda out, obj, group=None: out.__setitem__(slice(None),
                                                                     [obj] * len(out)))
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: None)


def fake_device(monkeypatch):
    """The fake device layer in every op the plugins build."""
    build = allreduce.Allreduce.build.__func__
    monkeypatch.setattr(allreduce.Allreduce, "build",
                        classmethod(lambda cls, *a, **k: build(cls, *a, _native=Device, **k)))
    Fake.plot = {}
    Device.seen, Device.allocated = [], []
    return Device


def message(nbytes, dtype=torch.bfloat16):
    """A message of exactly ``nbytes`` that says it is on CUDA (machines.OnCuda): tokens of
    ``HIDDEN`` values, or of fewer where the size is no whole number of those."""
    from machines import OnCuda

    size = torch.tensor([], dtype=dtype).element_size()
    assert nbytes % size == 0, (nbytes, dtype)
    width = HIDDEN
    while (nbytes // size) % width:
        width //= 2
    t = torch.empty((nbytes // size // width, width), dtype=dtype, device="meta")
    return t.as_subclass(OnCuda)


def sizes(p, tp):
    """Every edge of the profile's bands at ``tp`` and the size just above it (served by the
    next band): where the routes change, on both sides."""
    out = set()
    for mode in ("graph", "eager"):
        for b in p.bands(tp, mode):
            out.update({b.up_to_bytes, b.up_to_bytes + 512})
    return sorted(out)


#: The backends no engine has, which the plugins route to artune's kernels by default.
ISLANDS = set(artune._artune.engine_kernels("islands"))


def check_routes(p, tp, kernels, without, got):
    """``got`` (what the engine's dispatch ran per (mode, size), with the op) against the
    profile ``p``: a size the profile gives artune's kernels (its island schedules by default,
    every custom band with ``kernels="artune"``) ran them, every other size ran what it ran
    without the op (``without``). Both modes route some sizes, and not every size."""
    routed = 0
    for (mode, n), ran in got.items():
        c = p.select(tp, n, mode)  # None above the largest size measured
        takes = c is not None and (c.backend in ISLANDS if kernels is None else c.custom)
        want = f"artune {c.backend}" if takes else without[(mode, n)]
        assert ran == want, (mode, n, c and c.backend, ran)
        routed += takes
    assert 4 <= routed < len(got), routed
    assert {m for (m, _), r in got.items() if r.startswith("artune")} == set(MODES)
