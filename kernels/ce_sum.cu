// The sum of the copy-engine backends (src/fabric/cuda/copy/): copy engines landed each peer's
// share in this rank's slots, and this kernel adds `count` buffers element by element into
// `out`, through fp32, rounding once, as the SM kernels do. It has no barrier: stream memory
// operations on IPC-mapped flags order the ranks around it, so no SM ever spins.
//
// The same kernel with no inputs is the guard every call ends with: where the rank's status is
// set (the op's watchdog released a call stuck on a peer that never arrived, and marked every
// rank of the group first), it overwrites the call's output with NaN and sets the host's fault
// word, as fail_safe does for the SM kernels. A released call passes its waits with stale
// peers' shards, so only its end can say the output is wrong; the status is sticky, so every
// later call is NaN too.
#include "common.cuh"

// Mirrors `CeSumArgs` in src/fabric/cuda/layout.rs.
struct CeSumArgs {
  u64 in[MAX_RANKS];
  u64 out;
  u64 n;
  int count;
  int pad;
  u64 status;  // the guard's: the rank's Signal::status word
  u64 fault;   // the guard's: the host's fault word (0: none)
};

template <typename T>
__device__ void ce_sum(const CeSumArgs& a) {
  if (a.count == 0) {
    // One block: the poison (a fault only) writes the whole output.
    const bool failed = __syncthreads_or(ld_volatile((const u32*)a.status) != 0);
    if (failed) poison<T>((char*)a.out, a.n, a.fault);
    return;
  }
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  // Shards start anywhere in the shared input: 16-byte vectors only where every buffer allows.
  char* out = (char*)a.out;
  bool aligned = (a.out & 15) == 0;
  for (int k = 0; k < a.count; k++) aligned = aligned && (a.in[k] & 15) == 0;
  u64 head = 0;
  if (aligned) {
    const u64 nvec = a.n / T::P;
    for (u64 v = first; v < nvec; v += stride) {
      float acc[T::P] = {};
      for (int k = 0; k < a.count; k++) add_vec<T>(acc, ld_v4((const char*)a.in[k] + v * 16));
      st_v4(out + v * 16, pack_vec<T>(acc));
    }
    head = nvec * T::P;
  }
  for (u64 i = head + first; i < a.n; i += stride) {
    float acc = 0.0f;
    for (int k = 0; k < a.count; k++) acc += T::load1((const char*)a.in[k], i);
    T::store1(out, i, acc);
  }
}

#define CE_SUM_KERNELS(T, suffix)                                                                  \
  extern "C" __global__ void __launch_bounds__(THREADS) ce_sum_##suffix(const CeSumArgs a) {      \
    ce_sum<T>(a);                                                                                  \
  }

CE_SUM_KERNELS(Bf16, bf16)
CE_SUM_KERNELS(Fp16, fp16)
CE_SUM_KERNELS(Fp32, fp32)
