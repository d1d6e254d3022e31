#!/usr/bin/env python3
"""What a CUDA graph around NCCL costs per call, by how many calls the graph holds: torch's
in-place `dist.all_reduce` (bf16) captured k at a time on a side stream and replayed back to
back, as b12x's `_bench_graph_latency` times one call per graph (the method of R1's NCCL column,
docs/MODEL-ERROR.md) and as decode graphs and vLLM-Moet's bench hold many. Beside it the same
for one plain kernel (`x.mul_(1)`), whose one-node graph the driver may launch as a kernel,
and eager calls in a row.

Why: NCCL's graph mixing (NCCL_GRAPH_MIXING_SUPPORT, on by default) makes the first collective
captured in a graph wait on an external event and every captured collective record one
(src/misc/strongstream.cc), so a graph of one NCCL call holds three nodes where a plain
kernel's holds one. If a graph of several nodes costs a replay a fixed time, a one-call graph
pays it on every call and a graph of 100 calls on one call in 100: `per_replay_us` below is
that time, the difference the model would price for R1's method. Run it once with
NCCL_GRAPH_MIXING_SUPPORT=0 too: the difference should shrink if the event nodes are the cause.

Per call = wall clock over `--calls` calls (replays of a graph of k calls, or eager calls)
between two synchronizations, after `--warm` untimed replays; median of `--samples`. Ranks
start each sample together (a barrier over the group's own NCCL). Several ranks on one GPU
(NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1) share its SMs: the per-call times are one
GPU's, not a fabric's, and only differences between k values say anything about the graph.

With --artune PROFILE the same for artune's op forcing one custom kernel (--kernel, a pull
one-shot by default, the shape of R1's one-shot): a kernel whose ranks wait for each other, as
NCCL's do, but one launch per call and no NCCL. Its captured calls are registered
(`register_graph_buffers`) after each capture, as engines do. If a one-call graph costs NCCL
more per replay than it costs this kernel, the cost is NCCL's own, not the ranks meeting.

`nccl` in the JSON is the version of the library loaded into the process (ncclGetVersion),
which LD_PRELOAD may make another than the one torch was built with
(`torch.cuda.nccl.version()`, kept as `nccl_torch_built`).

Run:  python -m torch.distributed.run --standalone --nproc-per-node 2 \\
          benches/nccl_graph_calls.py --out graph-calls.json [--artune profile.json]
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

SIZES = [1 << 10, 16 << 10, 64 << 10, 512 << 10]
PER_GRAPH = [1, 10, 100]


def timed(fn, calls, samples, stream):
    out = []
    for _ in range(samples):
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        stream.synchronize()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e6 / calls)
    return statistics.median(out)


def nccl_loaded():
    """The version of the NCCL that answers torch's calls and every libnccl mapped into the
    process. torch's start-up maps its own wheel's library by path even when LD_PRELOAD put
    another first; symbols resolve in load order, so the global scope's ncclGetVersion is the
    one that runs."""
    mapped = sorted({line.split()[-1] for line in open("/proc/self/maps")
                     if "libnccl" in line and line.split()[-1].startswith("/")})
    code = ctypes.c_int()
    try:
        ctypes.CDLL(None).ncclGetVersion(ctypes.byref(code))
    except AttributeError:
        return None, mapped
    v = code.value
    major, minor, patch = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (
        v // 1000, v // 100 % 10, v % 100)
    return f"{major}.{minor}.{patch}", mapped


def artune_op(profile, kernel):
    """artune's op on the world group, forced to `kernel`, registering captured calls."""
    from artune import allreduce
    op = allreduce.Allreduce.create(dist.group.WORLD, profile, force=kernel,
                                    register_graphs=True)
    if op is None:
        raise SystemExit(f"artune's op refused {kernel} with {profile}")
    return op


def graph_of(k, body, stream, after=None):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm the call outside the capture, as b12x does
            body()
        stream.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(k):
                body()
    if after is not None:
        after()
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--artune", metavar="PROFILE",
                    help="also time artune's op forced to --kernel (a tune of this world size)")
    ap.add_argument("--kernel", default="one_stage_pull")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = torch.cuda.device_count()
    torch.cuda.set_device(local % gpus)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local % gpus))
    side = torch.cuda.Stream()
    op = artune_op(args.artune, args.kernel) if args.artune else None
    rows = []
    for nbytes in SIZES:
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        row = {"bytes": nbytes}
        row["eager_us"] = timed(lambda: [dist.all_reduce(x) for _ in range(args.calls)],
                                args.calls, args.samples, side)
        series = [("nccl", lambda: dist.all_reduce(x), None), ("kernel", lambda: x.mul_(1), None)]
        if op is not None:
            y = torch.empty_like(x)
            series.append(("artune", lambda: op.all_reduce(x, out=y, backend=args.kernel),
                           op.register_graph_buffers))
        for what, body, after in series:
            for k in PER_GRAPH:
                g = graph_of(k, body, side, after)
                replays = max(1, args.calls // k)
                for _ in range(max(1, args.warm // k)):
                    g.replay()
                torch.cuda.synchronize()

                def run(g=g, replays=replays):
                    for _ in range(replays):
                        g.replay()
                row[f"{what}_graph_{k}_us"] = timed(run, replays * k, args.samples, side)
                del g
            # The fixed time a replay costs: from per-call times at 1 and 100 calls a graph,
            # t(k) = c + G / k, so G = (t(1) - t(100)) * 100 / 99.
            row[f"{what}_per_replay_us"] = ((row[f"{what}_graph_1_us"]
                                             - row[f"{what}_graph_100_us"]) * 100 / 99)
        x.fill_(1)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        row["correct"] = bool(torch.all(x == dist.get_world_size()))
        if op is not None:
            x.fill_(1)
            with torch.cuda.stream(side):
                op.all_reduce(x, out=y, backend=args.kernel)
            side.synchronize()
            row["artune_correct"] = bool(torch.all(y == dist.get_world_size()))
        rows.append(row)
        if rank == 0:
            cells = "  ".join(f"{k}={v:.2f}" for k, v in row.items()
                              if isinstance(v, float))
            print(f"{nbytes:>8} B  {cells}  correct {row['correct']}", flush=True)
    version, library = nccl_loaded()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "world": dist.get_world_size(), "gpus": gpus,
                       "mixing": os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "default (1)"),
                       "calls": args.calls, "samples": args.samples,
                       "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                       "nccl": version, "nccl_mapped": library,
                       "nccl_torch_built": ".".join(map(str, torch.cuda.nccl.version())),
                       "artune_kernel": args.kernel if op is not None else None,
                       "mps_share": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")},
                      f, indent=1)
    if op is not None:
        op.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
