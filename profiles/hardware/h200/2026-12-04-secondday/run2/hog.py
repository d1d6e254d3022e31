import time, torch
x = torch.empty(120 * 2**30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 4:
    a @ a
torch.cuda.synchronize()
print(f"hog exits at {time.time():.3f}", flush=True)
