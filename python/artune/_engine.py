"""What the engine plugins share: the engine model (engines.json, which Rust reads too), the
one start-up sequence (settings, off switch, determinism, profile, version), patching only
what can be verified, and the rule every peer-to-peer path follows.

The rule: artune's one-/two-stage pull/push kernels stand for the engine's peer-to-peer kernels
of the same shape. Where the profile says NCCL at a size, no peer-to-peer path of the engine
takes that size; where it says custom, the engine's own order applies. The rule itself is
computed in Rust (src/export/follow.rs, through ``Profile.custom_at`` and its kin), the same
code `artune why` reports from. A refusal is given only to a caller that falls back when
refused (engines.json ``asked_by``: the engine's dispatch); any other caller, such as a model's
build-time probe that raises when refused, gets the engine's own answer, so no engine ever
fails because of artune. Every refusal of the profile is one warning line naming the file and
what to do, said once per job; the engine then starts exactly as without artune. Nothing here
raises into the engine.
"""

import contextlib
import functools
import importlib
import inspect
import json
import logging
import os
import sys
import zlib
from typing import Callable, Dict, List, Optional, Tuple

from . import ArtuneError, Profile, plugin_path

ENV_PROFILE = "ARTUNE_PROFILE"
ENV_ALLOW_SIMULATED = "ARTUNE_ALLOW_SIMULATED"
ENV_ALLOW_INVALID = "ARTUNE_ALLOW_INVALID"
#: The old override, which skipped every check and said nothing: no longer read, and said so.
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


#: The words a setting may take (any case): on, off, and for the fusion and custom-AR
#: settings the engine-keeping choice.
ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")
#: Hashes of the warnings this job already said, inherited by every process the first one
#: starts (and copied to vLLM's Ray workers with the rest of ARTUNE_*).
ENV_SAID = "ARTUNE_SAID"


class BadSetting(Exception):
    """An ARTUNE_* value that is none of the words it takes."""


def setting(name: str, choices: Dict[str, Tuple[str, ...]], default: str) -> str:
    """The value of setting ``name`` as one of ``choices`` (a choice: the words that mean it,
    any case); ``default`` where unset or empty. Raises BadSetting for any other word."""
    raw = os.environ.get(name, "")
    v = raw.strip().lower()
    if not v:
        return default
    for choice, words in choices.items():
        if v in words:
            return choice
    words = ", ".join(w for ws in choices.values() for w in ws)
    raise BadSetting(f"{name}={raw} is none of {words}")


def switch(name: str) -> bool:
    """An on/off setting (``ARTUNE_VLLM``, ``ARTUNE_ALLOW_SIMULATED``): True for on."""
    return setting(name, {"on": ON, "off": OFF}, "") == "on"


def say(log: logging.Logger, msg: str, *args) -> None:
    """A warning about the profile or the settings, once per job: the first process of the
    job (the engine's main process, which loads plugins before it starts the others) logs it
    at WARNING; the processes it starts inherit ENV_SAID and log it at DEBUG only."""
    text = msg % args if args else msg
    key = format(zlib.crc32(text.encode()), "08x")
    said = [k for k in os.environ.get(ENV_SAID, "").split(",") if k]
    if key in said:
        log.debug("%s", text)
        return
    log.warning("%s", text)
    os.environ[ENV_SAID] = ",".join(said + [key])


def load(log: logging.Logger, engine: str) -> Optional[Tuple[Profile, str]]:
    """The profile to follow and the validity rule's verdict on it for this machine (the rule
    of src/profile/validity/, which the NCCL plugin, the C ABI and `artune check` apply), or
    None (with one warning line saying why) to change nothing."""
    path = os.environ.get(ENV_PROFILE)
    if not path:
        return None
    unchanged = f"{engine} starts as without artune"
    try:
        allow_simulated, allow_invalid = switch(ENV_ALLOW_SIMULATED), switch(ENV_ALLOW_INVALID)
    except BadSetting as e:
        say(log, "artune: %s; %s", e, unchanged)
        return None
    if os.environ.get(ENV_ALLOW_STALE):
        say(log, "artune: %s is no longer read (it skipped every check without a word); "
            "artune follows a profile valid for this machine, and %s=1 follows one that is "
            "not, saying why in the start-up line", ENV_ALLOW_STALE, ENV_ALLOW_INVALID)
    try:
        p = Profile.load(path)
    except ArtuneError as e:
        say(log, "artune: %s; %s", e, unchanged)
        return None
    c = p.check(nccl=nccl_version(), allow_simulated=allow_simulated,
                allow_invalid=allow_invalid)
    if not c.followed:
        say(log, "artune: %s is %s; %s", path, c.verdict, unchanged)
        return None
    return p, c.verdict


def start(log: logging.Logger, engine: str, key: str, version: str,
          determinism: Optional[str], settings: Optional[Callable[[], object]] = None):
    """The plugins' one start: the per-engine off switch (``ARTUNE_VLLM=0``,
    ``ARTUNE_SGLANG=off``), the engine's own settings (``settings()``, which raises
    BadSetting for a word it does not take), determinism the user asked for
    (``determinism`` names it), the profile, and the engine's version against the one artune
    was read against. None: change nothing (said in one line where the user set
    ARTUNE_PROFILE). Else (profile, what ``settings()`` returned, the validity verdict)."""
    if not os.environ.get(ENV_PROFILE):
        return None
    off = f"ARTUNE_{key.upper()}"
    try:
        on = setting(off, {"on": ON, "off": OFF}, "on") == "on"
        chosen = settings() if settings is not None else None
    except BadSetting as e:
        say(log, "artune: %s; %s starts as without artune", e, engine)
        return None
    if not on:
        say(log, "artune: %s=%s, so %s starts as without artune", off, os.environ[off],
            engine)
        return None
    if determinism:
        say(log, "artune: %s asks for a fixed reduction order, so artune changes nothing in "
            "%s", determinism, engine)
        return None
    loaded = load(log, engine)
    if loaded is None:
        return None
    p, verdict = loaded
    read = MODEL[key]["read_against"]
    if version != read:
        say(log, "artune: %s %s is not the release artune was read against (%s); artune "
            "applies only the patches whose symbol and signature it finds as read",
            engine, version, read)
    return p, chosen, verdict


def left_alone(key: str) -> str:
    """The paths of an engine the plugin leaves alone, each with the short reason engines.json
    gives it (``left_alone``): the start-up line's list."""
    return "; ".join(r["left_alone"] for r in MODEL[key]["order"] if "left_alone" in r)


def startup(log: logging.Logger, engine: str, bands: "Bands", name: str, ws: int,
            own: Optional["OwnKernels"], full: str) -> None:
    """The start-up line of one TP group, the same in both plugins and logged by the group's
    rank 0 through the engine's logger: one short line at INFO (which profile, whether it is
    valid here and why, how many sizes it steers, where artune's own kernels run), at WARNING
    where the profile gives artune's kernels sizes they could not take; the full list
    (``full``: every band, path and patch) at DEBUG."""
    if not bands.covers(ws):
        short = (f"artune: TP{ws} group {name}: {bands.path} ({bands.verdict}) has no TP{ws} "
                 f"group, so {engine} keeps its own choice here")
    else:
        graph, eager = bands.describe(ws, "graph"), bands.describe(ws, "eager")
        bands_said = (f"graph and eager: {graph}" if graph == eager
                      else f"graph: {graph}; eager: {eager}")
        n = len(set(bands.profile.sizes(ws, "graph")) | set(bands.profile.sizes(ws, "eager")))
        short = "; ".join([
            f"artune: TP{ws} group {name} follows {bands.path} ({bands.verdict})",
            f"{n} sizes steered ({bands_said})",
            own.where if own is not None else "artune's own kernels take no size here",
        ])
    if own is not None and own.refused:
        log.warning("%s", short)
    else:
        log.info("%s", short)
    log.debug("%s", full)


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

    def find(self, path: str, point: str = "patch"):
        """(owner, name, current) for a path's patch point (``point``: a row's "patch", or
        another point it names, such as SGLang v2's per-call "gate"), or None (recorded) if
        absent or not as read."""
        spec = self.rows[path][point]
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

    def asked_by(self, path: str):
        """The code objects of the callers a path's gate may refuse (engines.json
        ``asked_by``: the engine's dispatch, which falls back when refused), or None
        (recorded) where none of them is found as read: then the path is not gated."""
        names = self.rows[path].get("asked_by", [])
        codes = {n: code_of(n) for n in names}
        found = frozenset(c for c in codes.values() if c is not None)
        missing = [n for n, c in codes.items() if c is None]
        if not found:
            self.skipped.append(f"{path} (the callers it is refused to, {', '.join(missing)}, "
                                "are not as read)")
            return None
        if missing:
            self.skipped.append(f"{path} refused to {', '.join(missing)} (not as read, so "
                                "it gets the engine's answer)")
        return found

    def apply(self, path: str, wrap: Callable, point: str = "patch") -> bool:
        found = self.find(path, point)
        if found is None:
            return False
        owner, name, f = found
        self._undo.append((owner, name, f))
        setattr(owner, name, wrap(getattr(owner, name)))
        self.applied.append(path if point == "patch" else f"{path} {point}")
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
    """Per TP size and mode, where the profile routes messages to a custom kernel: the rule of
    src/export/follow.rs (``Profile.custom_at``, ``custom_prefix``, ``largest_custom``,
    ``fused_up_to``), which `artune why` reports, with the engine's patches' own state
    (``active``: off under an engine's deterministic mode)."""

    def __init__(self, p: Profile, verdict: str = "valid here") -> None:
        self.path = os.environ.get(ENV_PROFILE, "")
        self.active = True
        self.profile = p
        #: The validity rule's verdict for this machine, as :func:`load` found it.
        self.verdict = verdict
        self._tps = set(p.tp_sizes)

    def covers(self, tp: int) -> bool:
        return tp in self._tps

    def custom_at(self, tp: int, nbytes: int, mode: Optional[str]) -> Optional[bool]:
        """True where the profile chose a custom kernel, False where NCCL, None where the
        profile has no answer (the engine keeps its own rule). ``mode=None``: either mode
        (False where either is NCCL)."""
        if not self.active or tp not in self._tps:
            return None
        if mode is None:
            got = [self.profile.custom_at(tp, nbytes, m) for m in ("graph", "eager")]
            return False if False in got else True if True in got else None
        return self.profile.custom_at(tp, nbytes, mode)

    def largest_custom(self, tp: int) -> Optional[int]:
        """The largest message the profile routes to a custom kernel at ``tp``, either mode
        (0: none): what a custom all-reduce serving both modes is cut to. None where the
        profile lacks ``tp`` or a mode there: the engine's own size stands."""
        return self.profile.largest_custom(tp) if tp in self._tps else None

    def custom_prefix(self, tp: int) -> Optional[int]:
        """The largest size up to which the profile chooses custom at every size from the
        smallest, in both modes (0: it starts with NCCL); None where it lacks ``tp`` or a
        mode there (a fusion serving both modes keeps the engine's sizes)."""
        return self.profile.custom_prefix(tp) if tp in self._tps else None

    def fused_up_to(self, tp: int, engine: Optional[int]) -> Optional[int]:
        """A fused allreduce+norm the engine fuses up to ``engine`` bytes: how far the plugin
        lets it fuse (None: not at all)."""
        return self.profile.fused_up_to(tp, engine)

    def describe(self, tp: int, mode: str) -> str:
        """The profile's bands at ``tp`` as "custom to 64K, NCCL to 64M"."""
        bands = self.profile.bands(tp, mode)
        if not bands:
            return "no bands (the engine keeps its own rule)"
        out = []
        for b in bands:
            if out and out[-1][1] == b.custom:
                out[-1] = (b.up_to_bytes, b.custom)
            else:
                out.append((b.up_to_bytes, b.custom))
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


def compiling() -> bool:
    """True while torch.compile traces: the call comes from the engine's traced dispatch
    (SGLang's all_reduce under compile), where frames are not the engine's own."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch.compiler.is_compiling())
    except Exception:  # noqa: BLE001 - no torch or an old one: not tracing
        return False


def code_of(name: str):
    """The code object of ``module:Qual.name`` in the installed engine, or None."""
    module, _, qualname = name.partition(":")
    try:
        owner = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - an optional engine module that cannot import
        return None
    *outer, last = qualname.split(".")
    for part in outer:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    f = inspect.getattr_static(owner, last, None) if isinstance(owner, type) else getattr(
        owner, last, None)
    f = getattr(f, "__func__", f)
    try:
        f = inspect.unwrap(f)
    except Exception:  # noqa: BLE001 - a wrapper chain that loops: take it as it is
        pass
    return getattr(f, "__code__", None)


def refuses(asked_by, other: Optional[Callable], path: str, frame) -> bool:
    """Whether a refusal may be given to the caller whose frame is ``frame``: one that falls
    back when refused (``asked_by``), or the engine's dispatch being traced. Any other
    caller gets the engine's answer, said once by ``other(path, code)``."""
    if compiling() or frame.f_code in asked_by:
        return True
    if other is not None:
        other(path, frame.f_code)
    return False


def gate(bands: Bands, world_size: Callable = world_size_of,
         unknown: Optional[Callable[[str], None]] = None, path: str = "",
         asked_by=frozenset(), other: Optional[Callable] = None):
    """The rule for a peer-to-peer path's ``should_*(self, inp, ...)``: still False wherever
    the engine says no, and False where the profile chose NCCL for this TP size, size and
    mode, when a caller in ``asked_by`` asks (one that falls back to the next path when
    refused). Where the profile says custom or has no answer, or another caller asks, the
    engine's answer stands. Where the TP size cannot be told, the engine's answer stands and
    ``unknown(path)`` says so (the plugins list it under "not applied" and warn once): never
    a silent pass."""

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
            # Traced (torch.compile: the engine's dispatch), the graph may replay captured or
            # eagerly, so either mode; and no frame is read there, which Dynamo cannot trace.
            traced = compiling()
            mode = None if traced else mode_of(self)
            if bands.custom_at(ws, nbytes_of(inp), mode) is not False:
                return True
            return not traced and not refuses(asked_by, other, path, sys._getframe(1))

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


def other_reporter(log: logging.Logger, engine: str):
    """``gate``'s ``other``: one line per path and caller that asked where the profile says
    NCCL but which artune does not know to fall back, so it got the engine's answer."""
    seen = set()

    def report(path: str, code) -> None:
        caller = f"{code.co_filename}:{getattr(code, 'co_qualname', code.co_name)}"
        if (path, caller) in seen:
            return
        seen.add((path, caller))
        log.info("artune: %s was asked by %s, which artune does not know to fall back when "
                 "refused, so it gets %s's own answer (the profile gives NCCL at that size)",
                 path, caller, engine)

    return report


def follow(bands: Bands, asked_by=frozenset(), other: Optional[Callable] = None,
           path: str = "custom"):
    """For an engine's custom all-reduce ``should_custom_ar(self, inp)``: False wherever the
    engine says no; where it says yes, what the profile chose for this size and mode, for a
    caller in ``asked_by`` (any other caller gets the engine's yes)."""

    def wrap(should):
        @functools.wraps(should)
        def followed(self, inp):
            if not should(self, inp):
                return False
            chosen = bands.custom_at(self.world_size, nbytes_of(inp), mode_of(self))
            if chosen is not False:
                return True
            return not refuses(asked_by, other, path, sys._getframe(1))

        return followed

    return wrap


def round_up16(n: int) -> int:
    return (n + 15) // 16 * 16


#: Which sizes artune's own kernels (artune.allreduce) take inside an engine: ``islands`` (the
#: default) where the profile chose a kernel no engine has (the island schedules), ``artune``
#: every size the profile gives a custom kernel, ``engine`` none. The rule is Rust's
#: (src/profile/routes.rs ``KernelSetting``), which `artune why` reports from.
ENV_KERNELS = "ARTUNE_KERNELS"
KERNELS = {"islands": ("islands",), "artune": ON + ("artune",), "engine": OFF + ("engine",)}


def kernels_env(key: str) -> str:
    """The per-engine variable (ARTUNE_VLLM_KERNELS, ARTUNE_SGLANG_KERNELS)."""
    return f"ARTUNE_{key.upper()}_KERNELS"


def kernels(key: str) -> Tuple[str, str]:
    """The engine's kernels setting and how it was set: (``islands``, ``artune`` or
    ``engine``, "VAR=value" or "the default"). The engine's own variable wins over
    ARTUNE_KERNELS; both are read, and BadSetting is raised for another word in either."""
    everywhere = setting(ENV_KERNELS, KERNELS, "")
    own = setting(kernels_env(key), KERNELS, "")
    if own:
        return own, f"{kernels_env(key)}={own}"
    if everywhere:
        return everywhere, f"{ENV_KERNELS}={everywhere}"
    return "islands", "the default"


class OwnKernels:
    """artune's own kernels in one TP group: the op (None: the engine's paths everywhere), what
    the full start-up line says of them (``said``) and the short one (``where``: which sizes
    they take); ``refused`` where the profile gives them sizes but the op could not be built
    (the short line is then a warning, and says why)."""

    def __init__(self, op, said: str, refused: bool = False, where: Optional[str] = None):
        self.op = op
        self.said = said
        self.refused = refused
        self.where = said if where is None or refused else where


def own_kernels(p: Profile, chosen: Tuple[str, str], group, tp: int, device,
                log: logging.Logger, engine: str) -> OwnKernels:
    """Builds artune's op (artune.allreduce) on ``group``, the TP group's gloo group, for the
    sizes the kernels setting ``chosen`` (from :func:`kernels`) gives it, or says why there is
    none. Collective where the profile gives the op sizes: every rank of the group calls it
    with the same profile and settings (the engine's processes share one environment), and
    the op agrees every failure among them, so all ranks route alike. Never raises: the
    engine's paths serve whatever the op does not take."""
    choice, how = chosen
    if choice == "engine":
        return OwnKernels(None, f"artune's own kernels off ({how})")
    try:
        from ._artune import Routes, engine_kernels

        only = engine_kernels(choice)
        Routes.from_profile(p, tp, only)
    except ArtuneError as e:
        more = ("; ARTUNE_KERNELS=artune gives them every custom size"
                if choice == "islands" else "")
        return OwnKernels(None, f"artune's own kernels take no size here ({e}; {how}{more})")
    except Exception as e:  # noqa: BLE001 - artune's own logic: the engine keeps its paths
        return OwnKernels(None, f"artune's own kernels not used ({type(e).__name__}: {e}); "
                          f"{engine} runs its own paths", True)
    try:
        from .allreduce import Allreduce

        op, why = Allreduce.build(group, p, device=device, logger=log, only=only)
    except Exception as e:  # noqa: BLE001 - no torch, or a bug of artune's: engine's paths
        op, why = None, f"{type(e).__name__}: {e}"
    if op is None:
        return OwnKernels(None, f"artune's own kernels not used: {why}; {engine} runs its own "
                          "paths at the sizes the profile gives them", True)
    where = f"artune's own kernels ({how}) take {why}"
    return OwnKernels(op, f"{where}; their buffers, allocated before {engine} sizes its KV "
                      f"cache: {op.describe_memory()}", where=where)


def registering(graph_capture, op_of: Callable):
    """For an engine's ``GroupCoordinator.graph_capture(self, ...)`` (a context manager, inside
    which the engine captures its CUDA graphs): where the group has artune's op (``op_of``),
    the calls it captures there take the registered form, and once the engine's context has
    exited (where the engine registers its own custom all-reduce's graph buffers, in that
    object's ``capture()``), the op registers them on every rank (``Allreduce.capture``).
    Elsewhere the engine's context as it is."""

    @functools.wraps(graph_capture)
    def wrapped(self, *args, **kwargs):
        try:
            op = op_of(self)
        except Exception:  # noqa: BLE001 - no op to read: the engine's capture as it is
            op = None
        if op is None:
            return graph_capture(self, *args, **kwargs)
        return _registered(op, graph_capture(self, *args, **kwargs))

    return wrapped


@contextlib.contextmanager
def _registered(op, engine):
    with op.capture(), engine as context:
        yield context


def routed_first(attr: str = "_artune_op"):
    """For an engine's all-reduce ``f(self, input_)``: artune's op (``self.<attr>``) takes the
    message where it says it runs it, else the engine's call runs unchanged. Not while
    torch.compile traces: the traced code reaches the engine's call through its custom op."""

    def wrap(all_reduce):
        @functools.wraps(all_reduce)
        def routed(self, input_):
            op = getattr(self, attr, None)
            if op is not None and not compiling() and op.should_run(input_):
                return op.all_reduce(input_, fallback=lambda x: all_reduce(self, x))
            return all_reduce(self, input_)

        return routed

    return wrap
