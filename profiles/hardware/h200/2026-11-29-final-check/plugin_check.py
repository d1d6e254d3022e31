# Loads artune as NCCL's tuner plugin in a real torch.distributed NCCL communicator (one GPU,
# world size 1) and runs allreduces, so NCCL_DEBUG=INFO shows the plugin loading and logging.
import os
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29511")
import torch
import torch.distributed as dist

dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
for n in (1 << 10, 1 << 20, 1 << 26):
    x = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"allreduce of {2 * n} bytes ok: {x[0].item()}")
print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())
dist.destroy_process_group()
