"""The GPU classes the dispatch tables run on, and what no GPU here can give: a tensor that
says it lives on CUDA. Everything else in the tables is the engines' own code."""

from typing import NamedTuple

import torch

KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB, 64 * KIB, 512 * KIB, 4 * MIB]
MODES = ["graph", "eager"]
HIDDEN = 2048  # bf16 elements per token: 4 KiB per token


class Machine(NamedTuple):
    name: str
    cap: tuple
    tp: int
    nvlink: bool  # every GPU of the group NVLinked to every other
    multicast: bool  # NVSwitch multicast (NVLS): Hopper and later on NVSwitch
    profile: str  # the conftest profile whose bands it follows (simulated: labelled so)
    p2p: bool = True  # the GPUs reach each other's memory (CUDA peer access)


MACHINES = [
    Machine("H200 TP8 NVSwitch", (9, 0), 8, True, True, "nv_mid"),
    Machine("B200 TP8 NVSwitch", (10, 0), 8, True, True, "nv_nccl"),
    Machine("A100 TP8 NVLink", (8, 0), 8, True, False, "nv_mid"),
    Machine("L40S TP2 PCIe", (8, 9), 2, False, False, "pair"),
    Machine("RTX PRO 6000 TP8 PCIe", (12, 0), 8, False, False, "story"),
]


class OnCuda(torch.Tensor):
    """A meta tensor that reports CUDA, so the engines' size and device checks run as on a GPU."""

    @property
    def is_cuda(self):
        return True

    @property
    def is_cpu(self):
        return False


def message(nbytes: int, hidden: int = HIDDEN, dtype=torch.bfloat16) -> torch.Tensor:
    """A message of ``nbytes`` bytes of ``dtype``: an fp32 message has half the elements of a
    bf16 one of the same size, so a size counted as two bytes an element is seen."""
    size = torch.empty((), dtype=dtype).element_size()
    t = torch.empty((nbytes // (size * hidden), hidden), dtype=dtype, device="meta")
    return t.as_subclass(OnCuda)


def rows():
    """Every (machine, size, mode) of the table, with a readable id."""
    for m in MACHINES:
        for n in SIZES:
            for mode in MODES:
                yield m, n, mode
