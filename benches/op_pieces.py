#!/usr/bin/env python3
"""Where the op's eager call spends its host time (issue 42: benches/op_overhead.py finds it up
to 4.6 us over the raw launch on some hosts, h100/2026-12-05-trace and h200/2026-12-05-op15 under
profiles/hardware/, and within 1.6 us on another, h200/2026-12-05-eager): each piece of what EagerPath.all_reduce
does, timed alone on this host (wall clock per call, median of --samples samples of --calls
calls), beside the whole call and the raw launch. One rank (a gloo group of one), one GPU.

The calls that launch queue at most --calls kernels per sample and synchronize between
samples, so the wall clock is the host's, not the GPU's, while the host is faster than the
kernels (the raw launch's `gpu_us` is the GPU's time per call, for comparison).

Run:  python -m torch.distributed.run --standalone --nproc-per-node 1 benches/op_pieces.py \
          --profile profile.json --out pieces.json
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

# GPU time per call by CUDA events, as op_overhead.py times it (this script's folder is on
# the path when run as a script).
from op_overhead import per_call as gpu


def wall(fn, calls, samples, sync=False):
    out = []
    for _ in range(samples):
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6 / calls)
    if sync:
        torch.cuda.synchronize()
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--samples", type=int, default=51)
    ap.add_argument("--backend", default="one_stage_push")
    ap.add_argument("--bytes", type=int, default=4096)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.cuda.set_device(0)
    from artune import allreduce
    with torch.inference_mode():
        op = allreduce.Allreduce.create(dist.group.WORLD, args.profile, force=args.backend,
                                        max_bytes=1 << 20)
        assert op is not None, "the op was refused (see the log)"
        x = torch.ones(args.bytes // 2, dtype=op._dtype, device="cuda")
        y = torch.empty_like(x)
        n, be = args.calls, args.backend
        native, path = op._native, op._path
        code = native.route(args.bytes, False)
        xp, yp, nb = x.data_ptr(), y.data_ptr(), x.nbytes
        raw_stream = torch._C._cuda_getCurrentRawStream
        capt = torch._C._cuda_isCurrentStreamCapturing
        ordinal = torch.cuda.current_device()
        s = raw_stream(ordinal)
        dev = x.device

        def loop(body):
            def f():
                for _ in range(n):
                    body()
            return f

        host = {
            "empty loop": loop(lambda: None),
            "x.nbytes": loop(lambda: x.nbytes),
            "x.data_ptr()": loop(lambda: x.data_ptr()),
            "x.dtype": loop(lambda: x.dtype),
            "x.is_contiguous()": loop(lambda: x.is_contiguous()),
            "x.device": loop(lambda: x.device),
            "y.device == x.device": loop(lambda: y.device == x.device),
            "x.get_device()": loop(lambda: x.get_device()),
            "raw stream getter": loop(lambda: raw_stream(ordinal)),
            "is capturing": loop(lambda: capt()),
            "native.route (a pyo3 call)": loop(lambda: native.route(nb, False)),
            "op.should_run(x)": loop(lambda: op.should_run(x)),
            "torch.empty_like(x)": loop(lambda: torch.empty_like(x)),
        }
        launching = {
            "native.launch (pyo3 call + launch)": loop(lambda: native.launch(code, xp, yp, nb, s)),
            "op.all_reduce(x, out=y)": loop(lambda: op.all_reduce(x, out=y)),
            "op.all_reduce(x, out=y, backend=)": loop(lambda: op.all_reduce(x, out=y, backend=be)),
            "op.all_reduce(x)": loop(lambda: op.all_reduce(x)),
        }
        raw_many = lambda: native.launch(code, xp, yp, nb, s, n)  # noqa: E731
        rows = {}
        for _ in range(2):  # warm, then the figures kept
            for k, f in host.items():
                rows[k] = wall(f, n, args.samples)
            for k, f in launching.items():
                rows[k] = wall(f, n, args.samples, sync=True)
            rows["raw launch, one native call of n launches"] = wall(raw_many, n, args.samples,
                                                                     sync=True)
        g = {"raw launch gpu_us": gpu(raw_many, n, args.samples),
             "op.all_reduce(x, out=y) gpu_us": gpu(launching["op.all_reduce(x, out=y)"], n,
                                                   args.samples)}
        torch.cuda.synchronize()
        op.all_reduce(x, out=y)
        torch.cuda.synchronize()
        correct = bool(torch.equal(x, y))
        for k, v in {**rows, **g}.items():
            print(f"{k:45} {v:7.3f} us", flush=True)
        print(f"correct {correct}")
        with open(args.out, "w") as f:
            json.dump({"host_us": rows, "gpu_us": g, "correct": correct, "backend": be,
                       "bytes": args.bytes, "calls": n, "samples": args.samples,
                       "torch": torch.__version__, "python": sys.version,
                       "device": torch.cuda.get_device_name(0)}, f, indent=1)
        op.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
