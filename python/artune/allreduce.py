"""artune's own allreduce kernels inside an engine: the kernels the profile timed, run on the
engine's TP group and on torch's current stream.

    import torch.distributed as dist
    from artune.allreduce import Allreduce

    ar = Allreduce.create(tp_group, "/etc/artune/profile.json", logger=log)  # every rank
    ...
    if ar is not None and ar.should_run(x):
        y = ar.all_reduce(x)             # eager, or inside torch.cuda.graph capture
    else:
        dist.all_reduce(x, group=tp_group)  # the engine's own path, as without artune

``create`` is collective over the group: every rank gets an op, or every rank gets None with
one warning line saying why (no GPU, no kernel hashes in the profile or other kernels than the
ones it timed, nothing the profile routes to artune's kernels, a peer whose buffers cannot be
opened, a group that cannot exchange handles). Nothing here raises into the engine.

Where the tensors meet the shared buffers: the kernel itself reads the engine's input and writes
the engine's output. Where peers read a rank's input (the pull kernels, the island kernels that
pull inside an island) each block first stages its part of the input into the shared input,
published by the kernel's first barrier; where peers write a rank's output (two-stage push, the
island kernels that push inside) the kernel copies it out of the shared output after the
barrier that says it landed. The tune times the kernels with these copies, and under CUDA-graph
capture each call is one kernel node: the graph records the tensors' addresses (the capture's
own memory pool keeps them fixed) and every replay stages the bytes again inside the kernel.

Graph mode without staging (``register_graphs=True``), as vLLM's and SGLang's custom allreduce run
CUDA graphs: while torch captures, the pull kernels (one-stage and two-stage pull), two-stage
push and the island kernels run their registered form, and the op records each call's input
(pull, island one-shot: peers read it), output (push: peers write it) or both (island two-shot). After capturing, every rank calls
:meth:`Allreduce.register_graph_buffers` (or captures inside ``with ar.capture():``, which calls it
on exit, and which the engine plugins wrap the engine's graph capture in): one exchange of the
group maps every rank's captured tensors into its peers, and replays read or write them where they
lie, with nothing staged and no extra barrier. A replay before that call (or
after :meth:`Allreduce.unregister_graph_buffers`) reads no peer address: its output is NaN, never a
sum that looks right, and the op says so in one line at its next call (``MISSED``). Eager calls
keep staging. Without ``register_graphs`` graph mode stages as eager mode does.

Each call is one native call: an op's ``all_reduce`` and ``should_run`` are the methods of its
``artune._artune.EagerPath``, which reads the tensors' fields, the routes and torch's current
stream (torch's raw getter, a C function) and launches, with no Python frame in between; the
methods of the class below are the Python form of the same calls, which the native one hands
the rare cases (an output the kernels cannot write, a failed launch, a broken group, an op off
or closed), so both answer alike. benches/op_overhead.py times the call against the raw launch,
with ``out`` and without (where torch's allocator is part of the call). It is not a torch
custom op: a native kernel in torch's dispatcher needs C++ built against the installed libtorch
(or its versioned C shim), which one wheel for every engine's torch cannot carry and CI (no
CUDA, no C++ torch extension) cannot build, and an eager ``torch.ops`` call from Python runs the
op packet's Python ``__call__`` and a boxed dispatch before the kernel: more than this call.

A peer that dies mid-call cannot be recovered from (no custom allreduce can). The kernels do
not hang and never return a sum that looks right but is not: a barrier that waits for a peer
gives up after 5 s, marks every rank of the group failed, and each rank's kernel leaves its
output all NaN, in that call and every later one (``failed()`` lists the backends). The kernel
also sets a word of host memory, which the op reads before every call without synchronizing:
once set, the op logs one warning line and from then on answers every call it takes with NaN,
without launching. It does not hand calls to the engine's own allreduce: each rank reads the
word at a call of its own (the calls queued before it returned NaN from the kernels), so their
fallbacks would pair different calls into sums that look right. The group is broken: restart
the engine (docs/ENGINES.md). Under CUDA-graph replay the host is not called, and the replayed
kernels return NaN. Whether the dead process's buffers stay mapped for the others is the
driver's; the engine's own collectives then fail on the dead rank as they would without artune.
Tear an op down on every rank together (``close()``) and never while a captured graph that uses
it may still be replayed.
"""

import contextlib
import logging
import weakref
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import ArtuneError, Profile
from ._artune import AllreduceKernels, EagerPath, Routes, backends, ranks_per_gpu

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_CODES = {b: i for i, b in enumerate(backends())}

#: The end of every refusal: what the engine does instead.
KEEPS = "the engine keeps its own allreduce"

#: Logged once when the kernels report a wait that gave up (rank, then the limit in seconds).
FAULT = ("artune: a barrier on rank %d gave up waiting for a peer for %d s: the TP group is "
         "broken (a peer died or stalled); artune's allreduce answers NaN from now on, as on "
         "every rank, rather than pair different calls through the engine's own; restart the "
         "engine")
#: Logged once per occurrence when a replayed call found its captured inputs unregistered.
MISSED = ("artune: a CUDA graph replayed allreduce calls captured after the last "
          "register_graph_buffers(): their results are NaN; call ar.register_graph_buffers() on "
          "every rank after capturing and before replaying")
#: The barrier's limit (BARRIER_TIMEOUT_NS in kernels/common.cuh).
BARRIER_TIMEOUT_S = 5


def _gather(group, mine) -> list:
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, mine, group=group)
    return out


def _first_error(replies: Sequence) -> Optional[str]:
    for rank, r in enumerate(replies):
        if r is None or r[0] is not None:
            return f"rank {rank}: {r[0] if r else 'no reply'}"
    return None


class Allreduce:
    """One rank's op; build it with :meth:`create` on every rank of the group."""

    def __init__(self, group, native, routes, device, rank, world, log, stream, capturing,
                 register_graphs=False, stream_ordinal=None):
        self.group = group
        self.device = device
        self.rank = rank
        self.world = world
        self.routes = routes
        self._native = native
        self._dtype = next(t for t, i in _DTYPES.items() if i == routes.dtype)
        self._log = log
        self._stream_of, self._ordinal = stream, stream_ordinal
        self._capturing = capturing
        self._register_graphs = register_graphs
        # The per-call path, natively: each call of this op is one native call (EagerPath),
        # which hands the rare cases to the methods of the same names below. Its flags are
        # this op's state (the properties below).
        self._path = EagerPath(native, owner=weakref.ref(self), dtype=self._dtype,
                               device=device, stream=stream, ordinal=stream_ordinal,
                               capturing=capturing, empty_like=torch.empty_like,
                               slow=Allreduce.all_reduce, failed=Allreduce._launch_failed,
                               missed=Allreduce._said_missed, fault=Allreduce._faulted,
                               register_graphs=register_graphs)
        self.all_reduce = self._path.all_reduce
        self.should_run = self._path.should_run

    #: Off after a failure or ``close()``: every call takes the engine's path.
    _off = property(lambda self: self._path.off,
                    lambda self, v: setattr(self._path, "off", v))
    #: The group is broken (module docs): every call answers NaN.
    _broken = property(lambda self: self._path.broken,
                       lambda self, v: setattr(self._path, "broken", v))
    #: Inside :meth:`capture`: captured calls take the registered form.
    _in_capture = property(lambda self: self._path.in_capture,
                           lambda self, v: setattr(self._path, "in_capture", v))
    #: Whether any call may have taken it (the one line on a missed registration).
    _registers = property(lambda self: self._path.registers,
                          lambda self, v: setattr(self._path, "registers", v))

    def _stream(self) -> int:
        """torch's current raw stream on this op's device."""
        if self._ordinal is None:
            return self._stream_of()
        return self._stream_of(self._ordinal)

    @classmethod
    def create(
        cls,
        group,
        profile,
        *,
        device=None,
        logger: Optional[logging.Logger] = None,
        only: Optional[List[str]] = None,
        force: Optional[str] = None,
        max_bytes: Optional[int] = None,
        register_graphs: bool = False,
        _native=None,
    ) -> Optional["Allreduce"]:
        """The op for this rank of ``group`` (a torch process group whose world size is the TP
        size, gloo or NCCL), following ``profile`` (a path or an ``artune.Profile``), or None
        on every rank with one warning line.

        ``only``: route only these backends (those the engine lacks). ``force``: run that
        backend at every size up to ``max_bytes`` (default: as the tune sized its buffers),
        whatever the profile chose, for proofs and benchmarks; the kernels are still checked
        against the profile's. ``register_graphs``: the engine calls
        :meth:`register_graph_buffers` after capturing, so captured calls read the peers'
        tensors without staging (module docs). ``_native`` replaces the device layer in tests."""
        log = logger or logging.getLogger("artune")
        op, why = cls.build(group, profile, device=device, logger=log, only=only, force=force,
                            max_bytes=max_bytes, register_graphs=register_graphs,
                            _native=_native)
        if op is None:
            log.warning("artune: allreduce kernels not used: %s; %s", why, KEEPS)
        else:
            log.info("artune: allreduce kernels serve %s; buffers %s", why,
                     op.describe_memory())
        return op

    @classmethod
    def build(
        cls,
        group,
        profile,
        *,
        device=None,
        logger: Optional[logging.Logger] = None,
        only: Optional[List[str]] = None,
        force: Optional[str] = None,
        max_bytes: Optional[int] = None,
        register_graphs: bool = False,
        _native=None,
    ) -> Tuple[Optional["Allreduce"], str]:
        """:meth:`create` without its log line, for callers that say it in their own (the
        engine plugins' start-up line): (the op, what it routes) on every rank, or (None, why
        not) on every rank. Never raises."""
        log = logger or logging.getLogger("artune")
        try:
            rank, world = dist.get_rank(group), dist.get_world_size(group)
        except Exception as e:  # noqa: BLE001 - no group, or not initialised: refuse
            return None, f"the process group cannot be read ({type(e).__name__}: {e})"

        # Local work first; every failure is agreed on below, so every rank leaves together.
        err, native, routes, bus = None, None, None, None
        try:
            p = profile if isinstance(profile, Profile) else Profile.load(profile)
            if force is not None:
                routes = Routes.forced(p, world, force, max_bytes)
            else:
                routes = Routes.from_profile(p, world, only)
            if _native is None:
                if not torch.cuda.is_available():
                    raise ArtuneError("torch sees no CUDA device")
                device = torch.device("cuda", torch.cuda.current_device()) if device is None \
                    else torch.device(device)
                if device.type != "cuda":
                    raise ArtuneError(f"{device} is not a CUDA device")
                torch.cuda.set_device(device)
                # torch's context is current on this thread before artune binds its own.
                torch.cuda.current_stream(device).synchronize()
            else:
                device = torch.device("cpu") if device is None else torch.device(device)
            native = (_native or AllreduceKernels).open(p, device.index or 0)
            bus = native.bus_id
        except ArtuneError as e:
            err = str(e)
        except Exception as e:  # noqa: BLE001 - whatever failed, the engine goes on without
            err = f"{type(e).__name__}: {e}"
        try:
            replies = _gather(group, (err, bus))
            why = _first_error(replies)
            if why:
                return None, why
            on_gpu = ranks_per_gpu([r[1] for r in replies])
            # Ranks that share a GPU allocate in turns, so each measures only its own memory.
            err, handles = None, None
            for turn in (range(world) if on_gpu > 1 else [rank]):
                if turn == rank:
                    try:
                        handles = native.allocate(rank, world, on_gpu, routes)
                    except Exception as e:  # noqa: BLE001
                        err = str(e) if isinstance(e, ArtuneError) else f"{type(e).__name__}: {e}"
                if on_gpu > 1:
                    dist.barrier(group)
            replies = _gather(group, (err, handles))
            why = _first_error(replies)
            if why:
                return None, why
            try:
                native.connect([r[1] for r in replies])
            except Exception as e:  # noqa: BLE001
                err = str(e) if isinstance(e, ArtuneError) else f"{type(e).__name__}: {e}"
            why = _first_error(_gather(group, (err, None)))
            if why:
                return None, why
        except Exception as e:  # noqa: BLE001 - the group could not exchange: nobody uses it
            return None, (f"the process group could not exchange handles "
                          f"({type(e).__name__}: {e})")
        if _native is None:
            # torch's C getters (torch.cuda.current_stream(device).cuda_stream and
            # is_current_stream_capturing read the same), called without a Python frame.
            ordinal = torch.cuda.current_device() if device.index is None else device.index
            stream = torch._C._cuda_getCurrentRawStream
            capturing: Callable[[], bool] = torch._C._cuda_isCurrentStreamCapturing
        else:
            stream, ordinal, capturing = native.stream, None, native.capturing
        op = cls(group, native, routes, device, rank, world, log, stream, capturing,
                 register_graphs, ordinal)
        return op, routes.describe()

    def should_run(self, inp: torch.Tensor) -> bool:
        """Whether artune's kernels take this tensor: the profile's dtype, contiguous, 16-byte
        aligned, on this op's device, at a size (and mode: graph while torch captures) the
        routes give them."""
        # A broken group (see the module docs) keeps its routes: every rank alike answers NaN.
        self._faulted()
        self._missed()
        if self._off or inp.dtype is not self._dtype or inp.device != self.device:
            return False
        if not inp.is_contiguous() or inp.data_ptr() % 16:
            return False
        nbytes = inp.numel() * inp.element_size()
        return self._native.route(nbytes, self._capturing()) >= 0

    def all_reduce(self, inp: torch.Tensor, out: Optional[torch.Tensor] = None,
                   backend: Optional[str] = None,
                   fallback: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                   ) -> torch.Tensor:
        """The sum of ``inp`` over the group, in ``out`` (a new tensor by default), queued on
        torch's current stream. Call it where :meth:`should_run` said yes, on every rank alike;
        ``backend`` names a prepared kernel instead of the profile's (proofs, benchmarks).
        ``fallback``: the engine's own out-of-place allreduce, which serves this call where the
        kernels fail (default: ``torch.distributed`` on the op's group). This is the Python
        form; ``op.all_reduce`` is the native one (module docs), which calls this one for
        the cases it does not take itself."""
        if out is None:
            out = torch.empty_like(inp)
        self._missed()
        if self._faulted():
            return out.fill_(float("nan"))
        if self._off:
            return self._fallback(inp, out, fallback)
        nbytes = inp.numel() * inp.element_size()
        code = (self._native.route(nbytes, self._capturing()) if backend is None
                else _CODES.get(backend, -1))
        # The kernels write a distinct, aligned tensor of the input's kind; anything else (an
        # in-place call) gets one and a copy back.
        fits = (out.dtype is inp.dtype and out.numel() == inp.numel() and out.is_contiguous()
                and out.device == inp.device and out.data_ptr() % 16 == 0
                and out.data_ptr() != inp.data_ptr())
        dst = out if fits else torch.empty_like(inp)
        try:
            if code < 0:
                raise ArtuneError(f"{nbytes} bytes is not routed to artune's kernels")
            self._native.launch(code, inp.data_ptr(), dst.data_ptr(), nbytes, self._stream(),
                                **self._registered())
            if dst is not out:
                out.copy_(dst.view_as(out))
        except Exception as e:  # noqa: BLE001 - a bug of artune's: the group's own path
            return self._launch_failed(e, inp, out, fallback)
        return out

    def _launch_failed(self, e: BaseException, inp: torch.Tensor, out: torch.Tensor,
                       fallback: Optional[Callable[[torch.Tensor], torch.Tensor]]
                       ) -> torch.Tensor:
        """A call the kernels could not take: the op off from now on, in one line, and this
        call served by the fallback."""
        self._off = True
        self._log.warning("artune: allreduce kernels failed (%s: %s) and are off from now "
                          "on; %s", type(e).__name__, e, KEEPS)
        return self._fallback(inp, out, fallback)

    def _registered(self) -> dict:
        """The launch's keyword for the registered form: while torch captures a graph that
        will be registered (``register_graphs``, or inside :meth:`capture`)."""
        on = (self._register_graphs or self._in_capture) and self._capturing()
        return {"registered": True} if on else {}

    def _faulted(self) -> bool:
        """Whether the kernels reported a wait of the group that gave up (a host read, no
        CUDA call); the first time, says so in one line."""
        if self._broken:
            return True
        if self._native is None or not self._native.faulted():
            return False
        self._broken = True
        self._log.warning(FAULT, self.rank, BARRIER_TIMEOUT_S)
        return True

    def _missed(self) -> None:
        """Says so in one line where a replay found its captured inputs unregistered."""
        if self._registers and self._native is not None \
                and self._native.missed_registration():
            self._said_missed()

    def _said_missed(self) -> None:
        self._log.warning(MISSED)

    def register_graph_buffers(self) -> int:
        """Maps the inputs of every call captured since the last registration into the peers
        (one exchange of the group: call it on every rank after capturing, before replaying,
        as vLLM's ``register_graph_buffers``). Returns how many calls were registered. Where it
        fails, the op says why in one line and is off from then on (the engine's own path);
        replays of the graphs captured stay NaN: capture them again."""
        if self._native is None:
            return 0
        err, mine = None, None
        try:
            mine = self._native.publish_graph_inputs()
        except Exception as e:  # noqa: BLE001
            err = str(e) if isinstance(e, ArtuneError) else f"{type(e).__name__}: {e}"
        try:
            replies = _gather(self.group, (err, mine))
            why = _first_error(replies)
            count = 0
            if why is None:
                try:
                    count = self._native.register_graph_inputs([r[1] for r in replies])
                except Exception as e:  # noqa: BLE001
                    err = str(e) if isinstance(e, ArtuneError) else f"{type(e).__name__}: {e}"
                why = _first_error(_gather(self.group, (err, None)))
        except Exception as e:  # noqa: BLE001 - the group could not exchange
            why = f"the process group could not exchange handles ({type(e).__name__}: {e})"
        if why is not None:
            self._off = True
            self._log.warning("artune: captured allreduce calls could not be registered (%s); "
                              "their replays return NaN: capture the graphs again; %s", why,
                              KEEPS)
            return 0
        return count

    def unregister_graph_buffers(self) -> None:
        """Drops every registration (after draining this rank's work): replays of graphs
        captured so far return NaN. Call it before freeing a registered graph's memory."""
        if self._native is not None:
            self._native.unregister_graph_inputs()

    def graph_calls(self) -> Tuple[int, int]:
        """(captured calls registered, captured calls waiting for registration)."""
        return self._native.graph_calls() if self._native is not None else (0, 0)

    @contextlib.contextmanager
    def capture(self):
        """Capture inside this block, every rank: the calls captured in it take the registered
        form (also without ``register_graphs``), and on exit :meth:`register_graph_buffers`
        maps them, as vLLM's custom allreduce's ``capture()`` does. The engine plugins wrap the
        engine's graph capture in it."""
        was, self._in_capture, self._registers = self._in_capture, True, True
        try:
            yield self
        finally:
            self._in_capture = was
            self.register_graph_buffers()

    def _fallback(self, inp: torch.Tensor, out: torch.Tensor,
                  fallback: Optional[Callable[[torch.Tensor], torch.Tensor]]) -> torch.Tensor:
        """The call served by the engine's own allreduce (``fallback``), or by
        ``torch.distributed`` on the op's group."""
        if fallback is not None:
            summed = fallback(inp)
            if summed is not out:
                out.copy_(summed)
            return out
        out.copy_(inp)
        dist.all_reduce(out, group=self.group)
        return out

    def bench(self, inp: torch.Tensor, out: torch.Tensor, backend: str, calls: int) -> None:
        """Queues ``calls`` calls of ``backend`` from one native call, without the op's Python
        path: the raw launch the op's overhead is measured against (the form the op's call
        would take: registered while capturing a graph to register)."""
        self._native.launch(_CODES[backend], inp.data_ptr(), out.data_ptr(),
                            inp.numel() * inp.element_size(), self._stream(), calls,
                            **self._registered())

    def memory(self) -> list:
        """(backend, largest message, device bytes measured, bytes allocated) per backend."""
        return self._native.memory()

    def describe_memory(self) -> str:
        mine = sum(m[2] for m in self.memory())
        prof = {b: (bytes_, up_to, need) for b, bytes_, _, up_to, need in
                self.routes.profile_memory}
        parts = []
        for b, up_to, measured, _ in self.memory():
            p = prof.get(b)
            same = p is not None and p[1] == up_to
            theirs = (f"profile {p[0]}" if same else
                      f"profile {p[2]} for its chosen sizes" if p and p[2] is not None else
                      "profile: none")
            parts.append(f"{b} to {up_to} bytes {measured} ({theirs})")
        # The captured calls' slot table, held whatever the backends (the profile's memory
        # counts it in every custom kernel's figure).
        parts.append(f"graph registrations {self._native.registration_bytes()}")
        return (f"{mine / (1 << 20):.1f} MiB ({mine} bytes) per GPU measured: "
                + ", ".join(parts))

    def failed(self) -> List[str]:
        """Backends whose barrier gave up on a peer, on this rank or a peer (see the module
        docs). Synchronous: a health check, not for every call."""
        return self._native.failed()

    def close(self) -> None:
        """Releases the buffers, on every rank together: every rank stops and closes the
        peers' buffers it opened before any rank frees its own."""
        if self._native is None:
            return
        self._off = True
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        dist.barrier(self.group)  # nobody launches any more
        self._native.disconnect()
        dist.barrier(self.group)  # nobody maps a peer's buffers any more
        self._path.close()
        self._native = None
