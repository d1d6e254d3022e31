#!/usr/bin/env python3
"""artune.allreduce on real GPUs: every result checked, each kernel timed beside the tune's time
of it, its buffers beside the profile's memory figure.

One process per rank under torch.distributed.run, a gloo group (the engine's TP group stand-in;
it carries only the handle exchange), every rank on its own GPU or, in loopback, all on GPU 0.
For each of artune's kernels (forced at every size, whatever the profile chose, with buffers
sized as the tune sized them) and each size:
  - eager calls and replays of a captured torch.cuda.CUDAGraph, on fresh inputs each time,
    checked bit for bit against a reference computed apart from the kernel: every rank draws
    every rank's input from the same formula (values k/8, exact in bf16) and sums them with
    torch;
  - at the timing sizes: `--calls` back-to-back calls per sample (eager: Python calls; graph: one
    replay of a graph holding them), each sample after one untimed call that every rank must
    reach, per call = sample / calls, the slowest rank's median; the same for the bare kernel
    (launched from Rust, no Python per call: the raw launch), beside the profile's median for that
    kernel, size, TP size and mode;
  - the backend's device memory as the op measured it (and the bytes it allocated), beside the
    profile's figure for it.
Every checked result is classed (`classes`): right, nan (all NaN), part_nan (some NaN) or wrong
(no NaN and not the sum: plausible-wrong, what failing safe must never give), each with who
served it: the kernels, the op of a broken group (NaN without a launch, once the kernels
reported a wait that gave up: `fault_lines`, `faulted`) or the fallback (after a failed launch).
With --register the op runs graph mode zero copy (``register_graphs``): each captured graph is
replayed once before ``register_graph_buffers()`` (class ``unregistered``: must be nan where the
call took the registered form, right where the kernel stages nothing; never wrong), then
registered and checked as above; `missed_lines` holds the op's line about the early replay.
Rank 0 writes one JSON file (--out). Modes:
--refusal (the op must refuse; records the line), --peer-dies (rank 1 leaves after the first
call; records what rank 0 sees).

Loopback caveat: processes on one GPU run their kernels concurrently only under MPS; without
it they take turns (time slices) and every barrier waits for the others' slices, so timings
then measure the time slicing, not the kernels. Under MPS hold each of K processes to its share
of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/K): without it the processes' grids compete for
SMs and barriers can give up (profiles/hardware/h200/2026-12-04-mps/).

Run:  python -m torch.distributed.run --standalone --nproc-per-node 4 benches/op_proof.py \
          --profile profile.json --out op-4.json
"""

import argparse
import json
import logging
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def die_with_parent():
    """A worker whose torchrun is killed dies too, instead of spinning on the GPU."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PDEATHSIG
    except OSError:
        pass

# The island schedules run only where the profile's group has islands (run.sh tunes TP8 in
# virtual islands of 4); elsewhere the op refuses them, in one line.
KERNELS = ["one_stage_pull", "one_stage_push", "two_stage_pull", "two_stage_push",
           "island_two_shot", "island_one_shot"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sizes(text):
    out = []
    for s in text.split(","):
        s = s.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
        out.append(int(s.rstrip("KMG")) * mult)
    return out


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def data(rank, n, seed, dtype, device):
    """Rank `rank`'s input: values k/8 in [-1, 1], exact in every dtype, sums of up to 16
    ranks exact too."""
    i = torch.arange(n, device=device, dtype=torch.int64)
    return (((i * 7 + rank * 13 + seed * 5) % 17 - 8).to(torch.float32) / 8).to(dtype)


def classify(y, ref):
    """right, nan (every element NaN), part_nan (some), or wrong (no NaN, not the sum)."""
    if torch.equal(y, ref):
        return "right"
    nan = torch.isnan(y.float())
    return "nan" if bool(nan.all()) else "part_nan" if bool(nan.any()) else "wrong"


def reference(world, n, seed, dtype, device):
    acc = torch.zeros(n, dtype=torch.float32, device=device)
    for r in range(world):
        acc += data(r, n, seed, dtype, device).float()
    return acc.to(dtype)


def profile_time(prof, tp, mode, backend, nbytes):
    for g in prof["groups"]:
        if g["tp"] == tp and g["mode"] == mode:
            for b in g["buckets"]:
                if b["bytes"] == nbytes and backend in b["results"]:
                    return b["results"][backend]["median_us"]
    return None


def say(rank, text):
    if rank == 0:
        print(text, flush=True)


def time_calls(fn, calls, samples, rendezvous):
    """Per-call microseconds of `samples` samples of fn() (which queues `calls` calls)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(samples):
        rendezvous()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop) * 1000.0 / calls)
    return out


def slowest(world, value):
    """The slowest rank's value (the call ends when every rank's does)."""
    vals = [None] * world
    dist.all_gather_object(vals, value)
    return max(vals)


def proof(args, log, lines, rank, world, dev, prof, allreduce, artune):
    dtype_id = next(g["dtype"] for g in prof["groups"])
    dtype = DTYPES[dtype_id]
    esize = torch.tensor([], dtype=dtype).element_size()
    kernels = args.kernels.split(",")
    out = {"kernels": {}}
    for backend in kernels:
        del lines.lines[:]
        op = allreduce.Allreduce.create(dist.group.WORLD, args.profile, force=backend,
                                        logger=log, register_graphs=args.register)
        rec = {"lines": list(lines.lines), "register": args.register}
        out["kernels"][backend] = rec
        if op is None:
            continue
        mem = op.memory()
        rec["memory"] = {"op": mem, "profile": op.routes.profile_memory}
        allmem = [None] * world
        dist.all_gather_object(allmem, mem)
        rec["memory_per_rank"] = allmem
        checks, bad = 0, []
        classes = {}
        seed = 1

        def check(mode, nbytes, y, via):
            nonlocal checks
            checks += 1
            c = classify(y, reference(world, n, seed, dtype, dev))
            classes[f"{c} {via}"] = classes.get(f"{c} {via}", 0) + 1
            if c != "right" and not (mode == "unregistered" and c == "nan"):
                bad.append([mode, nbytes, seed, c, via])

        for nbytes in args.sizes:
            n = nbytes // esize
            # Eager, twice on fresh data.
            for _ in range(2):
                seed += 1
                x = data(rank, n, seed, dtype, dev)
                y = op.all_reduce(x, backend=backend)
                torch.cuda.synchronize()
                check("eager", nbytes, y, via(op))
            if op._off:
                # The op turned to the fallback (gloo here), which a graph cannot capture.
                continue
            # Graph: capture once, replay on fresh inputs copied into the captured tensor.
            sx = data(rank, n, seed, dtype, dev)
            sy = torch.empty_like(sx)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                op.all_reduce(sx, out=sy, backend=backend)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                op.all_reduce(sx, out=sy, backend=backend)
            if args.register:
                # A replay before registration: NaN where the registered form ran.
                seed += 1
                sx.copy_(data(rank, n, seed, dtype, dev))
                sy.fill_(0)
                g.replay()
                torch.cuda.synchronize()
                check("unregistered", nbytes, sy, "unregistered")
                op.should_run(sx)  # the op's next call says what the engine must call
                op.register_graph_buffers()
            for _ in range(2):
                seed += 1
                sx.copy_(data(rank, n, seed, dtype, dev))
                g.replay()
                torch.cuda.synchronize()
                check("graph", nbytes, sy, via(op))
            del g
        rec["checked"] = checks
        rec["wrong"] = bad
        rec["classes"] = classes
        rec["failed_barriers"] = op.failed()
        rec["faulted"] = op._native.faulted()
        rec["fault_lines"] = [m for m in lines.lines if "gave up waiting" in m]
        rec["missed_lines"] = [m for m in lines.lines if "register_graph_buffers" in m]
        rec["graph_calls"] = op.graph_calls()
        say(rank, f"{backend}: {checks} results checked, {len(bad)} not right, {classes}, "
                  f"failed barriers {rec['failed_barriers']}, fault lines "
                  f"{len(rec['fault_lines'])}")
        timings = []
        for nbytes in args.timing_sizes if not op._off else []:
            n = nbytes // esize
            x = data(rank, n, 3, dtype, dev)
            y = torch.empty_like(x)
            calls = args.calls

            def rendezvous():
                op.all_reduce(x, out=y, backend=backend)

            def eager():
                for _ in range(calls):
                    op.all_reduce(x, out=y, backend=backend)

            def raw():
                op.bench(x, y, backend, calls)

            row = {"bytes": nbytes}
            for name, fn in (("eager", eager), ("eager_raw", raw)):
                fn()
                torch.cuda.synchronize()
                row[name] = statistics.median(time_calls(fn, calls, args.samples, rendezvous))
            for name, body in (("graph", eager), ("graph_raw", raw)):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    body()
                if args.register:
                    op.register_graph_buffers()
                g.replay()
                torch.cuda.synchronize()
                row[name] = statistics.median(
                    time_calls(g.replay, calls, args.samples, rendezvous))
                del g
            for k in ("eager", "eager_raw", "graph", "graph_raw"):
                row[k] = slowest(world, row[k])
            for mode in ("eager", "graph"):
                row[f"tune_{mode}"] = profile_time(prof, world, mode, backend, nbytes)
            timings.append(row)
            say(rank, f"{backend} {nbytes} B us/call: " + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in row.items() if k != "bytes"))
        rec["timings"] = timings
        rec["failed_barriers_after_timing"] = op.failed()
        op.close()
    return out


def refusal(args, log, lines, allreduce):
    op = allreduce.Allreduce.create(dist.group.WORLD, args.profile, force="one_stage_pull",
                                    logger=log)
    ok = op is not None
    if op is not None:
        op.close()
    return {"created": ok, "lines": list(lines.lines)}


def via(op) -> str:
    """Who answered a call: the kernels, the op of a broken group (NaN without a launch), or the
    fallback (an op turned off by a failed launch)."""
    return "broken" if op._broken else "fallback" if op._off else "kernel"


def peer_dies(args, log, lines, rank, world, dev, prof, allreduce):
    dtype = DTYPES[next(g["dtype"] for g in prof["groups"])]
    op = allreduce.Allreduce.create(dist.group.WORLD, args.profile, force="one_stage_pull",
                                    logger=log)
    if op is None:
        return {"created": False, "lines": list(lines.lines)}
    n = 65536 // torch.tensor([], dtype=dtype).element_size()
    x = data(rank, n, 1, dtype, dev)
    y = op.all_reduce(x)
    torch.cuda.synchronize()
    first = bool(torch.equal(y, reference(world, n, 1, dtype, dev)))
    dist.barrier()
    if rank == world - 1:
        os._exit(0)  # the peer is gone: no goodbye, as a crash
    time.sleep(2)
    t0 = time.monotonic()
    results, own = [], []

    def engine(x):
        # The engine's own allreduce stands here; with a dead peer it would fail as it does
        # without artune, so this one only records that it was called.
        own.append(len(results))
        return x.clone()

    for _ in range(3):
        y = op.all_reduce(data(rank, n, 2, dtype, dev), fallback=engine)
        try:
            torch.cuda.synchronize()
            if own and own[-1] == len(results):
                results.append("fallback")
            else:
                results.append(classify(y, reference(world, n, 2, dtype, dev)))
        except Exception as e:  # noqa: BLE001 - what the engine would see is the point
            results.append(f"{type(e).__name__}: {e}")
            break
    took = time.monotonic() - t0
    try:
        failed = op.failed()
    except Exception as e:  # noqa: BLE001
        failed = f"{type(e).__name__}: {e}"
    return {"first_call_correct": first, "after_peer_left": results,
            "seconds_for_3_calls": took, "failed_barriers": failed,
            "faulted": op._native.faulted(), "lines": list(lines.lines)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--sizes", type=sizes, default=sizes("4K,16K,64K,256K,1M,4M,16M"))
    ap.add_argument("--timing-sizes", type=sizes, default=sizes("4K,64K,1M,16M"))
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--refusal", action="store_true")
    ap.add_argument("--peer-dies", action="store_true")
    ap.add_argument("--register", action="store_true",
                    help="graph mode zero copy: register each captured graph's inputs")
    args = ap.parse_args()
    die_with_parent()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    import artune
    from artune import allreduce

    log = logging.getLogger("engine")
    log.setLevel(logging.INFO)
    lines = Lines()
    log.addHandler(lines)
    with open(args.profile) as f:
        prof = json.load(f)
    t0 = time.monotonic()
    if args.refusal:
        res = refusal(args, log, lines, allreduce)
    elif args.peer_dies:
        res = peer_dies(args, log, lines, rank, world, dev, prof, allreduce)
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        os._exit(0)  # the group lost a rank: no collective teardown
    else:
        res = proof(args, log, lines, rank, world, dev, prof, allreduce, artune)
    res.update({"world": world, "seconds": time.monotonic() - t0, "torch": torch.__version__,
                "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
                "device": torch.cuda.get_device_name(dev)})
    every = [None] * world
    dist.all_gather_object(every, res)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"rank0": res, "ranks": every}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
