// Custom allreduce kernels: one-stage and two-stage, pull and push, for bf16, fp16 and fp32.
//
// Every rank launches the same grid. Block b of one rank only ever waits for block b of the
// others, and every kernel maps elements to blocks the same way on every rank, so per-block
// barriers are enough. In loopback several ranks share one launch (rank = rank_base +
// blockIdx.y); the host keeps the whole grid co-resident.
//
// Vectors are 16 bytes; the elements after the last whole vector (the tail) are handled one
// by one by block 0. Sums run in fp32 over ranks 0, 1, ..., n-1 in that order on every rank,
// so every rank writes the same bits.
#include "common.cuh"

// Announce `flag` to every rank for this block and phase, then wait until each has announced
// it to us. PUBLISH (release/acquire) when peers will read data this block wrote in this
// kernel, or we will read data peers wrote; relaxed when the barrier only says "ready" or
// "done reading" (data written before the kernel started is already visible), as production
// custom allreduce kernels do, saving a system-scope fence per barrier.
template <bool PUBLISH>
__device__ __forceinline__ void barrier(const ArArgs& a, int rank, u32 flag, int phase) {
  __syncthreads();
  if ((int)threadIdx.x < a.nranks) {
    Signal* peer = (Signal*)a.sig[threadIdx.x];
    Signal* self = (Signal*)a.sig[rank];
    if (PUBLISH) {
      st_release(&peer->flags[phase][blockIdx.x][rank], flag);
    } else {
      st_relaxed(&peer->flags[phase][blockIdx.x][rank], flag);
    }
    wait_for<PUBLISH>(&self->flags[phase][blockIdx.x][threadIdx.x], flag, &self->status);
  }
  __syncthreads();
}

// acc[0..P) = sum over ranks p = 0 .. n-1, in order, of the vector at src(p); loads are issued
// eight ranks at a time so few registers stay live.
template <typename T, typename Src>
__device__ __forceinline__ void reduce_vec(float* acc, int n, Src src) {
#pragma unroll
  for (int i = 0; i < T::P; i++) acc[i] = 0.f;
#pragma unroll
  for (int g = 0; g < MAX_RANKS; g += 8) {
    if (g < n) {
      V4 x[8];
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (g + j < n) x[j] = ld_v4(src(g + j));
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (g + j < n) add_vec<T>(acc, x[j]);
    }
  }
}

// Receive slot on rank `owner` that rank `src` writes into (owner keeps no slot for itself).
__device__ __forceinline__ char* slot(const ArArgs& a, int owner, int src) {
  const int idx = src < owner ? src : src - 1;
  return (char*)a.scratch[owner] + (u64)idx * a.slot_bytes;
}

// Vectors in shard s when nvec vectors are cut into shards of sv.
__device__ __forceinline__ u64 shard_len(u64 nvec, u64 sv, int s) {
  const u64 start = (u64)s * sv;
  if (start >= nvec) return 0;
  const u64 left = nvec - start;
  return left < sv ? left : sv;
}

template <typename T>
__device__ __forceinline__ void copy1(char* dst, const char* src, u64 i) {
  if constexpr (T::SIZE == 2) {
    st_u16(dst + i * 2, ld_u16(src + i * 2));
  } else {
    st_u32(dst + i * 4, ld_u32(src + i * 4));
  }
}

#define RANK_SETUP                                      \
  const int rank = a.rank_base + (int)blockIdx.y;       \
  const int n = a.nranks;                               \
  Signal* self = (Signal*)a.sig[rank];                  \
  const u32 flag = self->epoch[blockIdx.x] + 1;         \
  const u64 nvec = a.n / T::P;                          \
  const u64 stride = (u64)gridDim.x * blockDim.x;       \
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;

#define FINISH \
  if (threadIdx.x == 0) self->epoch[blockIdx.x] = flag;

// Read every rank's input, reduce, write the local output.
template <typename T>
__device__ void one_stage_pull(const ArArgs& a) {
  RANK_SETUP
  char* out = (char*)a.out[rank];
  barrier<false>(a, rank, flag, 0);
  for (u64 v = first; v < nvec; v += stride) {
    float acc[T::P];
    reduce_vec<T>(acc, n, [&](int p) { return (const char*)a.in[p] + v * 16; });
    st_v4(out + v * 16, pack_vec<T>(acc));
  }
  if (blockIdx.x == 0) {
    for (u64 e = nvec * T::P + threadIdx.x; e < a.n; e += blockDim.x) {
      float s = 0.f;
      for (int p = 0; p < n; p++) s += T::load1((const char*)a.in[p], e);
      T::store1(out, e, s);
    }
  }
  // Peers must finish reading our input before our stream may change it.
  barrier<false>(a, rank, flag, 2);
  FINISH
}

// Write the local input into every peer's receive slot, then reduce what arrived.
template <typename T>
__device__ void one_stage_push(const ArArgs& a) {
  RANK_SETUP
  const char* in = (const char*)a.in[rank];
  char* out = (char*)a.out[rank];
  // Every peer has finished the previous call, so its slots are free.
  barrier<false>(a, rank, flag, 0);
  for (u64 v = first; v < nvec; v += stride) {
    const V4 x = ld_v4(in + v * 16);
#pragma unroll
    for (int p = 0; p < MAX_RANKS; p++)
      if (p < n && p != rank) st_v4(slot(a, p, rank) + v * 16, x);
  }
  if (blockIdx.x == 0) {
    for (u64 e = nvec * T::P + threadIdx.x; e < a.n; e += blockDim.x)
      for (int p = 0; p < n; p++)
        if (p != rank) copy1<T>(slot(a, p, rank), in, e);
  }
  barrier<true>(a, rank, flag, 1);
  for (u64 v = first; v < nvec; v += stride) {
    float acc[T::P];
    reduce_vec<T>(acc, n, [&](int p) { return (p == rank ? in : slot(a, rank, p)) + v * 16; });
    st_v4(out + v * 16, pack_vec<T>(acc));
  }
  if (blockIdx.x == 0) {
    for (u64 e = nvec * T::P + threadIdx.x; e < a.n; e += blockDim.x) {
      float s = 0.f;
      for (int p = 0; p < n; p++) s += T::load1(p == rank ? in : slot(a, rank, p), e);
      T::store1(out, e, s);
    }
  }
  FINISH
}

// Reduce-scatter by reading peers' shards of this rank, then all-gather by reading peers'
// reduced shards. The tail belongs to the last rank's shard.
template <typename T>
__device__ void two_stage_pull(const ArArgs& a) {
  RANK_SETUP
  const u64 sv = (nvec + n - 1) / n;
  const u64 mine = shard_len(nvec, sv, rank);
  const u64 tail = a.n - nvec * T::P;
  char* red = (char*)a.scratch[rank];
  char* out = (char*)a.out[rank];
  barrier<false>(a, rank, flag, 0);
  for (u64 i = first; i < mine; i += stride) {
    const u64 off = ((u64)rank * sv + i) * 16;
    float acc[T::P];
    reduce_vec<T>(acc, n, [&](int p) { return (const char*)a.in[p] + off; });
    st_v4(red + i * 16, pack_vec<T>(acc));
  }
  if (blockIdx.x == 0 && rank == n - 1) {
    for (u64 j = threadIdx.x; j < tail; j += blockDim.x) {
      float s = 0.f;
      for (int p = 0; p < n; p++) s += T::load1((const char*)a.in[p], nvec * T::P + j);
      T::store1(red + mine * 16, j, s);
    }
  }
  barrier<true>(a, rank, flag, 1);
  // Vector i of shard p is vector p * sv + i of the message; groups of 4 peers bound the
  // registers held.
  for (u64 i = first; i < sv; i += stride) {
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 4) {
      V4 x[4];
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (g + j < n && (u64)(g + j) * sv + i < nvec) x[j] = ld_v4((const char*)a.scratch[g + j] + i * 16);
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (g + j < n && (u64)(g + j) * sv + i < nvec) st_v4(out + ((u64)(g + j) * sv + i) * 16, x[j]);
    }
  }
  if (blockIdx.x == 0) {
    const char* last = (const char*)a.scratch[n - 1] + shard_len(nvec, sv, n - 1) * 16;
    for (u64 j = threadIdx.x; j < tail; j += blockDim.x) copy1<T>(out + nvec * 16, last, j);
  }
  // Peers must finish reading our input and reduced shard before they change.
  barrier<false>(a, rank, flag, 2);
  FINISH
}

// Reduce-scatter by writing each shard to its owner's receive slot, then all-gather by
// writing the reduced shard into every rank's output.
template <typename T>
__device__ void two_stage_push(const ArArgs& a) {
  RANK_SETUP
  const u64 sv = (nvec + n - 1) / n;
  const u64 mine = shard_len(nvec, sv, rank);
  const u64 tail = a.n - nvec * T::P;
  const char* in = (const char*)a.in[rank];
  barrier<false>(a, rank, flag, 0);
  for (u64 i = first; i < sv; i += stride) {
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 4) {
      V4 x[4];
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (g + j < n && g + j != rank && (u64)(g + j) * sv + i < nvec) x[j] = ld_v4(in + ((u64)(g + j) * sv + i) * 16);
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (g + j < n && g + j != rank && (u64)(g + j) * sv + i < nvec) st_v4(slot(a, g + j, rank) + i * 16, x[j]);
    }
  }
  if (blockIdx.x == 0 && rank != n - 1) {
    char* dst = slot(a, n - 1, rank) + shard_len(nvec, sv, n - 1) * 16;
    for (u64 j = threadIdx.x; j < tail; j += blockDim.x) copy1<T>(dst, in + nvec * 16, j);
  }
  barrier<true>(a, rank, flag, 1);
  for (u64 i = first; i < mine; i += stride) {
    float acc[T::P];
    reduce_vec<T>(acc, n, [&](int p) { return p == rank ? in + ((u64)rank * sv + i) * 16 : slot(a, rank, p) + i * 16; });
    const V4 r = pack_vec<T>(acc);
#pragma unroll
    for (int p = 0; p < MAX_RANKS; p++)
      if (p < n) st_v4((char*)a.out[p] + ((u64)rank * sv + i) * 16, r);
  }
  if (blockIdx.x == 0 && rank == n - 1) {
    for (u64 j = threadIdx.x; j < tail; j += blockDim.x) {
      float s = 0.f;
      for (int p = 0; p < n; p++)
        s += p == rank ? T::load1(in + nvec * 16, j) : T::load1(slot(a, rank, p) + mine * 16, j);
      for (int p = 0; p < n; p++) T::store1((char*)a.out[p] + nvec * 16, j, s);
    }
  }
  // Every shard has landed in our output once all peers pass this point.
  barrier<true>(a, rank, flag, 2);
  FINISH
}

#define AR_KERNELS(T, suffix)                                                                        \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) one_stage_pull_##suffix(const ArArgs a) {   \
    one_stage_pull<T>(a);                                                                            \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) one_stage_push_##suffix(const ArArgs a) {   \
    one_stage_push<T>(a);                                                                            \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) two_stage_pull_##suffix(const ArArgs a) {   \
    two_stage_pull<T>(a);                                                                            \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) two_stage_push_##suffix(const ArArgs a) {   \
    two_stage_push<T>(a);                                                                            \
  }

AR_KERNELS(Bf16, bf16)
AR_KERNELS(Fp16, fp16)
AR_KERNELS(Fp32, fp32)
