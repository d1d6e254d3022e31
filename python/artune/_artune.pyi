"""Type hints for the extension module ``artune._artune`` (src/python.rs)."""

from os import PathLike
from typing import Literal, Optional, Union

__version__: str

Mode = Literal["graph", "eager"]

class ArtuneError(Exception): ...
class ProfileError(ArtuneError): ...
class BadInputError(ArtuneError): ...
class HardwareError(ArtuneError): ...

class Choice:
    backend: str
    nccl: str
    expected_us: float
    bucket_bytes: int
    buffer_bytes: int
    custom: bool

class Band:
    up_to_bytes: int
    backend: str
    nccl: str
    custom: bool

class Check:
    holds: bool
    changes: list[str]
    unchecked: list[str]

class Profile:
    @staticmethod
    def load(path: Union[str, PathLike[str]]) -> Profile: ...
    @property
    def simulated(self) -> bool: ...
    @property
    def fabric(self) -> str: ...
    @property
    def created(self) -> str: ...
    @property
    def tp_sizes(self) -> list[int]: ...
    def select(self, tp: int, nbytes: int, mode: Mode = "graph") -> Optional[Choice]: ...
    def explain(self, tp: int, nbytes: int, mode: Mode = "graph") -> str: ...
    def sglang_plan(self, tp: int, mode: Mode = "graph") -> Optional[tuple]: ...
    def bands(self, tp: int, mode: Mode = "graph") -> list[Band]: ...
    def memory(self, tp: int, mode: Mode = "graph") -> dict[str, int]: ...
    def check(
        self,
        sim: Optional[str] = None,
        topology: Optional[Union[str, PathLike[str]]] = None,
        nccl: Optional[str] = None,
    ) -> Check: ...

def backends() -> list[str]: ...
