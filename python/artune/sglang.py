"""SGLang plugin: every allreduce path of SGLang follows an artune profile, or is left alone
with a reason in the start-up line.

Enabled by ``ARTUNE_PROFILE=/path/profile.json``; loaded by SGLang through the entry point
``sglang.srt.plugins: artune = artune.sglang:register`` in every process before it builds its
communicators (python/sglang/srt/plugins/__init__.py ``load_plugins``; ``SGLANG_PLUGINS`` is a
whitelist). Read against the SGLang release named in engines.json, whose ``sglang.order`` lists
each path of ``GroupCoordinator.all_reduce``, how SGLang picks it and what this plugin does;
the rule (artune/_engine.py, docs/ENGINE-PATHS.md): where the profile says NCCL at a size, no
peer-to-peer path takes it; where it says custom, SGLang's own order applies.

Beyond the per-call gates:
- artune's own kernels (artune.allreduce): where the profile chooses a kernel SGLang has no
  path of (the island schedules), and at every custom size with ``ARTUNE_KERNELS=artune``
  (``ARTUNE_SGLANG_KERNELS`` for SGLang alone; ``engine``: never), ``GroupCoordinator.__init__``
  builds artune's op on each TP group's gloo group as SGLang builds the group, and
  ``GroupCoordinator.all_reduce`` hands it those sizes (messages of the profile's dtype)
  before SGLang's order. Its buffers exist before SGLang reads the free memory its KV cache is
  sized from. Where the op cannot be built (no GPU, no P2P, other kernels than the profile
  timed, a group that cannot exchange handles), SGLang's paths serve every size and the
  start-up line, then a warning, says why. Under torch.compile the traced call goes down
  SGLang's own order (the op is not traced).
- v2 (full NVLink): ``custom_all_reduce_v2.get_all_reduce_config`` returns SGLang's config with
  the 1shot_push / 1shot_pull / 2shot_pull thresholds from the profile, two-shot push off, and
  the multicast range clipped to the profile's custom band (``_pick_config`` tests it before
  the 2shot_pull limit). ``CustomAllReduceV2.__init__`` sizes its pull and push workspaces
  from this config when it is built (clipped to its ``max_size``), so the workspace is the
  profile's in every process, with ``sglang.Engine(...)`` as with ``sglang serve``; no
  environment variable is involved. The plan keeps every limit within SGLang's default 16
  MiB workspace (src/export/sglang/), so the plugin never needs to grow it; a larger
  ``SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB`` of the user's changes nothing, a smaller one
  caps the profile's limits. The limits are bands; where the profile goes custom, NCCL,
  custom, they cover NCCL sizes, so v2 is also gated per call as v1 is
  (``CustomAllReduceV2.should_custom_ar``): a size the profile gives NCCL runs NCCL.
- v1 (a PCIe pair): ``max_size`` cut to the largest custom size; per call, what the profile
  chose. v1 is one object for both modes, so where the profile lacks a mode its build and
  ``max_size`` stay SGLang's (no answer there); v2's limits of a mode it lacks stay SGLang's.
- ``GroupCoordinator.__init__``: a TP group whose size the profile gives NCCL at every size is
  built with ``use_custom_allreduce=False`` (no IPC buffers, no "Setup Custom allreduce
  failed" warning); each TP group logs one line saying what SGLang runs per size band. Groups
  other than TP keep SGLang's choice.
- FlashInfer's allreduce+RMSNorm fusion (auto-enabled for many architectures) is decided by
  the profile, as vLLM's fusion pass: it fuses only up to the profile's custom band from the
  smallest size in both modes (where the profile lacks a mode, SGLang's sizes: the fusion
  serves both); a size it refuses is declined as SGLang declines, and the norm's all-reduce
  runs. ``ARTUNE_SGLANG_FUSION=engine`` leaves it to SGLang.
- The gates refuse only SGLang's dispatch (engines.json ``asked_by``), which falls back to the
  next path; any other caller gets SGLang's own answer.
- torch.compile (``--enable-torch-compile``): SGLang's ``all_reduce`` asks its FlashInfer
  check and the layers' fused norm inside the trace, where Dynamo cannot call the extension
  module; those answers come from plain data read from the profile at start-up
  (:class:`Decided`), and since a traced graph may replay in a CUDA graph or eagerly, the
  traced FlashInfer check gives way to SGLang's order (resolved per call when the graph runs)
  where the profile gives NCCL in either mode.
- SGLang's deterministic inference: the plugin changes nothing. ``ARTUNE_SGLANG=0`` (or false,
  off, no): off.
- The start-up line is logged at INFO by each group's rank 0. ``sglang.Engine(...)`` sets
  ``log_level="error"`` when the caller passes none, dropping it with SGLang's own lines;
  artune keeps the caller's choice (pass ``log_level="info"`` to see it).
- Ray (``--use-ray``, ``RayEngine``): each scheduler is a Ray actor whose constructor builds
  the Scheduler without ``load_plugins()`` (sglang/srt/ray/scheduler_actor.py; the forked
  ``run_scheduler_process`` calls it), so no plugin runs where the communicators are built,
  whatever environment reaches the actor. The driver's plugin says so in one warning line
  when SGLang launches its schedulers that way; nothing is applied there.
"""

import functools
import inspect
import logging
import os

from . import _engine

log = logging.getLogger("sglang.artune")

_PATCHED = "_artune_patched"
GATED = ("mscclpp", "flashinfer", "pcie_ipc", "quick_ar", "torch_symm_mem")
TP_GROUPS = ("tp", "attention_tp")
ENV_FUSION = "ARTUNE_SGLANG_FUSION"
#: What the last register() patched (``applied.undo()`` puts SGLang back), or None.
applied = None


def register() -> None:
    """SGLang's plugin hook. Never raises: any failure leaves SGLang as it was."""
    global applied
    patches = None
    try:
        patches = _engine.Patches("sglang")
        _register(patches)
        if patches.applied:
            applied = patches
    except Exception as e:  # noqa: BLE001 - a plugin must not stop the engine
        if patches is not None:
            patches.undo()
        log.warning("artune: the SGLang plugin could not apply the profile (%s); SGLang starts "
                    "as without artune", e)


def plans(p):
    """Per TP size what the plugin sets up (src/export/sglang/ ``plugin_setup``, the same
    code `artune why` reports): ("v2", limits per mode), ("v1", build, max_bytes) or
    ("nccl", reason)."""
    return {tp: p.sglang_setup(tp) for tp in p.tp_sizes}


def _deterministic() -> bool:
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    return bool(GroupCoordinator._deterministic_collectives_enabled())


def _version() -> str:
    import sglang

    return getattr(sglang, "__version__", "unknown")


def settings():
    """ARTUNE_SGLANG_FUSION (profile | engine) and the kernels setting (ARTUNE_SGLANG_KERNELS,
    else ARTUNE_KERNELS: islands | artune | engine, see _engine.kernels), in the usual
    spellings; _engine.BadSetting for any other word."""
    fusion = _engine.setting(ENV_FUSION, {"profile": _engine.ON + ("profile", "artune"),
                                          "engine": _engine.OFF + ("engine",)}, "profile")
    return fusion == "profile", _engine.kernels("sglang")


def _register(patches: "_engine.Patches") -> None:
    if not os.environ.get(_engine.ENV_PROFILE):
        return
    determinism = ("SGLang's deterministic inference (SGLANG_ENABLE_DETERMINISTIC_INFERENCE)"
                   if _deterministic() else None)
    started = _engine.start(log, "SGLang", "sglang", _version(), determinism, settings)
    if started is None:
        return
    p, (fusion, kernels), verdict = started
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.device_communicators import custom_all_reduce, custom_all_reduce_v2

    car = custom_all_reduce.CustomAllreduce
    if getattr(car, _PATCHED, False):
        return
    plan = plans(p)
    bands = Decided(p, verdict)
    import torch.distributed as dist

    unknown = _engine.unknown_reporter(log, patches, "SGLang")
    other = _engine.other_reporter(log, "SGLang")
    for path in GATED:
        asked = patches.asked_by(path)
        if asked is not None:
            patches.apply(path, _engine.gate(bands, unknown=unknown, path=path, asked_by=asked,
                                             other=other))
    for path in ("custom_v1", "custom_v2"):
        asked = patches.asked_by(path)
        if asked is not None:
            patches.apply(path, _engine.follow(bands, asked, other, path),
                          "gate" if path == "custom_v2" else "patch")
    patches.apply("custom_v2", lambda get_config: _v2_follows(get_config, plan))
    # artune's own kernels first, where the op built for the group takes the message.
    patches.apply("artune", _engine.routed_first())
    if fusion:
        patches.apply("flashinfer_fusion", lambda f: _fusion_follows(f, bands))

    car_init = car.__init__
    car_sig = inspect.signature(car_init)
    ctors = _engine.MODEL["sglang"]["constructors"]

    @functools.wraps(car_init)
    def car_init_wrapped(self, *args, **kwargs):
        try:
            b = car_sig.bind(self, *args, **kwargs)
            b.apply_defaults()
            v = plan.get(dist.get_world_size(b.arguments["group"]))
            # None: the profile lacks a mode, and v1 serves both, so SGLang's max_size stands.
            if v is not None and v[0] == "v1" and v[2]:
                # SGLang's v1 takes a message up to max_size, inclusive.
                b.arguments["max_size"] = min(b.arguments["max_size"],
                                              _engine.round_up16(v[2]))
            args, kwargs = b.args[1:], b.kwargs
        except Exception as e:  # noqa: BLE001 - artune's own logic: SGLang's call runs as is
            _engine.fell_back(log, "CustomAllreduce.__init__", e, "SGLang")
        return car_init(self, *args, **kwargs)

    gc = parallel_state.GroupCoordinator
    gc_init = gc.__init__
    gc_sig = inspect.signature(gc_init)

    @functools.wraps(gc_init)
    def gc_init_wrapped(self, *args, **kwargs):
        try:
            b = gc_sig.bind(self, *args, **kwargs)
            name = b.arguments.get("group_name") or ""
            rank = dist.get_rank()
            ws = next((len(r) for r in b.arguments["group_ranks"] if rank in r), 0)
            tp = name in TP_GROUPS and ws >= 2
            deterministic = tp and _deterministic()
            v = plan.get(ws)
            off = (tp and not deterministic and v is not None
                   and (v[0] == "nccl" or (v[0] == "v1" and not v[1])))
            if off and b.arguments.get("use_custom_allreduce"):
                b.arguments["use_custom_allreduce"] = False
            args, kwargs = b.args[1:], b.kwargs
        except Exception as e:  # noqa: BLE001 - artune's own logic: SGLang's call runs as is
            _engine.fell_back(log, "GroupCoordinator.__init__", e, "SGLang")
            return gc_init(self, *args, **kwargs)
        gc_init(self, *args, **kwargs)
        try:
            stamp_world_size(self)
            if not tp:
                return
            own = None
            if not deterministic and v is not None:
                # artune's op, collectively on the group's gloo group, as SGLang builds the
                # group: init_parallel_runtime (sglang/srt/distributed/bootstrap.py) builds
                # every group before ModelRunner.init_torch_distributed takes
                # measure_pre_model_load_memory, the free memory its KV pool is sized from,
                # so the op's buffers count as SGLang's custom all-reduce's do.
                own = own_kernels(p, kernels, self.cpu_group, ws, self.device)
                if own.op is not None:
                    self._artune_op = own.op
            if getattr(self, "rank_in_group", 0) != 0:  # one line per group
                return
            if deterministic:
                bands.active = False
                log.info("artune: TP%d group %s: SGLang's deterministic inference is on, so "
                         "artune changes nothing", ws, name)
            else:
                line = startup_line(bands, patches, plan, name, ws, off, own)
                _engine.startup(log, "SGLang", bands, name, ws, own, line)
        except Exception as e:  # noqa: BLE001 - SGLang built it; artune only failed to report
            _engine.fell_back(log, "GroupCoordinator.__init__ (after SGLang built it)", e,
                              "SGLang", built=True)

    def own_kernels(p, kernels, group, ws, device):
        if "artune" not in patches.applied:
            return _engine.OwnKernels(None, "artune's own kernels not used (GroupCoordinator."
                                      "all_reduce is not as read)")
        return _engine.own_kernels(p, kernels, group, ws, device, log, "SGLang")

    patches.replace(car, "__init__", car_init_wrapped, ctors["CustomAllreduce.__init__"], log)
    patches.replace(gc, "__init__", gc_init_wrapped, ctors["GroupCoordinator.__init__"], log)
    # Graphs captured in SGLang's graph_capture() run the op's registered form, registered
    # after it, where SGLang's custom all-reduce registers its own (CustomAllreduce.capture).
    patches.replace(gc, "graph_capture",
                    _engine.registering(gc.graph_capture, lambda c: getattr(c, "_artune_op",
                                                                            None)),
                    ctors["GroupCoordinator.graph_capture"], log)
    _say_ray(patches)
    setattr(car, _PATCHED, True)
    _engine.nccl_env(log)


SUB_COMMUNICATORS = ("pymscclpp_comm", "ca_comm", "pcie_ipc_comm", "qr_comm",
                     "torch_symm_mem_comm")


def stamp_world_size(comm) -> None:
    _engine.stamp_world_size(comm, SUB_COMMUNICATORS)


RAY_LINE = ("artune: SGLang launches its schedulers as Ray actors here (--use-ray or RayEngine), "
            "and a Ray scheduler actor never loads SGLang's plugins "
            "(sglang/srt/ray/scheduler_actor.py builds its Scheduler without load_plugins()), so "
            "artune cannot apply %s there: SGLang runs as without artune in those schedulers, "
            "whatever ARTUNE_* reaches the Ray workers; launch without Ray to follow the profile")


def _say_ray(patches: "_engine.Patches") -> None:
    """Wraps ``Engine._launch_subprocesses`` (which ``RayEngine`` inherits; sglang serve,
    launch_server and Engine(...) load plugins before calling it) to say, in the driver, that
    a Ray launch leaves the schedulers without the plugin. Optional: where SGLang's engine
    module does not import here, only this line is skipped, not the profile."""
    try:
        from sglang.srt.entrypoints.engine import Engine
    except Exception as e:  # noqa: BLE001 - any import failure: the rest of the plugin stands
        patches.skipped.append(f"the Ray launch line (sglang.srt.entrypoints.engine does not "
                               f"import: {type(e).__name__}: {e})")
        return

    launch = inspect.getattr_static(Engine, "_launch_subprocesses", None)
    if not isinstance(launch, classmethod):
        patches.skipped.append("the Ray launch line (Engine._launch_subprocesses is not as read)")
        return
    f = launch.__func__

    @functools.wraps(f)
    def launching(cls, *args, **kwargs):
        try:
            server_args = inspect.signature(f).bind(cls, *args, **kwargs).arguments[
                "server_args"]
            ray = getattr(server_args, "use_ray", False) or any(
                c.__module__.startswith("sglang.srt.ray") for c in cls.__mro__)
            if ray:
                log.warning(RAY_LINE, os.environ.get(_engine.ENV_PROFILE, "the profile"))
        except Exception as e:  # noqa: BLE001 - artune's own logic: SGLang's call runs as is
            _engine.fell_back(log, "Engine._launch_subprocesses", e, "SGLang")
        return f(cls, *args, **kwargs)

    patches.replace(Engine, "_launch_subprocesses", classmethod(launching),
                    _engine.MODEL["sglang"]["constructors"]["Engine._launch_subprocesses"], log)


MODES = ("graph", "eager")


def answer(steps, nbytes: int):
    """``Profile.custom_at`` from its plain-data form (``Profile.custom_steps``): True, False,
    or None for no answer. A loop over a short list, which Dynamo traces as it is."""
    if steps is None:
        return None
    low, up_to, custom = steps
    if nbytes < low:
        return None
    for top, c in zip(up_to, custom):
        if nbytes <= top:
            return c
    return None


class Decided(_engine.Bands):
    """The profile's rule (src/export/follow.rs) as plain Python data computed at start-up.
    SGLang's all_reduce, its FlashInfer check and its fused norm run inside torch.compile's
    trace (``--enable-torch-compile``), and Dynamo cannot trace a call into the extension, so
    no per-message answer calls it: ``Profile.custom_steps`` and ``fused_up_to`` are read
    once here. ``mode=None`` is a traced call, whose graph may replay inside a CUDA graph or
    eagerly: NCCL where the profile gives NCCL in either mode."""

    def __init__(self, p, verdict: str = "valid here") -> None:
        super().__init__(p, verdict)
        self._steps = {(tp, m): p.custom_steps(tp, m) for tp in p.tp_sizes for m in MODES}
        # The cut of a fused allreduce+norm (None: it fuses nothing) at each TP size.
        self._fuse_to = {tp: p.fused_up_to(tp, 1 << 62) for tp in p.tp_sizes}

    def custom_at(self, tp: int, nbytes: int, mode):
        if not self.active or tp not in self._tps:
            return None
        if mode is not None:
            return answer(self._steps[(tp, mode)], nbytes)
        got = [answer(self._steps[(tp, m)], nbytes) for m in MODES]
        return False if False in got else True if True in got else None

    def fused_up_to(self, tp: int, engine):
        if engine is None or tp not in self._tps:
            return engine
        top = self._fuse_to[tp]
        return None if top is None else min(engine, top)


def _fusion_follows(fused, bands: "_engine.Bands"):
    """flashinfer_allreduce_residual_rmsnorm, declined (SGLang's own (None, None)) above the
    profile's custom band from the smallest size at the fusion group's TP size: the fused
    kernel is FlashInfer's peer-to-peer all-reduce. The answer depends only on the TP size,
    the size and the profile, so every rank of the group declines alike (SGLang's rule)."""

    @functools.wraps(fused)
    def followed(input_tensor, residual, weight, eps=1e-6, max_token_num=2048,
                 use_oneshot=None, trigger_completion_at_end=False, fp32_acc=True,
                 use_attn_tp_group=True):
        from sglang.srt.layers import flashinfer_comm_fusion

        ws = flashinfer_comm_fusion.resolve_fusion_world_size(
            use_attn_tp_group=use_attn_tp_group)
        n = _engine.nbytes_of(input_tensor)
        if bands.active and bands.covers(ws) and (bands.fused_up_to(ws, n) or 0) < n:
            return None, None
        return fused(input_tensor, residual, weight, eps, max_token_num, use_oneshot,
                     trigger_completion_at_end, fp32_acc, use_attn_tp_group)

    return followed


def _v2_follows(get_config, plan):
    @functools.wraps(get_config)
    def followed(world_size):
        base = get_config(world_size)
        v = plan.get(world_size)
        if v is None or v[0] != "v2":
            return base

        def follow(h, lim):
            push1, pull1, pull2 = lim
            # Multicast two-shot runs inside its range before the 2shot_pull limit is
            # tested: clip it to the profile's custom band, so NCCL sizes stay NCCL; a range
            # wholly above the band is none (Range(0, 0), v2's default), not one at pull2.
            if h.mc.min_bytes > pull2:
                mc = h.mc._replace(min_bytes=0, max_bytes=0)
            else:
                mc = h.mc._replace(max_bytes=min(h.mc.max_bytes, pull2))
            return h._replace(
                one_shot_push_threshold=push1,
                one_shot_pull_threshold=pull1,
                two_shot_pull_threshold=pull2,
                two_shot_push_threshold=0,
                mc=mc,
            )

        # A mode the profile lacks (None) keeps SGLang's own config: no answer there.
        lims = v[1]
        return base._replace(
            graph=base.graph if lims["graph"] is None else follow(base.graph, lims["graph"]),
            eager=base.eager if lims["eager"] is None else follow(base.eager, lims["eager"]),
        )

    return followed


def describe(plan) -> str:
    parts = []
    for tp, v in sorted(plan.items()):
        if v[0] == "v2":
            parts.append(f"TP{tp}: v2 limits {v[1]}")
        elif v[0] == "v1" and v[1]:
            parts.append(f"TP{tp}: v1 up to {v[2]} B" if v[2] is not None
                         else f"TP{tp}: v1 at SGLang's max_size")
        elif v[0] == "v1":
            parts.append(f"TP{tp}: NCCL")
        else:
            parts.append(f"TP{tp}: NCCL ({v[1]})")
    return "; ".join(parts)


def startup_line(bands, patches, plan, name: str, ws: int, off: bool, own=None) -> str:
    """The full start-up list of one TP group (at DEBUG; ``_engine.startup`` logs the short
    line): what SGLang runs per size band with the profile applied."""
    v = plan.get(ws)
    if v is None:
        return (f"artune: TP{ws} group {name}: {bands.path} has no TP{ws} group, so SGLang "
                "keeps its own choice here")
    parts = [f"artune: TP{ws} group {name} follows {bands.path}"]
    for mode in ("graph", "eager"):
        parts.append(f"{mode}: {bands.describe(ws, mode)}")
    if v[0] == "v2":
        parts.append("custom sizes run v2 at the profile's limits " + str(v[1]) +
                     ", gated per call (a size inside them the profile gives NCCL runs NCCL;"
                     " multicast inside them only)")
    elif off:
        parts.append(f"custom all-reduce not built ({v[1] if v[0] == 'nccl' else 'NCCL wins'}),"
                     " so no IPC buffers are allocated")
    elif v[2] is None:
        parts.append("custom sizes run v1 at SGLang's own max_size (the profile lacks a mode, "
                     "and v1 serves both)")
    else:
        parts.append(f"custom sizes run v1 up to {_engine.size(v[2])}")
    parts.append("NCCL sizes run NCCL with artune's tuner plugin")
    if own is not None:
        parts.append(own.said)
    if "flashinfer_fusion" in patches.applied:
        top = bands.custom_prefix(ws)
        parts.append("FlashInfer allreduce+RMSNorm fusion " + (
            "at SGLang's sizes (the profile lacks a mode, and the fusion serves both)"
            if top is None else f"to {_engine.size(top)}" if top
            else "off (the profile starts with NCCL)"))
    elif any(s.startswith("flashinfer_fusion") for s in patches.skipped):
        # The user left fusion to artune, but this SGLang's fusion could not be patched.
        parts.append("FlashInfer allreduce+RMSNorm fusion left to SGLang (its patch was not "
                     "applied: below)")
    else:
        parts.append(f"FlashInfer allreduce+RMSNorm fusion left to SGLang ({ENV_FUSION}=engine)")
    parts.append("left alone: " + _engine.left_alone("sglang"))
    if patches.skipped:
        parts.append("not applied: " + "; ".join(patches.skipped))
    return "; ".join(parts)
