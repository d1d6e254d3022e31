"""vLLM plugin: every allreduce path of vLLM follows an artune profile, or is left alone with
a reason in the start-up line.

Enabled by ``ARTUNE_PROFILE=/path/profile.json``; loaded by vLLM through the entry point
``vllm.general_plugins: artune = artune.vllm:register`` in every process, before any
communicator is built (vllm/plugins/__init__.py ``load_general_plugins``; ``VLLM_PLUGINS`` is a
whitelist). Read against the vLLM release named in engines.json, whose ``vllm.order`` lists
each path of ``CudaCommunicator.all_reduce``, how vLLM picks it and what this plugin does; the
rule (artune/_engine.py, docs/ENGINE-PATHS.md): where the profile says NCCL at a size, no
peer-to-peer path takes it; where it says custom, vLLM's own order applies.

Beyond the per-call gates:
- artune's own kernels (artune.allreduce): where the profile chooses a kernel vLLM has no
  path of (the island schedules), and at every custom size with ``ARTUNE_KERNELS=artune``
  (``ARTUNE_VLLM_KERNELS`` for vLLM alone; ``engine``: never), ``CudaCommunicator.__init__``
  builds artune's op on the TP group's gloo group before vLLM builds its own communicators,
  and ``CudaCommunicator.all_reduce`` hands it those sizes (messages of the profile's dtype)
  before vLLM's order. Its buffers exist before vLLM takes the memory snapshot its KV cache
  is sized from. Where the op cannot be built (no GPU, no P2P, other kernels than the
  profile timed, a group that cannot exchange handles), vLLM's paths serve every size and
  the start-up line, then a warning, says why.
- ``CudaCommunicator.__init__``: vLLM builds its custom all-reduce as it would without
  artune, because the same object (and its IPC buffers) serves vLLM's custom all-gather and
  reduce-scatter (sequence parallelism, some models' logits gather), which the profile does
  not measure; at a TP size the profile gives NCCL at every size its all-reduce runs at no
  size (``should_custom_ar``). ``ARTUNE_VLLM_CUSTOM_AR=off`` is the other choice: there
  ``parallel_state._ENABLE_CUSTOM_ALL_REDUCE`` reads False while the TP communicator is
  built, so no IPC buffers exist and those all-gathers and reduce-scatters run NCCL (also
  where artune's op takes every custom size, ``ARTUNE_KERNELS=artune``). Where
  vLLM runs none of those on it (no full NVLink, no multicast: a PCIe pair), the object serves
  nothing the profile leaves custom, so the plugin closes it at once and its buffers are freed.
  Each TP communicator logs one line saying which happened and how much IPC memory it holds.
- ``GroupCoordinator.graph_capture``: the op's calls captured inside it (vLLM captures every
  CUDA graph there) run its registered form, reading the peers' tensors with nothing staged,
  and the op registers them (``register_graph_buffers``, every rank) as the context exits,
  where vLLM's custom all-reduce registers its own (``CustomAllreduce.capture``). Graphs
  captured elsewhere run the staged form.
- ``CustomAllreduce.__init__``: ``max_size`` cut to the largest size the profile routes to a
  custom kernel. The object serves both modes, so where the profile lacks a mode (no answer
  there) its ``max_size`` stays vLLM's, and it is neither closed nor left unbuilt.
- The fusion pass (allreduce+RMSNorm into one FlashInfer kernel at compile time) is decided
  by the profile, because it runs FlashInfer's peer-to-peer kernel at every size it fuses: it
  fuses only up to the profile's custom band that starts at the smallest size, and not at all
  where the profile starts with NCCL. It saves a kernel and a norm pass the profile did not
  measure; ``ARTUNE_VLLM_FUSION=engine`` keeps vLLM's own fusion sizes instead. The pass
  serves both modes, so where the profile lacks a mode vLLM's sizes stand. The models
  that call FlashInfer's fused allreduce+RMSNorm from their own code (DeepSeek-V3.2, Kimi-K3,
  MiniMax-M3, through ``fused_allreduce_gemma_rms_norm._max_token_num``) follow the same cut,
  as does Qwen3.5's fused allreduce+norm+quant (its ``_get_workspace`` declines above it).
- The gates refuse only vLLM's dispatch (engines.json ``asked_by``), which falls back to the
  next path; any other caller gets vLLM's own answer, so Muse Spark's specialized decode, which
  asks FlashInfer at build time and raises if refused, builds as without artune.
- ``VLLM_BATCH_INVARIANT=1``: the plugin changes nothing (vLLM routes every size to custom AR
  for a fixed reduction order). ``ARTUNE_VLLM=0`` (or false, off, no): off.
- Ray workers: ``ARTUNE_`` is added to ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``, so the
  profile reaches them (vllm/ray/ray_env.py).
"""

import functools
import inspect
import logging
import os

from . import _engine

log = logging.getLogger("vllm.artune")

_PATCHED = "_artune_patched"
ENV_FUSION = "ARTUNE_VLLM_FUSION"
ENV_CUSTOM_AR = "ARTUNE_VLLM_CUSTOM_AR"
RAY_PREFIXES = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
GATED = ("flashinfer", "quick_reduce", "flashinfer_pcie_ipc", "aiter", "torch_symm_mem")
#: What the last register() patched (``applied.undo()`` puts vLLM back), or None.
applied = None


def register() -> None:
    """vLLM's plugin hook. Never raises: any failure leaves vLLM as it was."""
    global applied
    patches = None
    try:
        patches = _engine.Patches("vllm")
        _register(patches)
        if patches.applied:
            applied = patches
    except Exception as e:  # noqa: BLE001 - a plugin must not stop the engine
        if patches is not None:
            patches.undo()
        log.warning("artune: the vLLM plugin could not apply the profile (%s); vLLM starts as "
                    "without artune", e)


def settings():
    """ARTUNE_VLLM_FUSION (profile | engine), ARTUNE_VLLM_CUSTOM_AR (keep | off) and the
    kernels setting (ARTUNE_VLLM_KERNELS, else ARTUNE_KERNELS: islands | artune | engine, see
    _engine.kernels), in the usual spellings; _engine.BadSetting for any other word."""
    fusion = _engine.setting(ENV_FUSION, {"profile": _engine.ON + ("profile", "artune"),
                                          "engine": _engine.OFF + ("engine",)}, "profile")
    custom_ar = _engine.setting(ENV_CUSTOM_AR, {"keep": _engine.ON + ("keep",),
                                                "off": _engine.OFF}, "keep")
    return fusion == "profile", custom_ar == "off", _engine.kernels("vllm")


def _register(patches: "_engine.Patches") -> None:
    import vllm
    import vllm.envs as envs

    determinism = "VLLM_BATCH_INVARIANT=1" if envs.VLLM_BATCH_INVARIANT else None
    started = _engine.start(log, "vLLM", "vllm", vllm.__version__, determinism, settings)
    if started is None:
        return
    p, (fusion, custom_ar_off, kernels), verdict = started
    from vllm.distributed import parallel_state
    from vllm.distributed.device_communicators import cuda_communicator, custom_all_reduce

    car = custom_all_reduce.CustomAllreduce
    if getattr(car, _PATCHED, False):
        return
    bands = _engine.Bands(p, verdict)
    import torch.distributed as dist

    unknown = _engine.unknown_reporter(log, patches, "vLLM")
    other = _engine.other_reporter(log, "vLLM")
    for path in GATED:
        asked = patches.asked_by(path)
        if asked is not None:
            patches.apply(path, _engine.gate(bands, unknown=unknown, path=path, asked_by=asked,
                                             other=other))
    asked = patches.asked_by("custom")
    if asked is not None:
        patches.apply("custom", _engine.follow(bands, asked, other))
    # artune's own kernels first, where the op built for the communicator takes the message.
    patches.apply("artune", _engine.routed_first())
    if fusion:
        patches.apply("fusion_pass", lambda f: _fusion_follows(f, bands))
        patches.apply("model_fused_rms_norm", lambda f: _model_fusion_follows(f, bands))
        patches.apply("qwen3_5_fused_norm_quant", lambda f: _workspace_follows(f, bands))
        patches.apply("fusion_pass_build", lambda f: _fusion_pass_refused_quietly(f, bands))

    comm = cuda_communicator.CudaCommunicator
    comm_init = comm.__init__
    comm_sig = inspect.signature(comm_init)

    @functools.wraps(comm_init)
    def comm_init_wrapped(self, *args, **kwargs):
        try:
            a = comm_sig.bind(self, *args, **kwargs).arguments
            name = a.get("unique_name", "") or ""
            tp = name.split(":")[0] == "tp"
            ws = dist.get_world_size(a["cpu_group"]) if tp else 0
            # artune's op, collectively on vLLM's gloo group, before vLLM builds its own
            # communicators: Worker.init_device (vllm/v1/worker/gpu_worker.py) builds every
            # group in init_worker_distributed_environment before it takes the MemorySnapshot
            # that request_memory (vllm/v1/worker/utils.py) and the KV cache sizing start
            # from, so the op's buffers count as vLLM's own custom AR buffers do.
            own = (own_kernels(p, kernels, a["cpu_group"], ws, a.get("device"))
                   if tp and bands.covers(ws) else None)
            off = (tp and custom_ar_off and bands.covers(ws)
                   and (bands.largest_custom(ws) == 0 or takes_every_custom(own, kernels)))
        except Exception as e:  # noqa: BLE001 - artune's own logic: vLLM's call runs as is
            _engine.fell_back(log, "CudaCommunicator.__init__", e, "vLLM")
            return comm_init(self, *args, **kwargs)
        if off:
            saved = parallel_state._ENABLE_CUSTOM_ALL_REDUCE
            parallel_state._ENABLE_CUSTOM_ALL_REDUCE = False
            try:
                comm_init(self, *args, **kwargs)
            finally:
                parallel_state._ENABLE_CUSTOM_ALL_REDUCE = saved
        else:
            comm_init(self, *args, **kwargs)
        if own is not None and own.op is not None:
            self._artune_op = own.op
        try:
            _after_comm_init(self, tp, name, ws, off, own)
        except Exception as e:  # noqa: BLE001 - vLLM built it; artune only failed to report
            _engine.fell_back(log, "CudaCommunicator.__init__ (after vLLM built it)", e,
                              "vLLM", built=True)

    def own_kernels(p, kernels, group, ws, device):
        if "artune" not in patches.applied:
            return _engine.OwnKernels(None, "artune's own kernels not used (CudaCommunicator."
                                      "all_reduce is not as read)")
        return _engine.own_kernels(p, kernels, group, ws, device, log, "vLLM")

    def _after_comm_init(self, tp, name, ws, off, own):
        stamp_world_size(self)
        if not tp:
            return
        ca = getattr(self, "ca_comm", None)
        freed = None
        if (not off and bands.covers(ws) and bands.largest_custom(ws) == 0 and ca is not None
                and not ca.disabled and not serves_other_collectives(ca)):
            # Nothing but the all-reduce could use it, and the profile gives that to NCCL
            # at every size: closing it changes no path and frees its IPC buffers.
            freed = ipc_bytes(ca)
            ca.close()
            self.ca_comm = ca = None
        if getattr(self, "rank_in_group", 0) == 0:  # one line per group, not per rank
            line = startup_line(bands, patches, name, ws, off, fusion, ca, freed, own)
            _engine.startup(log, "vLLM", bands, name, ws, own, line)

    car_init = car.__init__
    car_sig = inspect.signature(car_init)

    @functools.wraps(car_init)
    def car_init_wrapped(self, *args, **kwargs):
        try:
            b = car_sig.bind(self, *args, **kwargs)
            b.apply_defaults()
            ws = dist.get_world_size(b.arguments["group"])
            # None: the profile lacks a mode, and this object serves both: vLLM's max_size.
            top = bands.largest_custom(ws)
            if top:
                # vLLM takes a message when its size is below max_size.
                b.arguments["max_size"] = min(b.arguments["max_size"],
                                              _engine.round_up16(top + 1))
            args, kwargs = b.args[1:], b.kwargs
        except Exception as e:  # noqa: BLE001 - artune's own logic: vLLM's call runs as is
            _engine.fell_back(log, "CustomAllreduce.__init__", e, "vLLM")
        return car_init(self, *args, **kwargs)

    ctors = _engine.MODEL["vllm"]["constructors"]
    patches.replace(comm, "__init__", comm_init_wrapped, ctors["CudaCommunicator.__init__"], log)
    patches.replace(car, "__init__", car_init_wrapped, ctors["CustomAllreduce.__init__"], log)
    # Graphs captured in vLLM's graph_capture() run the op's registered form, registered
    # after it, where vLLM's custom all-reduce registers its own (CustomAllreduce.capture).
    gc = parallel_state.GroupCoordinator
    patches.replace(gc, "graph_capture", _engine.registering(gc.graph_capture, op_of),
                    ctors["GroupCoordinator.graph_capture"], log)
    setattr(car, _PATCHED, True)
    _engine.nccl_env(log)
    prefixes = [x for x in os.environ.get(RAY_PREFIXES, "").split(",") if x]
    if "ARTUNE_" not in prefixes:
        os.environ[RAY_PREFIXES] = ",".join(prefixes + ["ARTUNE_"])


def op_of(coordinator):
    """artune's op of a GroupCoordinator: its CudaCommunicator's, where the plugin built one."""
    return getattr(coordinator.device_communicator, "_artune_op", None)


def takes_every_custom(own, kernels) -> bool:
    """artune's op serves every size the profile gives a custom kernel (ARTUNE_KERNELS=artune,
    for the profile's dtype), so vLLM's custom all-reduce would serve none of the profile's
    all-reduces."""
    return own is not None and own.op is not None and kernels[0] == "artune"


def _fusion_follows(flashinfer_max_size, bands: "_engine.Bands"):
    """PassConfig.flashinfer_max_size, cut by the profile (``Bands.fused_up_to``): the fused
    kernel runs at every size up to it, so it must be custom throughout."""

    @functools.wraps(flashinfer_max_size)
    def followed(self, world_size):
        return bands.fused_up_to(world_size, flashinfer_max_size(self, world_size))

    return followed


SUB_COMMUNICATORS = ("fi_ar_comm", "qr_comm", "fi_pcie_ipc_ar_comm", "aiter_ar_comm",
                     "ca_comm", "symm_mem_comm")


def stamp_world_size(comm) -> None:
    _engine.stamp_world_size(comm, SUB_COMMUNICATORS)


def _fusion_pass_refused_quietly(configure, bands: "_engine.Bands"):
    """PostGradPassManager.configure, without AllReduceFusionPass where the profile refuses
    fusion at this TP size: built, the pass would log vLLM's WARNING that fusion "is not
    supported" for artune's own refusal. The pass config is put back at once."""
    import sys

    @functools.wraps(configure)
    def configured(self, config):
        pc = config.compilation_config.pass_config
        tp = config.parallel_config.tensor_parallel_size
        aiter = getattr(sys.modules[configure.__module__], "rocm_aiter_ops", None)
        if (not pc.fuse_allreduce_rms or bands.fused_up_to(tp, 1) is not None
                or (aiter is not None and aiter.is_enabled())):
            return configure(self, config)
        pc.fuse_allreduce_rms = False
        try:
            return configure(self, config)
        finally:
            pc.fuse_allreduce_rms = True

    return configured


def _model_fusion_follows(max_token_num, bands: "_engine.Bands"):
    """fused_allreduce_gemma_rms_norm._max_token_num, cut like the fusion pass: the models'
    eager fused allreduce+RMSNorm runs FlashInfer at every token count up to it, and a count
    it refuses falls back to tensor_model_parallel_all_reduce (the communicator's gates)."""

    @functools.wraps(max_token_num)
    def followed(tp_size, hidden_size, dtype):
        base = max_token_num(tp_size, hidden_size, dtype)
        if base is None:
            return None
        import torch

        per_token = hidden_size * torch.tensor([], dtype=dtype).element_size()
        top = bands.fused_up_to(tp_size, base * per_token)
        return top // per_token if top is not None and top >= per_token else None

    return followed


def _workspace_follows(get_workspace, bands: "_engine.Bands"):
    """Qwen3.5's fused allreduce+norm+quant ``_get_workspace``, declined (None, as vLLM
    declines) above the profile's custom band from the smallest size: the model then runs its
    unfused all-reduce through the communicator's gates."""

    @functools.wraps(get_workspace)
    def followed(hidden_states, tp_size):
        n = _engine.nbytes_of(hidden_states)
        if bands.active and bands.covers(tp_size) and (bands.fused_up_to(tp_size, n) or 0) < n:
            return None
        return get_workspace(hidden_states, tp_size)

    return followed


def _capability():
    """The GPU's capability as vLLM's platform reports it (the one its tables are keyed by)."""
    try:
        import vllm.platforms

        c = vllm.platforms.current_platform.get_device_capability()
        return f"{c.major}.{c.minor}" if c is not None else None
    except Exception:  # noqa: BLE001 - no GPU: the line leaves the engine's sizes out
        return None


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def serves_other_collectives(ca) -> bool:
    """vLLM 0.34.0 runs its custom all-gather and reduce-scatter (and DeepSeek-V4.1's fused
    mHC all-reduce) on this object only on full NVLink or with NVLink multicast."""
    return bool(ca.fully_connected or getattr(ca, "mnnvl_multicast_ptr", 0))


def ipc_bytes(ca) -> int:
    """The IPC memory vLLM's custom all-reduce holds per GPU, by its constructor
    (custom_all_reduce.py): metadata (signals, then a scratch area of max_size) and a staging
    buffer as large as the largest custom all-reduce, all-gather or reduce-scatter."""
    try:
        from vllm import _custom_ops as ops

        signals = int(ops.meta_size())
    except Exception:  # noqa: BLE001 - no CUDA ops here: the signals' few KiB left out
        signals = 0
    return signals + ca.max_size + max(ca.max_size, ca.max_all_gather_size,
                                       ca.max_reduce_scatter_size)


def custom_ar_note(ca, bands, ws: int, off: bool, freed=None, own=None) -> str:
    """What vLLM's custom all-reduce object is here, and the memory it holds: vLLM's own
    figures, read from the object its constructor left."""
    if off:
        why = ("; artune's own kernels take every custom size"
               if own is not None and own.op is not None and bands.largest_custom(ws) else "")
        return (f"custom AR not built ({ENV_CUSTOM_AR}=off{why}): no IPC buffers are "
                "allocated, and vLLM's custom all-gather/reduce-scatter run NCCL too")
    if freed is not None:
        return (f"custom AR closed as soon as vLLM built it, {mib(freed)} of IPC buffers per "
                "GPU freed: the profile gives NCCL at every size, and vLLM runs its custom "
                "all-gather/reduce-scatter only on full NVLink or multicast, so nothing else "
                "used them")
    if ca is None:
        return "vLLM built no custom AR for this group (its settings turned it off)"
    if ca.disabled:
        return "vLLM's own checks left custom AR off here, so it holds no IPC buffers"
    mem = f"{mib(ipc_bytes(ca))} of IPC buffers per GPU allocated"
    if getattr(ca, "mnnvl_multicast_ptr", 0):
        mem += f" (and {mib(6 * ca.mnnvl_buffer_size)} of multicast memory)"
    if bands.largest_custom(ws) != 0:
        return f"custom AR built for all-reduces under {mib(ca.max_size)}: {mem}"
    multicast = bool(getattr(ca, "mnnvl_multicast_ptr", 0))
    ag = ca.max_mnnvl_all_gather_size if multicast else ca.max_all_gather_size
    rs = ca.max_mnnvl_reduce_scatter_size if multicast else ca.max_reduce_scatter_size
    return (f"custom AR built but runs no all-reduce (the profile gives NCCL at every size): "
            f"{mem}, kept for vLLM's custom all-gather (to {mib(ag)}) and reduce-scatter "
            f"(to {mib(rs)}), which the profile does not measure; {ENV_CUSTOM_AR}=off frees "
            "them and runs those on NCCL")


def hisparse() -> bool:
    """vLLM's config has HiSparse on (attention_config.hisparse_config)."""
    try:
        from vllm.config import get_current_vllm_config_or_none

        cfg = get_current_vllm_config_or_none()
        return cfg is not None and cfg.attention_config.hisparse_config is not None
    except Exception:  # noqa: BLE001 - a release without it: no HiSparse
        return False


def flashinfer_range(cap, ws: int):
    """(the largest message vLLM's FlashInfer all-reduce takes here, a note on its backend):
    MNNVL's tuned size on one node by default; the fusion table's on the trtllm backend,
    which vLLM picks under HiSparse or VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    (flashinfer_all_reduce.py _resolve_fi_ar_backend)."""
    m = _engine.MODEL["vllm"]
    if ws not in m["flashinfer_world_sizes"]:
        return None, ""
    if hisparse():
        return (m["fusion_max_bytes"].get(cap or "", {}).get(str(ws)),
                ", trtllm backend under HiSparse")
    if os.environ.get("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "auto") == "trtllm":
        return (m["fusion_max_bytes"].get(cap or "", {}).get(str(ws)),
                ", trtllm backend (VLLM_FLASHINFER_ALLREDUCE_BACKEND)")
    return m["flashinfer_max_bytes"].get(cap or "", {}).get(str(ws)), ""


def startup_line(bands, patches, name: str, ws: int, off: bool, fusion: bool, ca=None,
                 freed=None, own=None) -> str:
    """The full start-up list of one TP communicator (at DEBUG; ``_engine.startup`` logs the
    short line): what vLLM runs per size band with the profile applied."""
    if not bands.covers(ws):
        return (f"artune: TP{ws} group {name}: {bands.path} has no TP{ws} group, so vLLM keeps "
                "its own choice here")
    cap = _capability()
    parts = [f"artune: TP{ws} group {name} follows {bands.path}"]
    for mode in ("graph", "eager"):
        parts.append(f"{mode}: {bands.describe(ws, mode)}")
    order = "custom sizes run vLLM's own order"
    fi, backend = flashinfer_range(cap, ws)
    if fi and "flashinfer" in patches.applied:
        order += f" (FlashInfer to {_engine.size(fi)} on {cap}{backend}, then custom AR)"
    parts.append(order + "; NCCL sizes run NCCL with artune's tuner plugin")
    if own is not None:
        parts.append(own.said)
    parts.append(custom_ar_note(ca, bands, ws, off, freed, own))
    fused = [n for p, n in (("fusion_pass", "fusion pass"),
                            ("model_fused_rms_norm", "models' fused allreduce+RMSNorm"))
             if p in patches.applied]
    if fusion and fused:
        top = bands.custom_prefix(ws)
        parts.append(" and ".join(fused) + (
            " at vLLM's sizes (the profile lacks a mode, and they serve both)" if top is None
            else f" to {_engine.size(top)}" if top else " off"))
    elif not fusion:
        parts.append(f"fusion pass and models' fused allreduce+RMSNorm left to vLLM "
                     f"({ENV_FUSION}=engine)")
    parts.append("left alone: " + _engine.left_alone("vllm"))
    if patches.skipped:
        parts.append("not applied: " + "; ".join(patches.skipped))
    return "; ".join(parts)
