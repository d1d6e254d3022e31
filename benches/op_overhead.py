#!/usr/bin/env python3
"""What artune.allreduce adds to a call of its kernel: the op's per-call time over the raw
kernel launch, eager and in a CUDA graph, per kernel at 4 KiB, 64 KiB and 1 MiB.

The raw launch is the same kernel on the same tensors, queued `--calls` times by one native
call (no Python per call). The op's call is what an engine makes: `op.all_reduce` from Python on
torch tensors, which is one native call (artune._artune.EagerPath: the checks, the route,
torch's current stream and the launch). Beside it, the Python form of the same call
(`Allreduce.all_reduce(op, ...)`, the path before the native one), for comparison. Each is
timed twice: with `out` (the engine passes the output, as the raw launch has it) and without
(the op allocates it with torch.empty_like, as an engine's out-of-place call does); `alloc_us`
is torch.empty_like alone on this host (wall clock per call), the part of the second that is
torch's allocator. The target (issue 42): the eager call with `out` at most `--limit` us over
the raw launch; `target` in the JSON says whether every row meets it, with and without `out`.

Both stage through the kernel's shared buffers inside the kernel, as the tune timed it. Eager:
CUDA events around `--calls` back-to-back calls, so where the host is slower than the kernel
the host's time is what shows. Graph: one replay of a graph that holds `--calls` calls of the
op (native). Median of `--samples` samples; overhead = op minus raw.

With --register the op runs graph mode zero copy (``register_graphs``): each graph is registered
(``register_graph_buffers()``) after capture, and the kernels that have one (the pull kernels,
two-stage push and the island kernels) replay their registered form, raw launch and op alike
(`form` says which ran).

`--grad-mode` says under which of torch's modes the calls run, as the engines run them: vLLM's
model runner under `torch.inference_mode()` (`inference`, the default), SGLang's scheduler loop
under `torch.no_grad()` unless SGLANG_ENABLE_TORCH_INFERENCE_MODE is set (`no_grad`); `grad` is
neither. Inference mode skips autograd's dispatch, which is most of what torch.empty_like costs.

One rank (a gloo group of one on one GPU): the kernels' barriers then wait for nobody, so the
figures are the launch path alone, free of the time slicing between processes
that several ranks on one GPU add (see op_proof.py). The kernels are checked against the
profile's record as in an engine; the buffers are sized for 1 MiB.

Run:  python -m torch.distributed.run --standalone --nproc-per-node 1 benches/op_overhead.py \
          --profile profile.json --out overhead.json
"""

import argparse
import json
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

KERNELS = ["one_stage_pull", "one_stage_push", "two_stage_pull", "two_stage_push"]


def per_call(fn, calls, samples):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(samples):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop) * 1000.0 / calls)
    return statistics.median(out)


def host_per_call(fn, calls, samples):
    """Wall-clock us per call of ``fn``, which makes ``calls`` calls (no GPU work)."""
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6 / calls)
    return statistics.median(out)


#: (row key, what is timed): the native call and the Python form, with and without ``out``.
EAGER = [("eager_op", "op.all_reduce(x, out=y)"),
         ("eager_op_alloc", "op.all_reduce(x)"),
         ("eager_py", "Allreduce.all_reduce(op, x, out=y)"),
         ("eager_py_alloc", "Allreduce.all_reduce(op, x)")]


def target(rows, limit):
    """The issue's line, computed: every row's eager call at most ``limit`` us over the raw
    launch (with ``out``), and the same question where the op allocates the output."""
    def worst(key):
        return max((r[key] for r in rows), default=None)
    return {"limit_us": limit,
            "line": f"eager op.all_reduce(x, out=y) <= raw launch + {limit} us, every row",
            "worst_overhead_us": worst("overhead_eager_us"),
            "met": bool(rows) and all(r["overhead_eager_us"] <= limit for r in rows),
            "worst_overhead_alloc_us": worst("overhead_eager_alloc_us"),
            "met_with_alloc": bool(rows) and all(r["overhead_eager_alloc_us"] <= limit
                                                 for r in rows),
            "native_path": bool(rows) and all(r["native_path"] for r in rows)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--samples", type=int, default=21)
    ap.add_argument("--limit", type=float, default=2.0,
                    help="the target: us an eager call may add over the raw launch")
    ap.add_argument("--register", action="store_true",
                    help="graph mode zero copy: register each captured graph's inputs")
    ap.add_argument("--grad-mode", choices=sorted(GRAD_MODES), default="inference",
                    help="torch's mode the calls run in: vLLM's (inference) or SGLang's default "
                         "(no_grad)")
    args = ap.parse_args()
    with GRAD_MODES[args.grad_mode]():
        return measure(args)


#: The engines' modes: vLLM's model runner, SGLang's scheduler loop by default, and neither.
GRAD_MODES = {"inference": torch.inference_mode, "no_grad": torch.no_grad,
              "grad": torch.enable_grad}


def measure(args):
    die_with_parent()
    dist.init_process_group("gloo")
    torch.cuda.set_device(0)
    from artune import allreduce

    rows = []
    refused = {}
    for backend in KERNELS:
        op = allreduce.Allreduce.create(dist.group.WORLD, args.profile, force=backend,
                                        max_bytes=1 << 20, register_graphs=args.register)
        if op is None:
            refused[backend] = "refused (see the log)"
            continue
        dtype = op._dtype
        for nbytes in (4 << 10, 64 << 10, 1 << 20):
            x = torch.ones(nbytes // torch.tensor([], dtype=dtype).element_size(),
                           dtype=dtype, device="cuda")
            y = torch.empty_like(x)
            calls = args.calls

            def op_calls():
                for _ in range(calls):
                    op.all_reduce(x, out=y, backend=backend)

            def op_alloc():
                for _ in range(calls):
                    op.all_reduce(x, backend=backend)

            def py_calls():
                for _ in range(calls):
                    allreduce.Allreduce.all_reduce(op, x, out=y, backend=backend)

            def py_alloc():
                for _ in range(calls):
                    allreduce.Allreduce.all_reduce(op, x, backend=backend)

            def raw():
                op.bench(x, y, backend, calls)

            def alloc():
                for _ in range(calls):
                    torch.empty_like(x)

            row = {"backend": backend, "bytes": nbytes, "native_path": op._path.native}
            for name, fn in (("eager_op", op_calls), ("eager_op_alloc", op_alloc),
                             ("eager_py", py_calls), ("eager_py_alloc", py_alloc),
                             ("eager_raw", raw)):
                fn()
                torch.cuda.synchronize()
                row[name] = per_call(fn, calls, args.samples)
            row["alloc_us"] = host_per_call(alloc, calls, args.samples)
            torch.cuda.synchronize()
            y.zero_()
            last = op.all_reduce(x, backend=backend)
            op.all_reduce(x, out=y, backend=backend)
            torch.cuda.synchronize()
            # One rank: the sum is the input, in the given output and in one the op allocated.
            row["correct_eager"] = bool(torch.equal(y, x) and torch.equal(last, x))
            for name, body in (("graph_op", op_calls), ("graph_raw", raw)):
                g = torch.cuda.CUDAGraph()
                before = op.graph_calls()
                with torch.cuda.graph(g):
                    body()
                row[f"{name}_registered_calls"] = op.graph_calls()[1] - before[1]
                if args.register:
                    op.register_graph_buffers()
                g.replay()
                torch.cuda.synchronize()
                row[name] = per_call(g.replay, calls, args.samples)
                del g
            torch.cuda.synchronize()
            row["correct"] = bool(torch.equal(y, x)) and row["correct_eager"]
            for key, _ in EAGER:
                over = "overhead_" + key.replace("_op", "")
                row[f"{over}_us"] = row[key] - row["eager_raw"]
            row["overhead_graph_us"] = row["graph_op"] - row["graph_raw"]
            rows.append(row)
            print(f"{backend:15} {nbytes:>8} B  raw {row['eager_raw']:6.2f}  eager op "
                  f"{row['eager_op']:6.2f} (+{row['overhead_eager_us']:5.2f}) no out "
                  f"(+{row['overhead_eager_alloc_us']:5.2f}) | python "
                  f"(+{row['overhead_eager_py_us']:5.2f}) no out "
                  f"(+{row['overhead_eager_py_alloc_us']:5.2f}) | empty_like "
                  f"{row['alloc_us']:5.2f}  graph op {row['graph_op']:6.2f} raw "
                  f"{row['graph_raw']:6.2f} (+{row['overhead_graph_us']:5.2f}) us/call  "
                  f"native {row['native_path']} correct {row['correct']}", flush=True)
        op.close()
    line = target(rows, args.limit)
    print(f"grad mode {args.grad_mode}; "
          f"target: {line['line']}: met {line['met']} (worst +{line['worst_overhead_us']} us); "
          f"without out: met {line['met_with_alloc']} "
          f"(worst +{line['worst_overhead_alloc_us']} us); native path {line['native_path']}",
          flush=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "refused": refused, "target": line,
                   "timed": dict(EAGER), "calls": args.calls,
                   "register": args.register, "grad_mode": args.grad_mode,
                   "samples": args.samples, "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(0)}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
