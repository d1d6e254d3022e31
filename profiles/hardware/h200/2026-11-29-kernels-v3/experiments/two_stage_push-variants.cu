// The two_stage_push variants measured on 2026-11-29 (NOTES.md, runs 2 and 3), as they were
// built: this function replaced two_stage_push in kernels/allreduce.cu and each binary was
// built with one value of VARIANT. 0 is the committed kernel, rewritten with the names the
// variants share. None of 1-4 was kept: all were slower.
#define RS_GROUP 8
#ifndef VARIANT
#define VARIANT 0
#endif
template <typename T>
__device__ void two_stage_push(const ArArgs& a) {
  RANK_SETUP
  const u64 sv = (nvec + n - 1) / n;
  const u64 mine = shard_len(nvec, sv, rank);
  const u64 tail = a.n - nvec * T::P;
  const char* in = (const char*)a.in[rank];
  const u64 once = evict_first_policy();
#if VARIANT == 1
  // E: each block owns one contiguous range of every shard.
  const u64 lo = sv * blockIdx.x / gridDim.x, hi = sv * (blockIdx.x + 1) / gridDim.x;
  const u64 f0 = lo + threadIdx.x, st = blockDim.x;
#else
  const u64 f0 = first, st = stride, hi = sv;
#endif
#if VARIANT >= 2
#if VARIANT == 4
#define UNR 8
#else
#define UNR 4
#endif
  // J: one shard at a time (one read and one write stream per block), UNR vectors in flight.
  for (int t = 0; t < n - 1; t++) {
#if VARIANT == 2
    const int j = (rank + 1 + (t + (int)blockIdx.x) % (n - 1)) % n;  // blocks spread over shards
#else
    const int j = (rank + 1 + t) % n;  // J': all blocks of a rank on the same shard
#endif
    const u64 len = shard_len(nvec, sv, j);
    const char* src = in + (u64)j * sv * 16;
    char* dst = slot(a, j, rank);
    for (u64 i = f0; i < len; i += UNR * st) {
      V4 x[UNR];
#pragma unroll
      for (int k = 0; k < UNR; k++)
        if (i + k * st < len) x[k] = ld_v4_once(src + (i + k * st) * 16, once);
#pragma unroll
      for (int k = 0; k < UNR; k++)
        if (i + k * st < len) st_v4(dst + (i + k * st) * 16, x[k]);
    }
  }
#else
  for (u64 i = f0; i < hi; i += st) {
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += RS_GROUP) {
      V4 x[RS_GROUP];
#pragma unroll
      for (int j = 0; j < RS_GROUP; j++)
        if (g + j < n && g + j != rank && (u64)(g + j) * sv + i < nvec)
          x[j] = ld_v4_once(in + ((u64)(g + j) * sv + i) * 16, once);
#pragma unroll
      for (int j = 0; j < RS_GROUP; j++)
        if (g + j < n && g + j != rank && (u64)(g + j) * sv + i < nvec) st_v4(slot(a, g + j, rank) + i * 16, x[j]);
    }
  }
#endif
  if (blockIdx.x == 0 && rank != n - 1) {
    char* dst = slot(a, n - 1, rank) + shard_len(nvec, sv, n - 1) * 16;
    for (u64 j = threadIdx.x; j < tail; j += blockDim.x) copy1<T>(dst, in + nvec * 16, j);
  }
  barrier<true>(a, rank, flag, 1);
  const u64 end = hi < mine ? hi : mine;
  for (u64 m = f0 < end ? (end - 1 - f0) / st + 1 : 0; m-- > 0;) {
    const u64 i = f0 + m * st;
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
  barrier<true>(a, rank, flag, 2);
  FINISH
}
