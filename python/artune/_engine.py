"""What the engine plugins share: reading ``ARTUNE_PROFILE`` once, refusing profiles that must
not be followed, the NCCL plugin's environment, and the profile's bands as engines need them.

Every refusal is one warning line naming the file and what to do; the engine then starts
exactly as it would without artune. Nothing here raises into the engine.
"""

import bisect
import logging
import os
from typing import Dict, List, Optional, Tuple

from . import ArtuneError, Profile, plugin_path

log = logging.getLogger("artune")

ENV_PROFILE = "ARTUNE_PROFILE"
ENV_ALLOW_SIMULATED = "ARTUNE_ALLOW_SIMULATED"
ENV_ALLOW_STALE = "ARTUNE_ALLOW_STALE"


def load(engine: str) -> Optional[Profile]:
    """The profile to follow, or None (with one warning line saying why) to change nothing."""
    path = os.environ.get(ENV_PROFILE)
    if not path:
        return None
    unchanged = f"{engine} starts as without artune"
    try:
        p = Profile.load(path)
    except ArtuneError as e:
        log.warning("artune: %s; %s", e, unchanged)
        return None
    if p.simulated and os.environ.get(ENV_ALLOW_SIMULATED) != "1":
        log.warning(
            "artune: %s is a SIMULATED profile (%s), not a measurement of this machine; run "
            "`artune tune` here, or set %s=1 to follow it anyway; %s",
            path, p.fabric, ENV_ALLOW_SIMULATED, unchanged,
        )
        return None
    if os.environ.get(ENV_ALLOW_STALE) != "1":
        try:
            c = p.check()
        except ArtuneError as e:
            log.warning(
                "artune: cannot check %s against this machine (%s); set %s=1 to follow it "
                "unchecked; %s", path, e, ENV_ALLOW_STALE, unchanged,
            )
            return None
        if not c.holds:
            log.warning(
                "artune: %s is stale for this machine (%s); run `artune tune` again, or set "
                "%s=1 to follow it anyway; %s",
                path, ", ".join(c.changes[:4]), ENV_ALLOW_STALE, unchanged,
            )
            return None
    return p


def nccl_env() -> None:
    """Points NCCL at artune's tuner plugin, unless the user chose one."""
    if "NCCL_TUNER_PLUGIN" in os.environ:
        return
    try:
        os.environ["NCCL_TUNER_PLUGIN"] = plugin_path()
    except ArtuneError as e:
        log.warning("artune: %s; NCCL keeps its own algorithm choice", e)


class Bands:
    """Per TP size and mode, where the profile routes messages to a custom kernel."""

    def __init__(self, p: Profile) -> None:
        self.path = os.environ.get(ENV_PROFILE, "")
        self._bands: Dict[Tuple[int, str], Tuple[List[int], List[bool]]] = {}
        for tp in p.tp_sizes:
            for mode in ("graph", "eager"):
                bs = p.bands(tp, mode)
                if bs:
                    self._bands[(tp, mode)] = ([b.up_to_bytes for b in bs], [b.custom for b in bs])

    def covers(self, tp: int) -> bool:
        return any(k[0] == tp for k in self._bands)

    def custom_at(self, tp: int, nbytes: int, mode: str) -> Optional[bool]:
        """True where the profile chose a custom kernel, False where NCCL, None where the
        profile has no answer (the engine keeps its own rule)."""
        b = self._bands.get((tp, mode))
        if b is None:
            return None
        i = bisect.bisect_left(b[0], nbytes)
        return b[1][i] if i < len(b[1]) else None

    def largest_custom(self, tp: int) -> int:
        """The largest message the profile routes to a custom kernel at ``tp``, either mode."""
        top = 0
        for (t, _), (sizes, custom) in self._bands.items():
            if t == tp:
                top = max([top] + [s for s, c in zip(sizes, custom) if c])
        return top


def capturing_now() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    try:
        import torch

        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no CUDA: nothing is being captured
        return False


def follow_should(should, bands: Bands):
    """Wraps an engine's per-call ``should_custom_ar(self, inp)``: still False wherever the
    engine says no, and where it says yes, what the profile chose for this size and mode (graph
    while the communicator or the stream is capturing). Sizes the profile does not cover keep
    the engine's answer."""
    import functools

    @functools.wraps(should)
    def wrapped(self, inp):
        if not should(self, inp):
            return False
        capturing = getattr(self, "_IS_CAPTURING", None)
        if capturing is None:
            capturing = capturing_now()
        mode = "graph" if capturing else "eager"
        chosen = bands.custom_at(self.world_size, inp.numel() * inp.element_size(), mode)
        return True if chosen is None else chosen

    return wrapped


def round_up16(n: int) -> int:
    return (n + 15) // 16 * 16
