"""vLLM plugin: make vLLM's custom all-reduce follow an artune profile.

Enabled by ``ARTUNE_PROFILE=/path/profile.json``; loaded by vLLM through the entry point
``vllm.general_plugins: artune = artune.vllm:register`` in every process, before any
communicator is built (vllm/plugins/__init__.py ``load_general_plugins``; ``VLLM_PLUGINS`` is a
whitelist). Read against vLLM 0.33.0 (the wheel on PyPI). What is patched, and when vLLM reads it:

- ``CudaCommunicator.__init__`` (device_communicators/cuda_communicator.py), at communicator
  construction: for a TP size where the profile chooses NCCL at every size, vLLM's module flag
  ``parallel_state._ENABLE_CUSTOM_ALL_REDUCE`` reads False while the TP communicator is built,
  so no custom all-reduce and no IPC buffers exist.
- ``CustomAllreduce.__init__`` (device_communicators/custom_all_reduce.py), at construction:
  ``max_size`` (its metadata buffer, and the messages it takes) is cut to the largest size the
  profile routes to a custom kernel. vLLM still sizes its registered buffer at least to its
  all-gather and reduce-scatter limits.
- ``CustomAllreduce.should_custom_ar``, per call: where the profile chose NCCL for this TP size,
  size and mode (graph while vLLM captures, else eager), it answers False.
- ``SymmMemCommunicator.should_use_symm_mem`` (device_communicators/symm_mem.py), per call: False
  where the profile chose NCCL, so symmetric memory does not take what the profile gave NCCL.

``NCCL_TUNER_PLUGIN`` is set to artune's NCCL plugin if unset, so NCCL itself runs the
algorithm and protocol the profile chose. What vLLM cannot express is logged once: vLLM
chooses one-stage or two-stage inside its C++ kernel, and runs no custom all-reduce on more
than two PCIe-only GPUs whatever it is told.
"""

import functools
import inspect
import logging

from . import _engine

log = logging.getLogger("artune")

_PATCHED = "_artune_patched"


def register() -> None:
    """vLLM's plugin hook. Never raises: any failure leaves vLLM as it was."""
    try:
        _register()
    except Exception as e:  # noqa: BLE001 - a plugin must not stop the engine
        log.warning("artune: the vLLM plugin could not apply the profile (%s); vLLM starts as "
                    "without artune", e)


def _register() -> None:
    p = _engine.load("vLLM")
    if p is None:
        return
    from vllm.distributed import parallel_state
    from vllm.distributed.device_communicators import cuda_communicator, custom_all_reduce, symm_mem

    car = custom_all_reduce.CustomAllreduce
    if getattr(car, _PATCHED, False):
        return
    bands = _engine.Bands(p)
    _engine.nccl_env()
    import torch.distributed as dist

    comm = cuda_communicator.CudaCommunicator
    comm_init = comm.__init__
    comm_sig = inspect.signature(comm_init)

    @functools.wraps(comm_init)
    def comm_init_wrapped(self, *args, **kwargs):
        a = comm_sig.bind(self, *args, **kwargs).arguments
        name = a.get("unique_name", "") or ""
        ws = dist.get_world_size(a["cpu_group"])
        if name.split(":")[0] == "tp" and bands.covers(ws) and bands.largest_custom(ws) == 0:
            saved = parallel_state._ENABLE_CUSTOM_ALL_REDUCE
            parallel_state._ENABLE_CUSTOM_ALL_REDUCE = False
            try:
                return comm_init(self, *args, **kwargs)
            finally:
                parallel_state._ENABLE_CUSTOM_ALL_REDUCE = saved
        return comm_init(self, *args, **kwargs)

    car_init = car.__init__
    car_sig = inspect.signature(car_init)

    @functools.wraps(car_init)
    def car_init_wrapped(self, *args, **kwargs):
        b = car_sig.bind(self, *args, **kwargs)
        b.apply_defaults()
        ws = dist.get_world_size(b.arguments["group"])
        top = bands.largest_custom(ws)
        if top > 0:
            # vLLM takes a message when its size is below max_size.
            b.arguments["max_size"] = min(b.arguments["max_size"], _engine.round_up16(top + 1))
        return car_init(*b.args, **b.kwargs)

    should_wrapped = _engine.follow_should(car.should_custom_ar, bands)

    symm = symm_mem.SymmMemCommunicator
    symm_should = symm.should_use_symm_mem

    @functools.wraps(symm_should)
    def symm_should_wrapped(self, inp):
        if not symm_should(self, inp):
            return False
        mode = "graph" if _engine.capturing_now() else "eager"
        chosen = bands.custom_at(self.world_size, inp.numel() * inp.element_size(), mode)
        return chosen is not False

    comm.__init__ = comm_init_wrapped
    car.__init__ = car_init_wrapped
    car.should_custom_ar = should_wrapped
    symm.should_use_symm_mem = symm_should_wrapped
    setattr(car, _PATCHED, True)
    summary = ", ".join(
        f"TP{tp}: custom up to {bands.largest_custom(tp)} B" if bands.largest_custom(tp)
        else f"TP{tp}: NCCL only"
        for tp in p.tp_sizes
    )
    log.info(
        "artune: vLLM follows %s (%s); vLLM picks one-stage or two-stage inside its kernel and "
        "runs no custom all-reduce on more than two PCIe-only GPUs, which artune cannot change",
        bands.path, summary,
    )
