"""NVRTC's time per compile unit (one instantiation line per program, bf16 and the unsplit
programs: what a bf16 tune compiles), sm_90, with compile/mod.rs's options; then the same units
side by side. Usage: python3 units.py KERNELS_DIR THREADS [EXTRA_OPTION ...]
(NVRTC_LIB: the libnvrtc.so to load). The defines are layout.rs's of 2026-12-05."""
import ctypes, os, re, sys, time
from concurrent.futures import ThreadPoolExecutor
K, par, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
lib = ctypes.CDLL(os.environ.get("NVRTC_LIB", "libnvrtc.so"))
common = open(f"{K}/common.cuh").read().encode()
defs = ["-DMAX_RANKS=16", "-DMAX_BLOCKS=256", "-DTHREADS=512", "-DLL_OFFSET=65536", "-DLL_LINE=16",
        "-DLL_THREADS=128", "-DLL1_THREADS=64", "-DLL1_MAX_BYTES=65536", "-DLL2_MAX_BYTES=524288"]
opts = ["--gpu-architecture=sm_90", "--std=c++17"] + defs + extra
inst = re.compile(r"^([A-Z0-9_]+)\((\w+),\s*(\w+)\)\s*$")
units = []
for f in ["allreduce.cu", "ce_sum.cu", "island.cu", "check.cu", "probe.cu"]:
    lines = open(f"{K}/{f}").read().splitlines()
    ins = [l for l in lines if inst.match(l.strip())]
    if not ins:
        units.append((f, "\n".join(lines) + "\n"))
    for keep in (l for l in ins if l.strip().endswith("bf16)")):
        body = "\n".join(l for l in lines if not inst.match(l.strip()) or l == keep)
        units.append((f"{f}:{keep.strip()}", body + "\n"))


def comp(u):
    name, src = u
    prog = ctypes.c_void_p()
    h, hn = (ctypes.c_char_p * 1)(common), (ctypes.c_char_p * 1)(b"common.cuh")
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 1, h, hn) == 0
    o = (ctypes.c_char_p * len(opts))(*[x.encode() for x in opts])
    t = time.time()
    r = lib.nvrtcCompileProgram(prog, len(opts), o)
    dt = time.time() - t
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return name, r, dt


t0 = time.time()
with ThreadPoolExecutor(par) as ex:
    for name, r, dt in ex.map(comp, units):
        print(f"{dt:6.2f} s  rc {r}  {name}")
print(f"options {extra}: {len(units)} units on {par} threads in {time.time() - t0:.2f} s")
