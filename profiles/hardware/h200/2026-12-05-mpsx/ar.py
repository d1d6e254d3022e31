# NCCL K ranks on one GPU: eager and graph allreduce per size (exploration, not evidence).
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
r, k = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(0)
out = []
for n in [4096, 65536, 1 << 20, 16 << 20]:
    x = torch.ones(n // 2, dtype=torch.bfloat16, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize(); dist.barrier()
    it = 30
    t = time.perf_counter()
    for _ in range(it):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    e = (time.perf_counter() - t) / it * 1e6
    g_us = float("nan")
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                for _ in range(10):
                    dist.all_reduce(x)
        torch.cuda.synchronize(); dist.barrier()
        g.replay(); torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        g_us = (time.perf_counter() - t) / 50 * 1e6
    except Exception as ex:
        print(f"rank {r} graph failed: {ex}", file=sys.stderr)
    y = torch.full((n // 2,), float(r + 1), dtype=torch.float32, device="cuda")
    dist.all_reduce(y); ok = bool((y == k * (k + 1) / 2).all())
    out.append(f"K={k} bytes={n} eager_us={e:.1f} graph_us={g_us:.1f} sum_ok={ok}")
if r == 0:
    print("\n".join(out), flush=True)
dist.destroy_process_group()
