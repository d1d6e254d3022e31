// Test data and its check, on the GPU: a 256 MiB message over 8 ranks is made and checked in
// milliseconds here, where the host would spend seconds. Element i of rank r's input is k/8,
// k in +-1..8, drawn from a counter-based hash of (seed, r, i); src/fabric/cuda/data.rs draws
// the same values on the host (a GPU test holds the two together). Every sum over up to 16
// ranks is exact in bf16, fp16 and fp32, so outputs are compared bit for bit.
#include "common.cuh"

#define GOLDEN 0x9e3779b97f4a7c15ull

__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ u64 rank_key(u64 seed, u32 rank) { return mix64(seed ^ ((u64)(rank + 1) * GOLDEN)); }

__device__ __forceinline__ float test_value(u64 key, u64 i) {
  const u64 x = mix64(key + (i + 1) * GOLDEN);
  const float k = (float)((u32)(x & 7) + 1) * 0.125f;
  return (x & 8) ? k : -k;
}

// D: 0 bf16, 1 fp16, 2 fp32 (the host's Dtype order).
template <int D>
__device__ __forceinline__ u32 encode(float v) {
  if (D == 0) return f32_to_bf16(v);
  if (D == 1) return (u32)f32_to_f16(v);
  return __float_as_uint(v);
}

template <int D>
__device__ __forceinline__ u32 raw_at(const char* p, u64 i) {
  if (D == 2) return ld_u32(p + i * 4);
  return (u32)ld_u16(p + i * 2);
}

template <int D>
__device__ __forceinline__ void store_at(char* p, u64 i, u32 bits) {
  if (D == 2)
    st_u32(p + i * 4, bits);
  else
    st_u16(p + i * 2, (u16)bits);
}

template <int D>
__device__ void fill(char* out, u64 n, u64 seed, u32 rank) {
  const u64 key = rank_key(seed, rank);
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    store_at<D>(out, i, encode<D>(test_value(key, i)));
}

// result[0]: elements that differ from the sum over ranks 0..world-1, rounded once to the
// dtype; result[1]: the first of them (~0 if none); result[2]: guard bytes in
// [data_bytes, guard_end) that are no longer 0xff (the kernel wrote past the output).
template <int D>
__device__ void check(const char* out, u64 n, u64 seed, u32 world, u64 data_bytes, u64 guard_end,
                      u64* result) {
  u64 keys[MAX_RANKS];
#pragma unroll
  for (int r = 0; r < MAX_RANKS; r++) keys[r] = r < (int)world ? rank_key(seed, r) : 0;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 first_i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u64 wrong = 0, first = ~0ull;
  for (u64 i = first_i; i < n; i += stride) {
    float want = 0.0f;
#pragma unroll
    for (int r = 0; r < MAX_RANKS; r++)
      if (r < (int)world) want += test_value(keys[r], i);
    if (raw_at<D>(out, i) != encode<D>(want)) {
      wrong++;
      if (first == ~0ull) first = i;
    }
  }
  u64 spoiled = 0;
  for (u64 b = data_bytes + first_i; b < guard_end; b += stride)
    if (*(const unsigned char*)(out + b) != 0xff) spoiled++;
  if (wrong) {
    atomicAdd(&result[0], wrong);
    atomicMin(&result[1], first);
  }
  if (spoiled) atomicAdd(&result[2], spoiled);
}

extern "C" __global__ void fill_bf16(char* out, u64 n, u64 seed, u32 rank) { fill<0>(out, n, seed, rank); }
extern "C" __global__ void fill_fp16(char* out, u64 n, u64 seed, u32 rank) { fill<1>(out, n, seed, rank); }
extern "C" __global__ void fill_fp32(char* out, u64 n, u64 seed, u32 rank) { fill<2>(out, n, seed, rank); }

extern "C" __global__ void check_bf16(const char* out, u64 n, u64 seed, u32 world, u64 data_bytes,
                                      u64 guard_end, u64* result) {
  check<0>(out, n, seed, world, data_bytes, guard_end, result);
}
extern "C" __global__ void check_fp16(const char* out, u64 n, u64 seed, u32 world, u64 data_bytes,
                                      u64 guard_end, u64* result) {
  check<1>(out, n, seed, world, data_bytes, guard_end, result);
}
extern "C" __global__ void check_fp32(const char* out, u64 n, u64 seed, u32 world, u64 data_bytes,
                                      u64 guard_end, u64* result) {
  check<2>(out, n, seed, world, data_bytes, guard_end, result);
}
