// Contention probes: every rank reads from (or writes to) `peers` peers at once, as nvbandwidth
// does. Each stream first runs latch_wait, which spins on a host-mapped word until the host
// has queued every stream and releases them together.
#include "common.cuh"

struct ProbeArgs {
  u64 src[MAX_RANKS];  // each rank's source buffer
  u64 dst[MAX_RANKS];  // each rank's receive area: one `bytes` slot per distance 1..peers
  u64 bytes;           // moved per peer, a multiple of 16
  u64 sink;            // written only if the loaded data hashes to a magic value
  int nranks;
  int rank;
  int peers;
  int pad;
};

extern "C" __global__ void latch_wait(const u32* latch, u32 go, u32* status) {
  if (threadIdx.x != 0) return;
  const u64 start = now_ns();
  while (ld_volatile(latch) != go) {
    if (now_ns() - start > 2 * BARRIER_TIMEOUT_NS) {
      atomicExch(status, 2u);
      return;
    }
  }
}

// Rank r reads bytes from each of ranks r+1 .. r+peers.
extern "C" __global__ void __launch_bounds__(THREADS) probe_read(const ProbeArgs a) {
  const u64 nvec = a.bytes / 16;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  u32 h = 0;
  for (u64 v = (u64)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    V4 x[MAX_RANKS];
#pragma unroll
    for (int d = 1; d < MAX_RANKS; d++)
      if (d <= a.peers) x[d] = ld_v4((const char*)a.src[(a.rank + d) % a.nranks] + v * 16);
#pragma unroll
    for (int d = 1; d < MAX_RANKS; d++)
      if (d <= a.peers) h ^= x[d].a ^ x[d].b ^ x[d].c ^ x[d].d;
  }
  if (h == 0x9e3779b9u) *(u32*)a.sink = h;
}

// Rank r writes its source into slot d-1 of each rank r+d, d = 1 .. peers.
extern "C" __global__ void __launch_bounds__(THREADS) probe_write(const ProbeArgs a) {
  const u64 nvec = a.bytes / 16;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const char* src = (const char*)a.src[a.rank];
  for (u64 v = (u64)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    const V4 x = ld_v4(src + v * 16);
#pragma unroll
    for (int d = 1; d < MAX_RANKS; d++)
      if (d <= a.peers)
        st_v4((char*)a.dst[(a.rank + d) % a.nranks] + (u64)(d - 1) * a.bytes + v * 16, x);
  }
}

// The fault knob's kernel that never completes (ARTUNE_CUDA_FAULTS=hang=BACKEND): it spins on
// a word nothing writes, as a peer that never arrives would leave a kernel without a timeout.
extern "C" __global__ void spin_forever(const u32* flag) {
  while (ld_volatile(flag) == 0) {
  }
}
