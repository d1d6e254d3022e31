"""artune: follow a measured allreduce profile from Python.

    import artune
    p = artune.Profile.load("/etc/artune/profile.json")
    choice = p.select(tp=8, nbytes=14336, mode="graph")   # None: keep the engine's default
    print(choice.backend, choice.nccl, choice.expected_us)
    c = p.check()               # the validity rule for this machine: c.valid, c.reasons, c.notes
    os.environ["NCCL_TUNER_PLUGIN"] = artune.plugin_path()

The engine plugins (``artune.vllm``, ``artune.sglang``) apply a profile at engine start-up.
"""

import os

from ._artune import (  # noqa: F401  (re-exported)
    ArtuneError,
    Band,
    BadInputError,
    Check,
    Choice,
    HardwareError,
    Profile,
    ProfileError,
    __version__,
    backends,
)

__all__ = [
    "ArtuneError",
    "BadInputError",
    "Band",
    "Check",
    "Choice",
    "HardwareError",
    "Profile",
    "ProfileError",
    "backends",
    "plugin_path",
    "__version__",
]


def plugin_path() -> str:
    """The ``libartune.so`` to give NCCL as ``NCCL_TUNER_PLUGIN``: the C ABI and NCCL tuner
    plugin without Python, shipped beside this package's extension module."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libartune.so")
    if not os.path.isfile(path):
        raise ArtuneError(
            f"{path} is missing: this artune package was built without its NCCL plugin "
            "library; reinstall it with `pip install .` from the artune source"
        )
    return path
