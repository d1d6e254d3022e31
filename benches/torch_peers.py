#!/usr/bin/env python3
"""PyTorch's allreduce paths on the sizes artune tunes, for `benches/compare.py`.

Measures, per TP size, launch mode and message size:
  torch_nccl      torch.distributed.all_reduce over NCCL (in place, as engines call it)
  torch_one_shot  torch.ops.symm_mem.one_shot_all_reduce_out: every rank reads all peers'
                  symmetric buffers and reduces (artune's one_stage_* analogue)
  torch_two_shot  torch.ops.symm_mem.two_shot_all_reduce_: reduce-scatter by reading peers'
                  shards, then each rank writes its reduced shard to every peer (in place;
                  artune's two_stage_* analogue)
The symmetric-memory input stays resident in the symmetric buffer, as artune's pull kernels
read an IPC-mapped input; no copy-in is timed.

Timing as artune does it: warm-up, then `--repeats` samples of `--iters` back-to-back calls
(eager) or one replay of a CUDA graph holding `--iters` calls (graph), CUDA events around each
sample, per-call time = sample / iters, the slowest rank's sample counts; median, p10 and p90
over samples. Every result is checked against the exact sum before it is timed.

Run:  torchrun --nproc-per-node N benches/torch_peers.py --tp 2,4,8 --out torch-peers.csv
      python benches/torch_peers.py --out torch-peers.csv      (one GPU: world size 1)
Exit codes: 2 bad input, 4 GPU/driver/library failure, 130 interrupted. The CSV is written
whole at the end (through a temporary file and a rename) or not at all.
"""

import argparse
import csv
import datetime
import math
import os
import sys
import tempfile
import warnings

import atomic


# NVLink multicast stays off: on shared multi-GPU hosts a program using it can put every GPU
# out of service. Set before torch.distributed (and NCCL/NVSHMEM) are imported or initialised.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(MULTICAST_OFF)

COLUMNS = [
    "impl", "mode", "tp", "bytes", "median_us", "p10_us", "p90_us", "iters",
    "torch_version", "nccl_version", "gpu_name", "date",
    # beyond the required columns
    "status", "repeats", "dtype", "world_size", "gpus", "mem_bytes", "note",
]
IMPLS = ["torch_nccl", "torch_one_shot", "torch_two_shot"]
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
         "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


class BadInput(Exception):
    """Exit 2: the user asked for something this script cannot do."""


class DeviceFailure(Exception):
    """Exit 4: the GPU, driver or a library failed."""


def parse_bytes(text):
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    unit = t[len(num):]
    if not num.isdigit() or unit not in UNITS:
        raise BadInput(f"'{text}' is not a size: write bytes like 4096, 4K, 1M or 256MiB.")
    return int(num) * UNITS[unit]


def parse_sizes(text):
    """'1K:256M' (or '1K..256M') is every power of two between; '1K,4K,1M' is a list."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        sep = ":" if ":" in part else (".." if ".." in part else None)
        if sep:
            lo, hi = (parse_bytes(x) for x in part.split(sep, 1))
            if lo <= 0 or lo > hi:
                raise BadInput(f"size range '{part}' is empty: write it low:high, e.g. 1K:256M.")
            b = lo
            while b <= hi:
                sizes.append(b)
                b *= 2
        else:
            sizes.append(parse_bytes(part))
    if not sizes or min(sizes) <= 0:
        raise BadInput("--sizes needs at least one positive size, e.g. 1K:256M.")
    return sorted(set(sizes))


def parse_int_list(text, what):
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise BadInput(f"{what} '{text}' is not a comma-separated list of integers.") from None
    if not vals or min(vals) < 1:
        raise BadInput(f"{what} needs positive integers, e.g. 2,4,8.")
    return vals


def percentile(sorted_vals, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(samples):
    s = sorted(samples)
    return percentile(s, 0.5), percentile(s, 0.1), percentile(s, 0.9)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Time torch NCCL and symmetric-memory allreduce on artune's sizes.")
    p.add_argument("--sizes", default="1K:256M", help="1K:256M (powers of two) or 1K,64K,1M")
    p.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32")
    p.add_argument("--mode", default="both", help="graph | eager | both")
    p.add_argument("--iters", type=int, default=50, help="calls per timed sample")
    p.add_argument("--repeats", type=int, default=20, help="timed samples per cell")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls before timing")
    p.add_argument("--tp", default=None, help="TP sizes, ranks 0..tp-1 each (default: world)")
    p.add_argument("--impls", default=",".join(IMPLS), help=",".join(IMPLS))
    p.add_argument("--out", default="torch-peers.csv", help="CSV to write (rank 0)")
    p.add_argument("--self-test", action="store_true", help="check the pure helpers; no GPU")
    a = p.parse_args(argv)
    if a.self_test:
        return a
    a.sizes = parse_sizes(a.sizes)
    if a.dtype not in DTYPES:
        raise BadInput(f"--dtype '{a.dtype}' is not one of bf16, fp16, fp32.")
    if a.mode not in ("graph", "eager", "both"):
        raise BadInput(f"--mode '{a.mode}' is not one of graph, eager, both.")
    a.modes = ["graph", "eager"] if a.mode == "both" else [a.mode]
    for name in ("iters", "repeats"):
        if getattr(a, name) < 1:
            raise BadInput(f"--{name} must be at least 1.")
    if a.warmup < 0:
        raise BadInput("--warmup must not be negative.")
    a.impls = [x.strip() for x in a.impls.split(",") if x.strip()]
    unknown = [x for x in a.impls if x not in IMPLS]
    if unknown or not a.impls:
        raise BadInput(f"--impls {','.join(unknown) or '(empty)'} unknown: use {','.join(IMPLS)}.")
    esize = DTYPES[a.dtype]
    odd = [b for b in a.sizes if b % max(esize, 4) != 0]
    if odd:
        raise BadInput(f"size {odd[0]} is not a multiple of {max(esize, 4)} bytes "
                       f"(whole {a.dtype} elements, 4-byte aligned as symmetric memory needs).")
    a.tp = parse_int_list(a.tp, "--tp") if a.tp else None
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(out_dir):
        raise BadInput(f"--out directory {out_dir} does not exist: create it first.")
    return a


def write_csv_atomic(path, rows):
    def fill(f):
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    atomic.write_text(path, fill, ".torch-peers-", ".csv")


def first_line(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


class Bench:
    """One process (rank) of the measurement."""

    def __init__(self, args, torch, dist):
        self.a, self.torch, self.dist = args, torch, dist
        env = os.environ
        self.rank = int(env.get("RANK", "0"))
        self.world = int(env.get("WORLD_SIZE", "1"))
        self.local = int(env.get("LOCAL_RANK", str(self.rank)))
        if not torch.cuda.is_available():
            raise DeviceFailure("PyTorch sees no CUDA GPU (check the driver and "
                                "CUDA_VISIBLE_DEVICES).")
        if self.local >= torch.cuda.device_count():
            raise BadInput(f"rank {self.rank} wants GPU {self.local} but only "
                           f"{torch.cuda.device_count()} are visible: NCCL needs one GPU per "
                           f"rank, so start at most that many processes per node.")
        self.tps = args.tp or [self.world]
        if max(self.tps) > self.world:
            raise BadInput(f"--tp {max(self.tps)} needs that many ranks but the world has "
                           f"{self.world}: start with torchrun --nproc-per-node "
                           f"{max(self.tps)}.")
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
                      "fp32": torch.float32}[args.dtype]
        self.esize = DTYPES[args.dtype]
        self.dev = torch.device("cuda", self.local)
        torch.cuda.set_device(self.dev)
        torch.zeros(1, device=self.dev)  # create the context before counting memory
        torch.cuda.synchronize()
        self.rows = []
        self.date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    # -- memory: free device memory the driver reports, less what torch's cache took --
    def mem_mark(self):
        self.torch.cuda.synchronize()
        return self.torch.cuda.mem_get_info(self.dev)[0], self.torch.cuda.memory_reserved(self.dev)

    def mem_since(self, mark):
        free, reserved = self.mem_mark()
        return max(0, (mark[0] - free) - (reserved - mark[1]))

    def init(self):
        torch, dist = self.torch, self.dist
        from datetime import timedelta
        mark = self.mem_mark()
        kw = dict(backend="nccl", timeout=timedelta(seconds=300), device_id=self.dev)
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(**kw)
        else:  # plain `python torch_peers.py`: a world of one
            dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kw)
        one = torch.ones(1, device=self.dev)
        dist.all_reduce(one)
        self.world_mem = self.mem_since(mark)
        self.torch_version = torch.__version__
        try:
            v = torch.cuda.nccl.version()
            self.nccl_version = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - only a label
            self.nccl_version = "unknown"
        self.gpu_name = torch.cuda.get_device_name(self.dev)
        # torch's default symmetric-memory backend on CUDA is its CUDA IPC one, the analogue
        # of artune's kernels. set_backend("CUDA") is refused by torch 2.11 ("does not find
        # allocation backend CUDA"), so keep the default and record what it is.
        self.symm_backend = "not allocated"
        try:
            import torch.distributed._symmetric_memory as symm_mem
            self.symm = symm_mem
        except Exception as e:  # noqa: BLE001 - recorded as the skip reason
            self.symm = None
            self.symm_error = first_line(e)

    def log(self, msg):
        if self.rank == 0:
            print(msg, flush=True)

    def agree(self, ok, pg):
        """True only if every rank of `pg` says ok (so no rank enters a kernel alone)."""
        t = self.torch.tensor([1 if ok else 0], device=self.dev, dtype=self.torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN, group=pg)
        return bool(t.item())

    def pattern(self, n, rank):
        """Small integers (1..7) differing by rank, so sums are exact in bf16 and a wrong
        peer mapping shows."""
        torch = self.torch
        base = ((torch.arange(7, device=self.dev) * 3 + rank) % 7 + 1).to(self.dtype)
        return base.repeat(n // 7 + 1)[:n]

    def expected(self, n, tp):
        torch = self.torch
        base = sum(((torch.arange(7, device=self.dev) * 3 + r) % 7 + 1) for r in range(tp))
        return base.to(self.dtype).repeat(n // 7 + 1)[:n]

    def row(self, impl, mode, tp, nbytes, status, samples=None, mem=None, note=""):
        med = p10 = p90 = ""
        if samples:
            med, p10, p90 = (f"{v:.3f}" for v in summarize(samples))
        self.rows.append({
            "impl": impl, "mode": mode, "tp": tp, "bytes": nbytes, "median_us": med,
            "p10_us": p10, "p90_us": p90, "iters": self.a.iters,
            "torch_version": self.torch_version, "nccl_version": self.nccl_version,
            "gpu_name": self.gpu_name, "date": self.date, "status": status,
            "repeats": len(samples) if samples else 0, "dtype": self.a.dtype,
            "world_size": self.world, "gpus": " ".join(str(i) for i in range(tp)),
            "mem_bytes": "" if mem is None else mem, "note": note,
        })
        if samples:
            tag = "" if status == "ok" else f"  [{status}]"
            self.log(f"tp{tp} {mode:5} {impl:15} {nbytes:>10} B  median {med} us "
                     f"(p10 {p10}, p90 {p90}){tag}")
        else:
            self.log(f"tp{tp} {mode:5} {impl:15} {nbytes:>10} B  {status}: {note}")

    def run_tp(self, tp, pg, gname, member, mem_nccl):
        torch, dist, a = self.torch, self.dist, self.a
        maxn = max(a.sizes) // self.esize
        impls = {}
        if member and "torch_nccl" in a.impls:
            impls["torch_nccl"] = dict(
                mem=mem_nccl, note="dist.all_reduce, in place; mem = communicator",
                buf=torch.empty(maxn, dtype=self.dtype, device=self.dev))
        symm_wanted = [i for i in ("torch_one_shot", "torch_two_shot") if i in a.impls]
        symm_reason = None
        if member and symm_wanted:
            if self.symm is None:
                symm_reason = f"torch.distributed._symmetric_memory not importable: " \
                              f"{self.symm_error}"
            else:
                mark = self.mem_mark()
                try:
                    buf = self.symm.empty(maxn, dtype=self.dtype, device=self.dev)
                    self.symm.rendezvous(buf, pg)
                    try:
                        self.symm_backend = str(self.symm.get_backend(self.dev))
                    except Exception as e:  # noqa: BLE001 - only a label
                        self.symm_backend = f"unknown ({first_line(e)})"
                    # Raw free-memory drop: the symmetric pool may or may not be torch's cache.
                    torch.cuda.synchronize()
                    mem = max(0, mark[0] - torch.cuda.mem_get_info(self.dev)[0])
                    out = torch.empty(maxn, dtype=self.dtype, device=self.dev)
                except Exception as e:  # noqa: BLE001 - becomes the skip reason
                    symm_reason = f"symmetric memory setup failed: {first_line(e)}"
                if not self.agree(symm_reason is None, pg) and symm_reason is None:
                    symm_reason = "symmetric memory setup failed on another rank"
                if symm_reason is None:
                    note = (f"symmetric-memory backend {self.symm_backend}; mem = one "
                            f"{maxn * self.esize}-byte symmetric buffer + signal pads")
                    for i in symm_wanted:
                        impls[i] = dict(mem=mem, buf=buf, out=out, note=note)
        if not member:
            return
        if symm_reason:
            for i in symm_wanted:
                for mode in a.modes:
                    for b in a.sizes:
                        self.row(i, mode, tp, b, "skipped", note=symm_reason)

        ops = torch.ops.symm_mem if hasattr(torch.ops, "symm_mem") else None
        for b in a.sizes:
            n = b // self.esize
            for name, st in impls.items():
                if name == "torch_nccl":
                    x = st["buf"][:n]
                    src, res = x, x
                    call = lambda x=x: dist.all_reduce(x, group=pg)  # noqa: E731
                elif name == "torch_one_shot":
                    x, o = st["buf"][:n], st["out"][:n]
                    src, res = x, o
                    call = lambda x=x, o=o: ops.one_shot_all_reduce_out(  # noqa: E731
                        x, "sum", gname, o)
                else:
                    x = st["buf"][:n]
                    src, res = x, x
                    call = lambda x=x: ops.two_shot_all_reduce_(x, "sum", gname)  # noqa: E731
                self.cell(name, tp, b, n, pg, src, res, call, st["mem"], st["note"])
        impls.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def check(self, src, res, call, n, tp, pg, graph):
        """Fill, run one call (eagerly or as a one-call graph), compare with the exact sum."""
        torch = self.torch
        grank = self.dist.get_rank(pg)
        src.copy_(self.pattern(n, grank))
        if res is not src:
            res.zero_()
        torch.cuda.synchronize()
        self.sync(pg)
        if graph:
            g = torch.cuda.CUDAGraph()
            self.capture(g, 1, call)
            src.copy_(self.pattern(n, grank))  # capture may have run nothing; refill anyway
            if res is not src:
                res.zero_()
            torch.cuda.synchronize()
            self.sync(pg)
            g.replay()
        else:
            call()
        torch.cuda.synchronize()
        ok = torch.equal(res, self.expected(n, tp))
        if not ok:
            bad = int((res != self.expected(n, tp)).sum().item())
            return f"wrong result: {bad} of {n} elements differ from the exact sum"
        return None

    def sync(self, pg):
        t = self.torch.zeros(1, device=self.dev)
        self.dist.all_reduce(t, group=pg)
        self.torch.cuda.synchronize()

    def capture(self, g, calls, call):
        """Capture `calls` calls into `g`. An empty capture is found and recorded by
        queues_work, so torch's warning about it is not repeated here."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Graph is empty.*")
            with self.torch.cuda.graph(g, capture_error_mode="thread_local"):
                for _ in range(calls):
                    call()

    def queues_work(self, call):
        """False when one call captures as an empty CUDA graph: it queues no GPU work (NCCL
        with one rank does an in-place allreduce without a kernel), so its time measures
        nothing but the host."""
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                call()
        del g
        return not any("graph is empty" in str(w.message).lower() for w in seen)

    def cell(self, name, tp, nbytes, n, pg, src, res, call, mem, note):
        modes = self.a.modes
        # An eager call comes first: an op's first call (lazy setup) must not be captured.
        err, noop = None, False
        try:
            err = self.check(src, res, call, n, tp, pg, graph=False)
            if err is None:
                noop = not self.queues_work(call)
        except Exception as e:  # noqa: BLE001 - recorded per cell
            err = f"failed: {first_line(e)}"
        if not self.agree(err is None, pg):
            for mode in modes:
                self.row(name, mode, tp, nbytes, "wrong" if err and err.startswith("wrong")
                         else "failed", mem=mem, note=err or "failed on another rank")
            return
        if not self.agree(not noop, pg):
            noop = True
            note = ("no GPU work: one call captures as an empty CUDA graph (NCCL with one "
                    "rank reduces in place without a kernel), so the time is host overhead "
                    "and the check is vacuous; " + note)
        for mode in modes:
            err = None
            if mode == "graph":
                try:
                    err = self.check(src, res, call, n, tp, pg, graph=True)
                except Exception as e:  # noqa: BLE001
                    err = f"failed: {first_line(e)}"
                if not self.agree(err is None, pg):
                    self.row(name, mode, tp, nbytes, "wrong" if err and err.startswith("wrong")
                             else "failed", mem=mem, note=err or "failed on another rank")
                    continue
            samples, terr = None, None
            try:
                samples = self.time(mode, call, pg)
            except Exception as e:  # noqa: BLE001
                terr = f"timing failed: {first_line(e)}"
            if not self.agree(terr is None, pg):
                self.row(name, mode, tp, nbytes, "failed", mem=mem,
                         note=terr or "timing failed on another rank")
                continue
            self.row(name, mode, tp, nbytes, "no-op" if noop else "ok", samples=samples,
                     mem=mem, note=note)

    def time(self, mode, call, pg):
        torch, a = self.torch, self.a
        stream = torch.cuda.Stream(device=self.dev)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(a.warmup):
                call()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        g = None
        if mode == "graph":
            g = torch.cuda.CUDAGraph()
            self.capture(g, a.iters, call)
            g.replay()  # first replay uploads the graph
            torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        per = []
        for _ in range(a.repeats):
            self.sync(pg)
            start.record()
            if g is not None:
                g.replay()
            else:
                for _ in range(a.iters):
                    call()
            stop.record()
            stop.synchronize()
            per.append(start.elapsed_time(stop) * 1000.0 / a.iters)
        # The collective takes as long as its slowest rank.
        t = torch.tensor(per, device=self.dev, dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=pg)
        del g
        return t.tolist()

    def run(self):
        dist = self.dist
        self.init()
        self.log(f"torch {self.torch_version}, NCCL {self.nccl_version}, {self.gpu_name}, "
                 f"world size {self.world}, TP {self.tps}, {self.a.dtype}, modes "
                 f"{self.a.modes}, {len(self.a.sizes)} sizes {min(self.a.sizes)}.."
                 f"{max(self.a.sizes)} B, multicast off ({MULTICAST_OFF})")
        for tp in self.tps:
            if tp == self.world:
                pg, mem = dist.group.WORLD, self.world_mem
            else:
                mark = self.mem_mark()
                pg = dist.new_group(ranks=list(range(tp)))
                if self.rank < tp:
                    one = self.torch.ones(1, device=self.dev)
                    dist.all_reduce(one, group=pg)
                mem = self.mem_since(mark)
            member = self.rank < tp
            gname = pg.group_name if member else None
            self.run_tp(tp, pg, gname, member, mem)
            dist.barrier(device_ids=[self.local])
        if self.rank == 0:
            write_csv_atomic(self.a.out, self.rows)
            print(f"wrote {len(self.rows)} rows to {self.a.out}", flush=True)
        dist.destroy_process_group()


def self_test():
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K..4K,1M") == [1024, 2048, 4096, 1 << 20]
    assert parse_bytes("256MiB") == 256 << 20
    for bad in ("12Q", "8K:1K", "-1", ""):
        try:
            parse_sizes(bad)
        except BadInput:
            continue
        raise AssertionError(f"parse_sizes accepted {bad!r}")
    med, p10, p90 = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (med, p10, p90) == (3.0, 1.4, 4.6), (med, p10, p90)
    assert summarize([7.0]) == (7.0, 7.0, 7.0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.csv")
        write_csv_atomic(path, [{c: "1" for c in COLUMNS}])
        with open(path) as f:
            got = list(csv.DictReader(f))
        assert len(got) == 1 and list(got[0]) == COLUMNS
        assert sorted(os.listdir(d)) == ["x.csv"]
    print("torch_peers self-test: ok")
    return 0


def main(argv=None):
    try:
        a = parse_args(argv)
        if a.self_test:
            return self_test()
        try:
            import torch
            import torch.distributed as dist
        except ImportError as e:
            raise BadInput(f"PyTorch is not importable by {sys.executable} ({e}): run this "
                           f"with the python that has torch, e.g. /opt/torch/.venv/bin/python."
                           ) from None
        if not dist.is_available() or not dist.is_nccl_available():
            raise DeviceFailure("this PyTorch build has no NCCL backend for torch.distributed.")
        Bench(a, torch, dist).run()
        return 0
    except BadInput as e:
        print(f"torch_peers: {e}", file=sys.stderr)
        return 2
    except DeviceFailure as e:
        print(f"torch_peers: {e}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        print("torch_peers: interrupted; no CSV written.", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - CUDA/NCCL errors surface as RuntimeError
        print(f"torch_peers: GPU, driver or NCCL failure: {first_line(e)}", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
