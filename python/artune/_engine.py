"""What the engine plugins share: the engine model (engines.json, which Rust reads too), the
one start-up sequence (off switch, determinism, profile, version), patching only what can be
verified, and the rule every peer-to-peer path follows.

The rule: artune's one-/two-stage pull/push kernels stand for the engine's peer-to-peer kernels
of the same shape. Where the profile says NCCL at a size, no peer-to-peer path of the engine
takes that size; where it says custom, the engine's own order applies. Every refusal is one
warning line naming the file and what to do; the engine then starts exactly as without
artune. Nothing here raises into the engine.
"""

import bisect
import functools
import importlib
import inspect
import json
import logging
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

from . import ArtuneError, Profile, plugin_path

ENV_PROFILE = "ARTUNE_PROFILE"
ENV_ALLOW_SIMULATED = "ARTUNE_ALLOW_SIMULATED"
ENV_ALLOW_STALE = "ARTUNE_ALLOW_STALE"

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "engines.json")) as _f:
    MODEL = json.load(_f)


def nccl_version() -> Optional[str]:
    """The NCCL the engine's torch already loaded, without loading one: None when torch is
    not imported yet or has no NCCL."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        v = torch.cuda.nccl.version()
        return ".".join(str(x) for x in v) if isinstance(v, tuple) else None
    except Exception:  # noqa: BLE001 - no CUDA build: leave the NCCL version unchecked
        return None


def load(log: logging.Logger, engine: str) -> Optional[Profile]:
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
            c = p.check(nccl=nccl_version())
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


def start(log: logging.Logger, engine: str, key: str, version: str,
          determinism: Optional[str]) -> Optional[Profile]:
    """The plugins' one start: the per-engine off switch (``ARTUNE_VLLM=0``,
    ``ARTUNE_SGLANG=0``), determinism the user asked for (``determinism`` names it), the
    profile, and the engine's version against the one artune was read against. None: change
    nothing (said in one line where the user set ARTUNE_PROFILE)."""
    if not os.environ.get(ENV_PROFILE):
        return None
    off = f"ARTUNE_{key.upper()}"
    if os.environ.get(off) == "0":
        log.warning("artune: %s=0, so %s starts as without artune", off, engine)
        return None
    if determinism:
        log.warning("artune: %s asks for a fixed reduction order, so artune changes nothing "
                    "in %s", determinism, engine)
        return None
    p = load(log, engine)
    if p is None:
        return None
    read = MODEL[key]["read_against"]
    if version != read:
        log.warning("artune: %s %s is not the release artune was read against (%s); artune "
                    "applies only the patches whose symbol and signature it finds as read",
                    engine, version, read)
    return p


def fell_back(log: logging.Logger, what: str, e: Exception, engine: str,
              built: bool = False) -> None:
    """One warning for a failure of artune's own logic around an engine's call."""
    then = (f"{engine} keeps what it built" if built
            else f"{engine}'s own call runs unchanged")
    log.warning("artune: %s failed inside artune (%s: %s); %s", what, type(e).__name__, e,
                then)


def nccl_env(log: logging.Logger) -> None:
    """Points NCCL at artune's tuner plugin, unless the user chose one."""
    if "NCCL_TUNER_PLUGIN" in os.environ:
        return
    try:
        os.environ["NCCL_TUNER_PLUGIN"] = plugin_path()
    except ArtuneError as e:
        log.warning("artune: %s; NCCL keeps its own algorithm choice", e)


class Patches:
    """Patches the engine model names, each only where its symbol exists with the parameters
    it was read with; the start-up line names what was not applied."""

    def __init__(self, key: str) -> None:
        self.rows = {r["path"]: r for r in MODEL[key]["order"]}
        self.applied: List[str] = []
        self.skipped: List[str] = []
        self._undo: List[Tuple[object, str, object]] = []

    def find(self, path: str):
        """(owner, name, current) for a path's patch point, or None (recorded) if absent or
        not as read."""
        spec = self.rows[path]["patch"]
        try:
            owner = importlib.import_module(spec["module"])
        except Exception as e:  # noqa: BLE001 - an optional engine module that cannot import
            self.skipped.append(f"{path} ({spec['module']} does not import: {e})")
            return None
        *outer, name = spec["qualname"].split(".")
        for part in outer:
            owner = getattr(owner, part, None)
            if owner is None:
                self.skipped.append(f"{path} ({spec['qualname']} is missing)")
                return None
        f = inspect.getattr_static(owner, name, None) if isinstance(owner, type) else getattr(
            owner, name, None)
        if f is None:
            self.skipped.append(f"{path} ({spec['qualname']} is missing)")
            return None
        try:
            params = list(inspect.signature(getattr(owner, name)).parameters)
        except (TypeError, ValueError):
            params = None
        if params != spec["params"]:
            self.skipped.append(f"{path} ({spec['qualname']} takes {params}, read as "
                                f"{spec['params']})")
            return None
        return owner, name, f

    def apply(self, path: str, wrap: Callable) -> bool:
        found = self.find(path)
        if found is None:
            return False
        owner, name, f = found
        self._undo.append((owner, name, f))
        setattr(owner, name, wrap(getattr(owner, name)))
        self.applied.append(path)
        return True

    def replace(self, owner, name: str, new, needs: List[str],
                log: Optional[logging.Logger] = None) -> bool:
        """A constructor wrapper (engines.json ``constructors``), kept for undo: applied only
        where the engine's function still takes every parameter the wrapper binds by name
        (``needs``); else skipped and named in the start-up line."""
        what = f"{owner.__name__}.{name}"
        current = inspect.getattr_static(owner, name, None)
        f = current.__func__ if isinstance(current, classmethod) else current
        try:
            params = list(inspect.signature(f).parameters)
        except (TypeError, ValueError):
            params = None
        missing = [p for p in needs if p not in (params or [])]
        if f is None or missing:
            why = f"{what} (takes {params}; artune binds {missing} by name)"
            self.skipped.append(why)
            if log is not None:
                log.warning("artune: not applied: %s; the engine builds it as without artune",
                            why)
            return False
        self._undo.append((owner, name, current))
        setattr(owner, name, new)
        self.applied.append(what)
        return True

    def undo(self) -> None:
        """Puts back everything patched, newest first: never a half-changed engine."""
        for owner, name, f in reversed(self._undo):
            setattr(owner, name, f)
        self._undo.clear()


class Bands:
    """Per TP size and mode, where the profile routes messages to a custom kernel."""

    def __init__(self, p: Profile) -> None:
        self.path = os.environ.get(ENV_PROFILE, "")
        self.active = True
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
        if not self.active:
            return None
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

    def custom_prefix(self, tp: int) -> int:
        """The largest size up to which the profile chooses custom at every size from the
        smallest, in both modes (0: it starts with NCCL)."""
        tops = []
        for mode in ("graph", "eager"):
            b = self._bands.get((tp, mode))
            if b is None:
                continue
            top = 0
            for s, c in zip(*b):
                if not c:
                    break
                top = s
            tops.append(top)
        return min(tops) if tops else 0

    def describe(self, tp: int, mode: str) -> str:
        """The profile's bands at ``tp`` as "custom to 64K, NCCL to 64M"."""
        b = self._bands.get((tp, mode))
        if b is None:
            return "no bands (the engine keeps its own rule)"
        out, last = [], None
        for s, c in zip(*b):
            if out and c == last:
                out[-1] = (s, c)
            else:
                out.append((s, c))
            last = c
        return ", ".join(f"{'custom' if c else 'NCCL'} to {size(s)}" for s, c in out)


def size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def capturing_now() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    try:
        import torch

        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no CUDA: nothing is being captured
        return False


def mode_of(comm) -> str:
    capturing = getattr(comm, "_IS_CAPTURING", None)
    if capturing is None:
        capturing = capturing_now()
    return "graph" if capturing else "eager"


def nbytes_of(inp) -> int:
    return inp.numel() * inp.element_size()


def world_size_of(c) -> Optional[int]:
    """A sub-communicator's TP size: the one its communicator stamped on it
    (``_artune_world_size``, for those that keep none, e.g. vLLM's AiterCustomAllreduce),
    else its own ``world_size`` / ``_world_size``; None where none is known."""
    for a in ("_artune_world_size", "world_size", "_world_size"):
        v = getattr(c, a, None)
        if isinstance(v, int):
            return v
    return None


def stamp_world_size(comm, attrs) -> None:
    """Gives each sub-communicator of ``comm`` named in ``attrs`` that keeps no world size
    (vLLM's AiterCustomAllreduce wraps aiter's object and keeps none) the communicator's
    own, so its gate can follow the profile."""
    ws = getattr(comm, "world_size", None)
    for attr in attrs:
        sub = getattr(comm, attr, None)
        if sub is not None and isinstance(ws, int) and world_size_of(sub) is None:
            try:
                sub._artune_world_size = ws
            except Exception:  # noqa: BLE001 - a slotted object: its gate says it is unknown
                pass


def gate(bands: Bands, world_size: Callable = world_size_of,
         unknown: Optional[Callable[[str], None]] = None, path: str = ""):
    """The rule for a peer-to-peer path's ``should_*(self, inp, ...)``: still False wherever
    the engine says no, and False where the profile chose NCCL for this TP size, size and
    mode. Where the profile says custom or has no answer, the engine's answer stands. Where
    the TP size cannot be told, the engine's answer stands and ``unknown(path)`` says so
    (the plugins list it under "not applied" and warn once): never a silent pass."""

    def wrap(should):
        @functools.wraps(should)
        def gated(self, inp, *args, **kwargs):
            if not should(self, inp, *args, **kwargs):
                return False
            ws = world_size(self)
            if ws is None:
                if unknown is not None:
                    unknown(path)
                return True
            return bands.custom_at(ws, nbytes_of(inp), mode_of(self)) is not False

        return gated

    return wrap


def unknown_reporter(log: logging.Logger, patches: "Patches", engine: str):
    """``gate``'s ``unknown``: one warning per path, and the path listed as not applied."""
    seen = set()

    def report(path: str) -> None:
        if path in seen:
            return
        seen.add(path)
        why = f"{path} (its TP size cannot be told, so it keeps {engine}'s choice)"
        patches.skipped.append(why)
        log.warning("artune: not applied: %s", why)

    return report


def follow(bands: Bands):
    """For an engine's custom all-reduce ``should_custom_ar(self, inp)``: False wherever the
    engine says no; where it says yes, what the profile chose for this size and mode."""

    def wrap(should):
        @functools.wraps(should)
        def followed(self, inp):
            if not should(self, inp):
                return False
            chosen = bands.custom_at(self.world_size, nbytes_of(inp), mode_of(self))
            return True if chosen is None else chosen

        return followed

    return wrap


def round_up16(n: int) -> int:
    return (n + 15) // 16 * 16
