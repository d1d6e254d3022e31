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

Run:  python -m torch.distributed.run --standalone --nproc-per-node 2 \\
          benches/nccl_graph_calls.py --out graph-calls.json
"""

import argparse
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


def graph_of(k, body, stream):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm the call outside the capture, as b12x does
            body()
        stream.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(k):
                body()
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--samples", type=int, default=3)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = torch.cuda.device_count()
    torch.cuda.set_device(local % gpus)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local % gpus))
    side = torch.cuda.Stream()
    rows = []
    for nbytes in SIZES:
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        row = {"bytes": nbytes}
        row["eager_us"] = timed(lambda: [dist.all_reduce(x) for _ in range(args.calls)],
                                args.calls, args.samples, side)
        for what, body in (("nccl", lambda: dist.all_reduce(x)), ("kernel", lambda: x.mul_(1))):
            for k in PER_GRAPH:
                g = graph_of(k, body, side)
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
        rows.append(row)
        if rank == 0:
            cells = "  ".join(f"{k}={v:.2f}" for k, v in row.items()
                              if isinstance(v, float))
            print(f"{nbytes:>8} B  {cells}  correct {row['correct']}", flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "world": dist.get_world_size(), "gpus": gpus,
                       "mixing": os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "default (1)"),
                       "calls": args.calls, "samples": args.samples,
                       "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                       "nccl": ".".join(map(str, torch.cuda.nccl.version()))},
                      f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
