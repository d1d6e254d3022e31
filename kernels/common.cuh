// Shared definitions for artune's kernels. Compiled at run time by NVRTC for the detected GPU;
// no CUDA headers are needed (half and bfloat16 conversions are written out below), so the
// sources compile with any NVRTC that supports the GPU's architecture.
#pragma once

// The constants the host shares with these sources (MAX_RANKS, MAX_BLOCKS, THREADS, LL_OFFSET,
// LL_LINE, LL_THREADS, LL1_THREADS, LL1_MAX_BYTES, LL2_MAX_BYTES) come from
// src/fabric/cuda/layout.rs as NVRTC -D options, so the two sides cannot disagree.
#if !defined(MAX_RANKS) || !defined(MAX_BLOCKS) || !defined(THREADS) || !defined(LL_OFFSET) || \
    !defined(LL_LINE) || !defined(LL_THREADS) || !defined(LL1_THREADS) || !defined(LL1_MAX_BYTES) || \
    !defined(LL2_MAX_BYTES)
#error "compile through artune (src/fabric/cuda/compile/), which defines the shared constants"
#endif
// A barrier that waits longer than this gives up, records the failure in Signal::status and
// lets the kernel finish, so a lost peer turns into an error on the host instead of a hang. The
// kernel then leaves the rank's output all NaN (fail_safe), never a sum that looks right.
#define BARRIER_TIMEOUT_NS 5000000000ull

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// 16 bytes: 8 bf16/fp16 or 4 fp32 values.
struct __align__(16) V4 {
  u32 a, b, c, d;
};

// Small messages take the LL path (after NCCL's low-latency protocol): every 8-byte word sent
// carries 4 bytes of data and a 4-byte flag, so a receiver knows the data arrived from the
// flag beside it and no system-scope fence or separate barrier is needed. Lines of 16 bytes
// (two such words, 8 data bytes) live in each rank's signal allocation from LL_OFFSET on.
// Threads per block of the LL kernels: one data word each, LL_THREADS (LL1_THREADS in one-stage
// push, which sends and polls a line per word from every peer). Small blocks spread a message
// over many multiprocessors: each thread's stores and polls go through its SM's port to L2, so
// a few large blocks would be limited by that port, not by latency
// (profiles/hardware/h200/NOTES-kernel-choices.md). LL1_MAX_BYTES and LL2_MAX_BYTES: the
// largest message per rank (bytes) each kernel sends through LL: one-stage push keeps a line
// per data word from every peer (2 x n x LL1 lines), two-stage push and pull only a shard.
#define LL1_LINES (LL1_MAX_BYTES / 8)
#define LL2_LINES (LL2_MAX_BYTES / 8)

// Per-rank signal area, zeroed once at allocation and never reset: every barrier uses the
// block's epoch + 1 as the value to wait for, so repeated calls and CUDA-graph replays work
// without host resets. flags[phase][block][src] is written by rank `src`. Calls that take the
// LL path count in ll_epoch instead, so each flag slot and each LL line only ever sees one
// sequence of values (the previous value is never the one awaited, even after wrapping).
struct Signal {
  u32 flags[3][MAX_BLOCKS][MAX_RANKS];
  u32 epoch[MAX_BLOCKS];
  u32 status;  // non-zero: a wait of this rank, or of a peer (raise_fault), gave up
  u32 ll_epoch[MAX_BLOCKS];
};

// Kernel argument block; the host mirrors this layout (src/fabric/cuda/layout.rs).
//
// A rank reads its own input from src and writes its own output to dst, the caller's tensors,
// which no peer maps. Where peers read a rank's input (pull) the kernel first stages it from src
// into the shared in[rank], each block the part that the peers' same block reads, published by
// the first barrier; where peers write a rank's output (push) the kernel copies it from the
// shared out[rank] to dst after the barrier that says it landed. So the copies are part of the
// kernel the tune times and an engine captures in a CUDA graph, and no peer's late write can
// reach the caller's tensor. With src == in[rank] (dst == out[rank]) nothing is copied.
struct ArArgs {
  u64 in[MAX_RANKS];       // where peers read each rank's input (pull kernels: a shared buffer)
  u64 out[MAX_RANKS];      // where peers write or read each rank's output (shared, where they do)
  u64 scratch[MAX_RANKS];  // receive slots (push) or reduced shard (two-stage pull)
  u64 sig[MAX_RANKS];      // each rank's Signal
  u64 src[MAX_RANKS];      // each rank's own input (the caller's tensor; read by that rank only)
  u64 dst[MAX_RANKS];      // each rank's own output (the caller's tensor; written by that rank only)
  u64 n;                   // elements to reduce
  u64 slot_bytes;          // distance between receive slots (push)
  u64 fault;               // a host word (mapped pinned memory) set to 1 once status is; 0: none
  int nranks;
  int rank_base;           // this launch's first rank; rank = rank_base + blockIdx.y
  int island;              // ranks per island (island kernels; nranks elsewhere)
  u32 dirs;                // island kernels: bit 0 push inside islands, bit 1 push across
  int order[MAX_RANKS];    // island kernels: the ranks island by island
  u64 reg;                 // registered form: this call's RegSlot (0: the staged form)
  u64 missed;              // registered form: a host word set to 1 when reg was not registered
  u32 reg_gen;             // registered form: the generation reg must hold
};

// The registered form (CUDA graphs, as engines' custom allreduce runs them): peers read each
// rank's own input (pull kernels) or write each rank's own output (two-stage push) where it
// lies, with no shared buffer and no staging between. A captured kernel's arguments are fixed
// at capture, before any peer's tensor is mapped, so the peers' addresses come from a slot of
// device memory the host fills once after capture (registration), with the generation the
// capture was given. A call whose slot holds another generation (a replay before
// registration, or after the host dropped the registrations) reads or writes no peer address:
// it keeps the group's barriers in step, leaves its output NaN, and says so in `missed`.
struct RegSlot {
  u64 peer[MAX_RANKS];  // each rank's registered tensor as this rank maps it (its own: `mine`)
  u32 gen;
  u32 pad;
};

// Loads this call's registered tensors into `ptrs` (threads < n), this rank's own being
// `mine` (ArArgs::src where peers read inputs, dst where they write outputs), and sets `ok`
// (thread 0) to whether the slot holds them; both are read after a __syncthreads.
__device__ __forceinline__ void reg_load(const ArArgs& a, int rank, u64 mine, u64* ptrs, u32* ok) {
  const RegSlot* s = (const RegSlot*)a.reg;
  if (threadIdx.x == 0) *ok = a.reg != 0 && s->gen == a.reg_gen;
  if ((int)threadIdx.x < a.nranks)
    ptrs[threadIdx.x] = (int)threadIdx.x == rank ? mine : (a.reg != 0 ? s->peer[threadIdx.x] : 0);
}

// Programmatic dependent launch (sm_90 and later; the host sets the launch attribute there,
// kernels.rs programmatic_launch). A grid may be scheduled while the previous kernel in its
// stream drains; pdl_wait, first in every allreduce kernel (but for reading a registered slot:
// reg_load_then_wait), holds it until that kernel has
// finished and its writes are visible, so every ordering argument that speaks of "kernel X-1
// has finished" still holds. pdl_trigger lets the next call's grid be scheduled. Without the
// launch attribute both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The flat kernels' start: the registered form (REG) loads its slot (reg_load; the rank's own
// tensor its input, or its output where `outputs`), then pdl_wait. Before it, so the slot's
// round trip overlaps the previous kernel's end: only the host writes slots (registration,
// between replays), never a kernel, so no write of the previous kernel can be missed there.
template <bool REG>
__device__ __forceinline__ void reg_load_then_wait(const ArArgs& a, bool outputs, u64* ptrs, u32* ok) {
  if constexpr (REG) {
    const int rank = a.rank_base + (int)blockIdx.y;
    reg_load(a, rank, outputs ? a.dst[rank] : a.src[rank], ptrs, ok);
  }
  pdl_wait();
}

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void st_release(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u32 ld_volatile(const volatile u32* p) {
  u32 v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_relaxed(u32* p, u32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_relaxed(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Spins until *p == want (acquire: later reads see what the writer published before its
// release), or until the timeout passes, which is recorded in *status. Once a barrier of this
// rank has timed out, later ones give up at their first timer check. True when it gave up:
// the caller then tells the group (raise_fault) before it touches a peer's memory again.
template <bool ACQUIRE>
__device__ __forceinline__ bool wait_for(const u32* p, u32 want, u32* status) {
  u64 start = 0;
  u32 spins = 0;
  while ((ACQUIRE ? ld_acquire(p) : ld_relaxed(p)) != want) {
    if ((++spins & 1023) == 0) {
      u64 t = now_ns();
      if (start == 0) {
        start = t;
        if (ld_volatile(status) != 0) return true;
      } else if (t - start > BARRIER_TIMEOUT_NS) {
        atomicExch(status, 1u);
        return true;
      }
    }
  }
  return false;
}

// A rank whose wait gave up goes on without the peer it waited for, so from here its writes
// into peers' buffers (slots, LL lines, outputs) may land in a call those peers are still
// running, and its flags no longer mean what they say: every rank of the group is marked
// failed, each then leaves its own output NaN (fail_safe). The fence orders these stores before
// every later store of this thread, and the __syncthreads after a barrier's waits (or the
// caller's data dependence) orders them before the block's: a peer that reads data this rank
// wrote after giving up reads its status after that data (fail_safe, below), and finds it set.
__device__ __forceinline__ void raise_fault(const ArArgs& a) {
  for (int p = 0; p < a.nranks; p++) st_relaxed(&((Signal*)a.sig[p])->status, 1u);
  __threadfence_system();
}

// ---- LL lines: {data lo, flag, data hi, flag} ----
//
// Why no fence is needed: PTX models a vector access as one access per element (PTX ISA
// 8.2.4), and two .relaxed.sys accesses of the same aligned 8-byte word are morally strong,
// so they are single-copy atomic (8.10.3): a reader sees a word either entirely from the
// writer's store or entirely from an earlier one. A word whose flag half holds this call's
// flag therefore holds this call's data half; no other ordering is involved. The same holds
// over PCIe and NVLink, where NCCL's LL protocol relies on 8-byte stores arriving whole.
// Flags are never 0 (ll_flag), and a stale line never carries the flag being awaited. The
// lines start zeroed (the host zeroes them again only with the epochs, on every rank of a
// failed group, all marked by raise_fault: run.rs check_status). Then a pushed line in
// two-stage push and the island kernels is zeroed once consumed; a pulled one is only ever
// written by its owner's same block, whose flags only grow; and one of one-stage push by one
// block of its sender, in every call of that block with the line's parity, so it holds the flag
// of that block's call two before at most (allreduce.cu one_stage_push_ll): none is zeroed.

__device__ __forceinline__ void ll_store(void* p, u64 data, u32 flag) {
  const u64 lo = (data & 0xffffffffull) | ((u64)flag << 32);
  const u64 hi = (data >> 32) | ((u64)flag << 32);
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1,%2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}

__device__ __forceinline__ void ll_clear(void* p) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1,%1};" ::"l"(p), "l"(0ull) : "memory");
}

// Loads the line at p into lo, hi when `on` is non-zero; otherwise leaves them as they were.
// A predicated load rather than a branch, so that several of them issue back to back.
__device__ __forceinline__ void ll_load_if(u32 on, const void* p, u64& lo, u64& hi) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t"
      "@p ld.relaxed.sys.global.v2.u64 {%0,%1}, [%3];\n\t}"
      : "+l"(lo), "+l"(hi)
      : "r"(on), "l"(p)
      : "memory");
}

// For ll_wait8 over ranks g .. g + 7 of n: rank g + k, or the last rank when there is no such rank: an address that is safe to load.
__device__ __forceinline__ int clamp_rank(int r, int n) { return r < n ? r : n - 1; }

// Bit k set when rank g + k exists and is not `rank`.
__device__ __forceinline__ u32 peers_mask(int g, int n, int rank) {
  u32 m = 0;
#pragma unroll
  for (int k = 0; k < 8; k++)
    if (g + k < n && g + k != rank) m |= 1u << k;
  return m;
}

// Waits until each line ptr(k) with bit k of `want` set (k < 8) carries `flag`, and returns
// their data in d[k]. Each pass loads, back to back, only the lines still missing, so one
// pass costs one memory round trip however many peers there are and arrived lines are not
// read again. ptr(k) must be a valid address for every k (callers clamp). Gives up like
// wait_for on timeout, and like it returns true then (d is not set).
template <typename Ptr>
__device__ __forceinline__ bool ll_wait8(u64* d, u32 want, Ptr ptr, u32 flag, u32* status) {
  u64 start = 0;
  u32 spins = 0;
  u64 lo[8], hi[8];
#pragma unroll
  for (int k = 0; k < 8; k++) lo[k] = hi[k] = 0;
  u32 missing = want;
  for (;;) {
#pragma unroll
    for (int k = 0; k < 8; k++) ll_load_if(missing & (1u << k), ptr(k), lo[k], hi[k]);
#pragma unroll
    for (int k = 0; k < 8; k++)
      if ((u32)(lo[k] >> 32) == flag && (u32)(hi[k] >> 32) == flag) missing &= ~(1u << k);
    if (missing == 0) {
#pragma unroll
      for (int k = 0; k < 8; k++) d[k] = (lo[k] & 0xffffffffull) | (hi[k] << 32);
      return false;
    }
    if ((++spins & 255) == 0) {
      u64 t = now_ns();
      if (start == 0) {
        start = t;
        if (ld_volatile(status) != 0) return true;
      } else if (t - start > BARRIER_TIMEOUT_NS) {
        atomicExch(status, 1u);
        return true;
      }
    }
  }
}

// ---- LL geometry: one data word (8 bytes) per thread, LL_THREADS (LL1_THREADS) per block ----
//
// Each LL line location is always handled by the same block index (blockIdx.x = location /
// the kernel's threads per block, or / the words per block of a kernel that spreads a word
// over several threads) whatever the message size, so the flags stored there come from one
// block's ll_epoch sequence and only grow (0 is skipped) until they wrap.

// Data words of a message, for messages within the LL limits (32-bit arithmetic).
__device__ __forceinline__ u32 ll_words(u64 bytes) { return (u32)((bytes + 7) / 8); }
// Words per shard in the two-stage LL path; at least one, so every pair of ranks exchanges
// a line in every call (the kernels' buffer-reuse arguments need that).
__device__ __forceinline__ u32 ll_shard(u32 words, int n) {
  const u32 s = (words + (u32)n - 1) / (u32)n;
  return s ? s : 1;
}
// Blocks that cover `words` words, `per` words per block.
__device__ __forceinline__ u32 ll_grid(u32 words, u32 per = LL_THREADS) { return (words + per - 1) / per; }

// False (and the rank's status marked) when the host launched an LL kernel with a size or grid
// it does not serve: the buffers would overflow. The host never does (kernels.rs tests).
// `shards`: whether the grid covers a shard (two-stage) rather than the whole message; `per`:
// words per block (the kernel's threads, one word each, but where it spreads a word over threads).
__device__ __forceinline__ bool ll_launch_ok(Signal* self, u64 bytes, u64 max_bytes, int n, bool shards,
                                             u32 per = LL_THREADS) {
  if (bytes <= max_bytes) {
    const u32 words = ll_words(bytes);
    if (gridDim.x == ll_grid(shards ? ll_shard(words, n) : words, per)) return true;
  }
  if (threadIdx.x == 0) atomicExch(&self->status, 2u);
  return false;
}

// This block's LL flag: ll_epoch + 1, never 0 (zeroed lines must never match), and after
// 0xffffffff comes 2 so that consecutive calls still alternate parity.
__device__ __forceinline__ u32 ll_flag(const Signal* self) {
  const u32 f = self->ll_epoch[blockIdx.x] + 1;
  return f != 0 ? f : 2;
}

// 16-byte loads bypass L1 (.cg): peers' data may have been written during this kernel.
__device__ __forceinline__ V4 ld_v4(const void* p) {
  V4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d)
               : "l"(p)
               : "memory");
  return v;
}

// An L2 policy under which the lines a load brings in are evicted first (sm_80 and later;
// 0, unused, before).
__device__ __forceinline__ u64 evict_first_policy() {
  u64 policy = 0;
#if __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// ld_v4 for data read once: its lines leave L2 before others, so what the kernel wrote and
// reads back soon stays there. A cache hint only; the value read is the same.
__device__ __forceinline__ V4 ld_v4_once(const void* p, u64 policy) {
#if __CUDA_ARCH__ >= 800
  V4 v;
  asm volatile("ld.global.cg.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d)
               : "l"(p), "l"(policy)
               : "memory");
  return v;
#else
  return ld_v4(p);
#endif
}

__device__ __forceinline__ void st_v4(void* p, V4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.a), "r"(v.b), "r"(v.c),
               "r"(v.d)
               : "memory");
}

__device__ __forceinline__ u32 ld_u32(const void* p) {
  u32 v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u16 ld_u16(const void* p) {
  u16 v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u64 ld_u64(const void* p) {
  u64 v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_u64(void* p, u64 v) {
  asm volatile("st.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void st_u32(void* p, u32 v) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_u16(void* p, u16 v) {
  asm volatile("st.global.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}

// ---- element types: P values per 16-byte vector, conversions through fp32 ----

__device__ __forceinline__ float bf16_to_f32(u32 bits) { return __uint_as_float(bits << 16); }

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ u32 f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// NAN_WORD: 32 bits of the type's quiet NaN (two of them for the 16-bit types).
struct Bf16 {
  static const int P = 8;
  static const int SIZE = 2;
  static const u32 NAN_WORD = 0x7fc07fc0u;
  __device__ static float get(u32 word, int half) {
    return bf16_to_f32(half ? (word >> 16) : (word & 0xffffu));
  }
  __device__ static u32 put(float lo, float hi) { return f32_to_bf16(lo) | (f32_to_bf16(hi) << 16); }
  __device__ static float load1(const char* base, u64 i) { return bf16_to_f32(ld_u16(base + i * 2)); }
  __device__ static void store1(char* base, u64 i, float v) { st_u16(base + i * 2, (u16)f32_to_bf16(v)); }
};

struct Fp16 {
  static const int P = 8;
  static const int SIZE = 2;
  static const u32 NAN_WORD = 0x7e007e00u;
  __device__ static float get(u32 word, int half) {
    return f16_to_f32((u16)(half ? (word >> 16) : (word & 0xffffu)));
  }
  __device__ static u32 put(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
  }
  __device__ static float load1(const char* base, u64 i) { return f16_to_f32(ld_u16(base + i * 2)); }
  __device__ static void store1(char* base, u64 i, float v) { st_u16(base + i * 2, f32_to_f16(v)); }
};

struct Fp32 {
  static const int P = 4;
  static const int SIZE = 4;
  static const u32 NAN_WORD = 0x7fc00000u;
  __device__ static float load1(const char* base, u64 i) { return __uint_as_float(ld_u32(base + i * 4)); }
  __device__ static void store1(char* base, u64 i, float v) { st_u32(base + i * 4, __float_as_uint(v)); }
};

// acc[0..P) += the P values in v.
template <typename T>
__device__ __forceinline__ void add_vec(float* acc, const V4& v) {
  if constexpr (T::P == 8) {
    const u32 w[4] = {v.a, v.b, v.c, v.d};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      acc[2 * i] += T::get(w[i], 0);
      acc[2 * i + 1] += T::get(w[i], 1);
    }
  } else {
    acc[0] += __uint_as_float(v.a);
    acc[1] += __uint_as_float(v.b);
    acc[2] += __uint_as_float(v.c);
    acc[3] += __uint_as_float(v.d);
  }
}

template <typename T>
__device__ __forceinline__ V4 pack_vec(const float* acc) {
  V4 v;
  if constexpr (T::P == 8) {
    v.a = T::put(acc[0], acc[1]);
    v.b = T::put(acc[2], acc[3]);
    v.c = T::put(acc[4], acc[5]);
    v.d = T::put(acc[6], acc[7]);
  } else {
    v.a = __float_as_uint(acc[0]);
    v.b = __float_as_uint(acc[1]);
    v.c = __float_as_uint(acc[2]);
    v.d = __float_as_uint(acc[3]);
  }
  return v;
}

// ---- 8-byte LL data words: 4 bf16/fp16 or 2 fp32 values ----

template <typename T>
__device__ __forceinline__ void add_line(float* acc, u64 d) {
  const u32 w0 = (u32)d, w1 = (u32)(d >> 32);
  if constexpr (T::SIZE == 2) {
    acc[0] += T::get(w0, 0);
    acc[1] += T::get(w0, 1);
    acc[2] += T::get(w1, 0);
    acc[3] += T::get(w1, 1);
  } else {
    acc[0] += __uint_as_float(w0);
    acc[1] += __uint_as_float(w1);
  }
}

template <typename T>
__device__ __forceinline__ u64 pack_line(const float* acc) {
  if constexpr (T::SIZE == 2) {
    return (u64)T::put(acc[0], acc[1]) | ((u64)T::put(acc[2], acc[3]) << 32);
  } else {
    return (u64)__float_as_uint(acc[0]) | ((u64)__float_as_uint(acc[1]) << 32);
  }
}

// The partial last word of a message: elements past the end read as 0 and are not touched.
// Out of line, so the common full-word path keeps its registers.
template <typename T>
__device__ __noinline__ u64 load_partial(const char* base, u64 j, u64 elems) {
  const u64 e0 = j * (8 / T::SIZE);
  u64 d = 0;
  for (u64 k = 0; e0 + k < elems; k++) {
    const u64 raw = T::SIZE == 2 ? (u64)ld_u16(base + (e0 + k) * 2) : (u64)ld_u32(base + (e0 + k) * 4);
    d |= raw << (k * T::SIZE * 8);
  }
  return d;
}

template <typename T>
__device__ __noinline__ void store_partial(char* base, u64 j, u64 d, u64 elems) {
  const u64 e0 = j * (8 / T::SIZE);
  for (u64 k = 0; e0 + k < elems; k++) {
    if constexpr (T::SIZE == 2) {
      st_u16(base + (e0 + k) * 2, (u16)(d >> (k * 16)));
    } else {
      st_u32(base + (e0 + k) * 4, (u32)(d >> (k * 32)));
    }
  }
}

// Data word j (8 bytes) of a message of `elems` elements at base; 0 past the end, and the
// last word never reads past the message.
template <typename T>
__device__ __forceinline__ u64 load_line(const char* base, u64 j, u64 elems) {
  const u64 per = 8 / T::SIZE;
  if ((j + 1) * per <= elems) return ld_u64(base + j * 8);
  if (j * per >= elems) return 0;
  return load_partial<T>(base, j, elems);
}

// Writes the elements of data word j that lie inside the message.
template <typename T>
__device__ __forceinline__ void store_line(char* base, u64 j, u64 d, u64 elems) {
  const u64 per = 8 / T::SIZE;
  if ((j + 1) * per <= elems) {
    st_u64(base + j * 8, d);
  } else if (j * per < elems) {
    store_partial<T>(base, j, d, elems);
  }
}

// ---- staging (the comment above ArArgs) ----

template <typename T>
__device__ __forceinline__ void copy1(char* dst, const char* src, u64 i) {
  if constexpr (T::SIZE == 2) {
    st_u16(dst + i * 2, ld_u16(src + i * 2));
  } else {
    st_u32(dst + i * 4, ld_u32(src + i * 4));
  }
}

// Elements [from, n) copied one by one by block 0 (a message's tail after its last vector).
template <typename T>
__device__ __forceinline__ void copy_tail(char* dst, const char* src, u64 from, u64 n) {
  if (blockIdx.x == 0)
    for (u64 e = from + threadIdx.x; e < n; e += blockDim.x) copy1<T>(dst, src, e);
}

// Copies this rank's input (src) into its shared input where they differ, as the peers' same
// block reads it: vector i of each of `parts` parts of sv vectors (the whole message: one part
// of nvec) when `shards` (the peers read them), and the tail, which block 0 reads, always.
// True when it copied, so that the first barrier publishes.
template <typename T>
__device__ __forceinline__ bool stage(const ArArgs& a, int rank, u64 nvec, u64 sv, int parts, bool shards) {
  const char* in = (const char*)a.src[rank];
  char* shared = (char*)a.in[rank];
  if (shared == in) return false;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  if (shards)
    for (int q = 0; q < parts; q++)
      for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < sv && (u64)q * sv + i < nvec; i += stride) {
        const u64 off = ((u64)q * sv + i) * 16;
        st_v4(shared + off, ld_v4(in + off));
      }
  copy_tail<T>(shared, in, nvec * T::P, a.n);
  return true;
}

// ---- failing safe ----

// The last call of every allreduce kernel, by every thread of every block, whatever path the
// kernel took: when this rank's status is set (a wait of this rank gave up, in this call or an
// earlier one, or a peer's did: raise_fault), the block overwrites the rank's whole output with
// the type's quiet NaN and sets the host's fault word. A result that timed out is then NaN, which
// no engine mistakes for a sum, never partial sums that look plausible.
//
// Why the whole output and not the block's part: blocks of one rank finish at different times.
// A block that ended before the status was set left its part as computed; the block whose wait
// gave up (or any block that sees the status at its end) then overwrites every element with its
// own threads. The status is sticky and is set before the end of the block that gave up (that
// thread set it itself and reads it back here), so for every element the last writer of this
// rank is a block that poisons it. Blocks that read the status as clear saw no fault of their
// own, and a peer that gave up marked this rank before it wrote anything more into it
// (raise_fault); this rank's loads of what it wrote returned before the status is read here
// (each thread reads it after its own work, and __syncthreads_or joins them), so such a block's
// part is a right sum. No fence is paid on the healthy path: without one, a right part from a
// block that ended just before a peer's raise_fault may still land after the poison, so a failed
// call holds NaN everywhere but, at worst, there.
//
// Where peers write this rank's output (two-stage push, the island kernels that push inside),
// they write the shared output, which the kernel copies to the caller's tensor (dst) before this
// runs, so a late peer's shard lands there, never in dst. Only a host that passes the shared
// output as dst (none does) would see one after the poison, and NaN still where it wrote.
// Out of line, with plain arguments: the healthy path keeps its registers and no copy of ArArgs.
template <typename T>
__device__ __noinline__ void poison(char* out, u64 n, u64 fault) {
  const u64 nvec = n / T::P;
  const V4 q = {T::NAN_WORD, T::NAN_WORD, T::NAN_WORD, T::NAN_WORD};
  for (u64 v = threadIdx.x; v < nvec; v += blockDim.x) st_v4(out + v * 16, q);
  for (u64 e = nvec * T::P + threadIdx.x; e < n; e += blockDim.x) {
    if constexpr (T::SIZE == 2) {
      st_u16(out + e * 2, (u16)T::NAN_WORD);
    } else {
      st_u32(out + e * 4, T::NAN_WORD);
    }
  }
  if (threadIdx.x == 0 && fault != 0) st_relaxed((u32*)fault, 1u);
}

// A registered-form call whose slot was not registered: its output NaN, `missed` set.
template <typename T>
__device__ __noinline__ void reg_missed(char* out, u64 n, u64 missed) {
  poison<T>(out, n, 0);
  if (threadIdx.x == 0 && missed != 0) st_relaxed((u32*)missed, 1u);
}

template <typename T>
__device__ __forceinline__ void fail_safe(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  const Signal* self = (const Signal*)a.sig[rank];
  if (__syncthreads_or(ld_volatile(&self->status) != 0)) poison<T>((char*)a.dst[rank], a.n, a.fault);
}

// This thread's read of its rank's status for fail_safe, taken early: once every load of
// what peers wrote (or of their tensors) that this thread's results depend on has returned,
// which is all fail_safe's argument asks of the read; later work (stores, a last barrier that
// only says "done") then overlaps its round trip instead of following it. A wait that gives up
// after this read sets the status itself and reports it (the caller ORs `gave_up` in).
__device__ __forceinline__ bool status_set(const ArArgs& a) {
  const Signal* self = (const Signal*)a.sig[a.rank_base + (int)blockIdx.y];
  return ld_volatile(&self->status) != 0;
}

// fail_safe with the status each thread read early (status_set, or a wait that gave up).
template <typename T>
__device__ __forceinline__ void fail_safe(const ArArgs& a, bool seen) {
  const int rank = a.rank_base + (int)blockIdx.y;
  if (__syncthreads_or(seen)) poison<T>((char*)a.dst[rank], a.n, a.fault);
}
