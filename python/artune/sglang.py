"""SGLang plugin: make SGLang's custom all-reduce follow an artune profile.

Enabled by ``ARTUNE_PROFILE=/path/profile.json``; loaded by SGLang through the entry point
``sglang.srt.plugins: artune = artune.sglang:register`` in every process before it builds its
communicators (python/sglang/srt/plugins/__init__.py ``load_plugins``; ``SGLANG_PLUGINS`` is a
whitelist). Read against SGLang 0.5.23 (the wheel on PyPI). What is applied, and when SGLang
reads it (``device_communicators/`` below):

- Full-NVLink groups (custom all-reduce v2): ``custom_all_reduce_v2.get_all_reduce_config``,
  read when a v2 communicator is built, returns SGLang's own config for the GPU with the graph
  and eager thresholds (1shot_push, 1shot_pull, 2shot_pull) replaced by the profile's limits;
  its block counts and multicast range stay SGLang's. ``SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB``
  (the v2 workspace, read when ``custom_all_reduce_v2`` is imported) is set, if unset and the
  module is not imported yet, to what the largest of those limits needs.
- A PCIe pair (v1): ``CustomAllreduce.__init__`` gets ``max_size`` (its IPC buffers) cut to the
  largest size the profile routes to a custom kernel, and ``CustomAllreduce.should_custom_ar``
  (per call) answers False where the profile chose NCCL for that size and mode.
- A TP size where SGLang would run NCCL anyway, or where the profile keeps v1 off:
  ``dispatch_custom_allreduce`` (called when the group is built) refuses, so SGLang logs that
  custom all-reduce is off and allocates no IPC buffers.

``NCCL_TUNER_PLUGIN`` is set to artune's NCCL plugin if unset, so NCCL itself runs the
algorithm and protocol the profile chose.
"""

import functools
import inspect
import logging
import os
import sys

from . import _engine

log = logging.getLogger("artune")

_PATCHED = "_artune_patched"
ENV_V2_WORKSPACE = "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB"


class _ProfileChoseNccl(RuntimeError):
    """Raised where SGLang asks for a custom all-reduce the profile does not want."""


def register() -> None:
    """SGLang's plugin hook. Never raises: any failure leaves SGLang as it was."""
    try:
        _register()
    except Exception as e:  # noqa: BLE001 - a plugin must not stop the engine
        log.warning("artune: the SGLang plugin could not apply the profile (%s); SGLang starts "
                    "as without artune", e)


def plans(p):
    """Per TP size: ("v2", limits per mode), ("v1", keep, max_bytes) or ("nccl", reason)."""
    out = {}
    for tp in p.tp_sizes:
        per_mode = {m: p.sglang_plan(tp, m) for m in ("graph", "eager")}
        kinds = {v[0] for v in per_mode.values() if v is not None}
        if kinds == {"v2"}:
            out[tp] = ("v2", {m: v[1] for m, v in per_mode.items() if v is not None})
        elif kinds == {"v1"}:
            keep = all(v[1][0] for v in per_mode.values() if v is not None)
            top = max(v[1][1] for v in per_mode.values() if v is not None)
            out[tp] = ("v1", keep, top)
        elif kinds:
            out[tp] = ("nccl", next(v[1] for v in per_mode.values() if v and v[0] == "nccl"))
    return out


def _register() -> None:
    p = _engine.load("SGLang")
    if p is None:
        return
    plan = plans(p)
    v2_top = max(
        (max(max(lim) for lim in v[1].values()) for v in plan.values() if v[0] == "v2"),
        default=0,
    )
    v2_module = "sglang.srt.distributed.device_communicators.custom_all_reduce_v2"
    if v2_top and ENV_V2_WORKSPACE not in os.environ:
        if v2_module in sys.modules:
            log.warning("artune: SGLang imported its v2 all-reduce before the plugin ran, so its "
                        "workspace keeps its default size")
        else:
            os.environ[ENV_V2_WORKSPACE] = str(max(1, -(-v2_top // 1024)))
    from sglang.srt.distributed.device_communicators import custom_all_reduce, custom_all_reduce_v2

    car = custom_all_reduce.CustomAllreduce
    if getattr(car, _PATCHED, False):
        return
    bands = _engine.Bands(p)
    _engine.nccl_env()
    import torch.distributed as dist

    dispatch = custom_all_reduce.dispatch_custom_allreduce

    @functools.wraps(dispatch)
    def dispatch_wrapped(group, device):
        v = plan.get(dist.get_world_size(group))
        if v is not None and (v[0] == "nccl" or (v[0] == "v1" and not (v[1] and v[2]))):
            raise _ProfileChoseNccl(
                f"artune: {bands.path} chooses NCCL at every size this TP size runs a custom "
                "all-reduce, so none is built"
            )
        return dispatch(group, device)

    get_config = custom_all_reduce_v2.get_all_reduce_config

    @functools.wraps(get_config)
    def get_config_wrapped(world_size):
        base = get_config(world_size)
        v = plan.get(world_size)
        if v is None or v[0] != "v2":
            return base

        def follow(h, lim):
            push1, pull1, pull2 = lim
            return h._replace(
                one_shot_push_threshold=push1,
                one_shot_pull_threshold=pull1,
                two_shot_pull_threshold=pull2,
                two_shot_push_threshold=0,
            )

        lims = v[1]
        return base._replace(
            graph=follow(base.graph, lims.get("graph", lims.get("eager"))),
            eager=follow(base.eager, lims.get("eager", lims.get("graph"))),
        )

    car_init = car.__init__
    car_sig = inspect.signature(car_init)

    @functools.wraps(car_init)
    def car_init_wrapped(self, *args, **kwargs):
        b = car_sig.bind(self, *args, **kwargs)
        b.apply_defaults()
        v = plan.get(dist.get_world_size(b.arguments["group"]))
        if v is not None and v[0] == "v1" and v[2] > 0:
            # SGLang's v1 takes a message up to max_size, inclusive.
            b.arguments["max_size"] = min(b.arguments["max_size"], _engine.round_up16(v[2]))
        return car_init(*b.args, **b.kwargs)

    should_wrapped = _engine.follow_should(car.should_custom_ar, bands)

    custom_all_reduce.dispatch_custom_allreduce = dispatch_wrapped
    custom_all_reduce_v2.get_all_reduce_config = get_config_wrapped
    car.__init__ = car_init_wrapped
    car.should_custom_ar = should_wrapped
    setattr(car, _PATCHED, True)
    log.info("artune: SGLang follows %s (%s)", bands.path, describe(plan))


def describe(plan) -> str:
    parts = []
    for tp, v in sorted(plan.items()):
        if v[0] == "v2":
            parts.append(f"TP{tp}: v2 limits {v[1]}")
        elif v[0] == "v1":
            parts.append(f"TP{tp}: v1 up to {v[2]} B" if v[1] and v[2] else f"TP{tp}: NCCL")
        else:
            parts.append(f"TP{tp}: NCCL ({v[1]})")
    return "; ".join(parts)
