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
//
// Small messages in the push kernels and two-stage pull go to *_ll kernels (see common.cuh):
// data travels with its flag, so they need no system-scope fence at all. The host picks them
// from the message size alone (src/fabric/cuda/kernels/, ll_blocks), so every rank makes
// the same choice, and launches exactly the grid they expect.
//
// Ordering arguments below speak of "kernel X" for a rank's X-th call of this backend: a rank's
// calls run in order on its stream (in loopback, one grid per call), so a rank that has begun
// kernel X has finished kernel X-1, every block of it. Launched as programmatic dependent
// launches (sm_90 and later), a grid may be resident before that, but "begun" means past
// pdl_wait, which waits for the previous kernel to finish and its writes to be visible.
#include "common.cuh"

// Announce `flag` to every rank for this block and phase, then wait until each has announced
// it to us. PUBLISH (release/acquire) when peers will read data this block wrote in this
// kernel, or we will read data peers wrote; relaxed when the barrier only says "ready" or
// "done reading" (data written before the kernel started is already visible), as production
// custom allreduce kernels do, saving a system-scope fence per barrier. True in a thread
// whose wait gave up. LAST: the kernel's last barrier, which fail_safe's __syncthreads_or
// follows, so it needs no closing __syncthreads of its own.
template <bool PUBLISH, bool LAST = false>
__device__ __forceinline__ bool barrier(const ArArgs& a, int rank, u32 flag, int phase) {
  __syncthreads();
  bool gave_up = false;
  if ((int)threadIdx.x < a.nranks) {
    Signal* peer = (Signal*)a.sig[threadIdx.x];
    Signal* self = (Signal*)a.sig[rank];
    if (PUBLISH) {
      st_release(&peer->flags[phase][blockIdx.x][rank], flag);
    } else {
      st_relaxed(&peer->flags[phase][blockIdx.x][rank], flag);
    }
    gave_up = wait_for<PUBLISH>(&self->flags[phase][blockIdx.x][threadIdx.x], flag, &self->status);
    if (gave_up) raise_fault(a);
  }
  if (!LAST) __syncthreads();
  return gave_up;
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

// One-stage push: rank `src`'s word j on the receiving rank, buffer q (flag parity).
__device__ __forceinline__ char* ll1(u64 sig, int n, u32 q, int src, u64 j) {
  return (char*)sig + LL_OFFSET + (((u64)q * n + src) * LL1_LINES + j) * LL_LINE;
}

// Two-stage push: stage 0 (reduce-scatter) or 1 (all-gather), buffer q, sender src, word i of
// the shard; smax = ll_shard(LL2_LINES, n) words per sender. Consecutive words are adjacent,
// so a warp's stores and polls are coalesced (interleaving senders would make each warp access
// touch 32 cache lines; profiles/hardware/h200/NOTES-kernel-choices.md has the measurement).
__device__ __forceinline__ char* ll2(u64 sig, int n, u64 smax, int stage, u32 q, int src, u64 i) {
  return (char*)sig + LL_OFFSET + ((((u64)stage * 2 + q) * n + src) * smax + i) * LL_LINE;
}

// Two-stage pull: word i of slot s in buffer q of the lines of the rank whose signal allocation
// is `sig` (the owner); smax = ll_shard(LL2_LINES, n) words per slot. Slot s holds the owner's
// word of shard s: its input, which rank s reads, for s != owner; its reduced shard, which
// every peer reads, for s == owner. As in ll2, a slot's words are adjacent.
__device__ __forceinline__ char* llp(u64 sig, int n, u64 smax, u32 q, int s, u64 i) {
  return (char*)sig + LL_OFFSET + (((u64)q * n + s) * smax + i) * LL_LINE;
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
//
// Staging: each block copies into the shared input the vectors that the peers' same block
// reads (block 0 the tail too) before barrier 0, which then publishes them. REG, the
// registered form: every rank's own input, read where it lies (common.cuh, RegSlot); barrier
// 0 then only says "ready", the inputs having been written by kernels that finished before.
// Returns its status read for fail_safe (status_set), taken before the last barrier.
template <typename T, bool REG>
__device__ bool one_stage_pull(const ArArgs& a) {
  __shared__ u64 ins[MAX_RANKS];
  __shared__ u32 ok;
  reg_load_then_wait<REG>(a, false, ins, &ok);
  RANK_SETUP
  char* out = (char*)a.dst[rank];
  if constexpr (REG) {
    barrier<false>(a, rank, flag, 0);
  } else if (stage<T>(a, rank, nvec, nvec, 1, true)) {
    barrier<true>(a, rank, flag, 0);
  } else {
    barrier<false>(a, rank, flag, 0);
  }
  auto input = [&](int p) { return (const char*)(REG ? ins[p] : a.in[p]); };
  // Every rank's input from in[] (this rank's own staged by this block, or src itself), or
  // where the registration says it lies; nothing at all from an unregistered slot.
  if (!REG || ok) {
    for (u64 v = first; v < nvec; v += stride) {
      float acc[T::P];
      reduce_vec<T>(acc, n, [&](int p) { return input(p) + v * 16; });
      st_v4(out + v * 16, pack_vec<T>(acc));
    }
    if (blockIdx.x == 0) {
      for (u64 e = nvec * T::P + threadIdx.x; e < a.n; e += blockDim.x) {
        float s = 0.f;
        for (int p = 0; p < n; p++) s += T::load1(input(p), e);
        T::store1(out, e, s);
      }
    }
  }
  bool seen = status_set(a);
  // Peers must finish reading our input before our stream may change it.
  seen |= barrier<false, true>(a, rank, flag, 2);
  FINISH
  if constexpr (REG) {
    if (!ok) reg_missed<T>(out, a.n, a.missed);
  }
  return seen;
}

// LL one-stage push: each thread sends its input word to every peer's LL buffer, then sums the
// words that arrived in its own. Lines alternate between two buffers by flag parity; nothing
// is zeroed and there is no barrier:
// - Stale lines: line (src, j) of buffer q is written only by rank src's block
//   j / LL1_THREADS, with that block's flag, in each of that block's calls of parity q: every
//   thread of the block stores its lines, words past the message too (0, read by no one). The
//   same block of every rank counts the same calls, so a receiver waiting for F finds there 0,
//   the flag of the call two before, or F: never a stale F, even once the flags wrap (ll_flag).
// - Buffer reuse: a writer block rewrites buffer q in its call F + 2. In its call F + 1 it
//   read a line that the same block of every peer wrote in F + 1 (its first word lies inside
//   the message), so every peer had begun F + 1 and thus finished F, with its reads of F.
// - Faults: a line carries its call's flag beside its data, so a sum is made of this call's
//   lines alone, whoever wrote them. The status is read at the start, beside flag and input,
//   not after the polls (a round trip on every call's path): a group whose wait gave up is NaN
//   where a poll gave up, and everywhere from the next call on (raise_fault set every status).
// Returns whether the rank's status was set or a poll gave up, for fail_safe.
static_assert(LL1_LINES % LL1_THREADS == 0, "the words past the message stay in the lines");
template <typename T>
__device__ bool one_stage_push_ll(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  const int n = a.nranks;
  Signal* self = (Signal*)a.sig[rank];
  if (!ll_launch_ok(self, a.n * T::SIZE, LL1_MAX_BYTES, n, false, LL1_THREADS)) return true;
  const u32 flag = ll_flag(self);
  const bool failed = ld_volatile(&self->status) != 0;
  const u32 q = flag & 1;
  const u64 j = (u64)blockIdx.x * LL1_THREADS + threadIdx.x;
  const u64 mine = load_line<T>((const char*)a.src[rank], j, a.n);  // 0 past the message
#pragma unroll
  for (int p = 0; p < MAX_RANKS; p++)
    if (p < n && p != rank) ll_store(ll1(a.sig[p], n, q, rank, j), mine, flag);
  const bool inside = j < ll_words(a.n * T::SIZE);
  bool seen = failed;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int g = 0; g < MAX_RANKS; g += 8) {
    if (inside && g < n) {
      u64 d[8];
      if (ll_wait8(d, peers_mask(g, n, rank), [&](int k) { return ll1(a.sig[rank], n, q, clamp_rank(g + k, n), j); }, flag, &self->status)) raise_fault(a), seen = true;
#pragma unroll
      for (int k = 0; k < 8; k++)
        if (g + k < n) add_line<T>(acc, g + k == rank ? mine : d[k]);
    }
  }
  if (inside) store_line<T>((char*)a.dst[rank], j, pack_line<T>(acc), a.n);
  if (threadIdx.x == 0) self->ll_epoch[blockIdx.x] = flag;
  return seen;
}

// Write the local input into every peer's receive slot, then reduce what arrived.
template <typename T>
__device__ void one_stage_push(const ArArgs& a) {
  RANK_SETUP
  const char* in = (const char*)a.src[rank];
  char* out = (char*)a.dst[rank];
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

// LL two-stage pull: both phases pulled in lines, so nothing is staged and there is no
// barrier. Thread i (word i of a shard) writes word i of each peer p's shard of this rank's
// input into slot p of its own lines, sums word i of its own shard from slot `rank` of every
// peer's lines (its own word from its input), writes the sum into slot `rank` of its own
// lines and the output, and copies each peer's sum from slot p of that peer's lines into the
// output. Peers read only lines, never the caller's tensors (src, dst), and lines carry their
// flags, so no copy and no fence is needed.
//
// - Buffer reuse: word i of every slot is handled by block i / LL_THREADS whatever the message
//   size, so a line of buffer q (flag parity) written in that block's LL call F is next
//   written in its call F + 2. In its call F + 1 the block reads, in each phase, a line that
//   the same block of every peer wrote in F + 1 (every block has a word of every shard, padding
//   words past the message included: shards have at least one word), so each peer had begun
//   F + 1 and thus finished F, with every read of this rank's lines of F.
// - Stale lines: a line is written only by its owner, always by the same block, with that
//   block's flags, which only grow (ll_flag; the lines start zeroed and flags are never 0), so
//   it holds 0 or the flag of an earlier call, never the one awaited. Nothing is zeroed.
// - No barrier at the end: no peer touches this rank's tensors, and its lines are rewritten
//   only as above.
template <typename T>
__device__ void two_stage_pull_ll(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  const int n = a.nranks;
  Signal* self = (Signal*)a.sig[rank];
  if (!ll_launch_ok(self, a.n * T::SIZE, LL2_MAX_BYTES, n, true)) return;
  const u64 words = ll_words(a.n * T::SIZE);
  const u64 sw = ll_shard((u32)words, n);
  const u32 flag = ll_flag(self);
  const u32 q = flag & 1;
  const u64 smax = ll_shard(LL2_LINES, n);
  const u64 i = (u64)blockIdx.x * LL_THREADS + threadIdx.x;
  if (i < sw) {
    const char* in = (const char*)a.src[rank];
    char* out = (char*)a.dst[rank];
    const u64 own = (u64)rank * sw + i;
    // Reduce-scatter, given: this rank's word of its own shard and of each peer's, the loads
    // of a group issued together, then the peers' line stores back to back, so the thread
    // waits for one local round trip before its polls.
    const u64 mine = load_line<T>(in, own, a.n);
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 8) {
      if (g < n) {
        u64 x[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
          const u64 w = (u64)(g + k) * sw + i;
          x[k] = (g + k < n && g + k != rank) ? load_line<T>(in, w, a.n) : 0;
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (g + k < n && g + k != rank) ll_store(llp(a.sig[rank], n, smax, q, g + k, i), x[k], flag);
      }
    }
    // Reduce-scatter, taken: one poll pass over the peers' slots for this rank, summed in
    // rank order as two_stage_pull does.
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 8) {
      if (g < n) {
        const u32 want = peers_mask(g, n, rank);
        u64 d[8];
        if (ll_wait8(d, want, [&](int k) { return llp(a.sig[clamp_rank(g + k, n)], n, smax, q, rank, i); }, flag, &self->status)) raise_fault(a);
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (g + k < n) add_line<T>(acc, g + k == rank ? mine : d[k]);
      }
    }
    // All-gather: the sum into this rank's own slot, the peers' from theirs.
    const u64 r = pack_line<T>(acc);
    ll_store(llp(a.sig[rank], n, smax, q, rank, i), r, flag);
    if (own < words) store_line<T>(out, own, r, a.n);
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 8) {
      if (g < n) {
        const u32 want = peers_mask(g, n, rank);
        u64 d[8];
        auto line = [&](int k) {
          const int p = clamp_rank(g + k, n);
          return llp(a.sig[p], n, smax, q, p, i);
        };
        if (ll_wait8(d, want, line, flag, &self->status)) raise_fault(a);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          const u64 w = (u64)(g + k) * sw + i;
          if (((want >> k) & 1) && w < words) store_line<T>(out, w, d[k], a.n);
        }
      }
    }
  }
  // With no barrier, a thread may finish before another of its block has read this call's
  // flag from the epoch that thread 0 moves on here.
  __syncthreads();
  if (threadIdx.x == 0) self->ll_epoch[blockIdx.x] = flag;
}

// Reduce-scatter by reading peers' shards of this rank, then all-gather by reading peers'
// reduced shards. The tail belongs to the last rank's shard.
//
// No barrier at the end: peers read this rank's input only before they arrive at barrier 1
// (a release, which orders those reads before it), and this rank waits there for all of
// them. They read its reduced shard after barrier 1; it is next written in this rank's next
// call, after that call's barrier 0, which every peer reaches only after finishing this call.
//
// Staging: vector i of each shard is read by the peers' block that holds i, so this rank's
// same block stages it (block 0 the tail) before barrier 0, which then publishes it. REG, the
// registered form: as in one_stage_pull, nothing staged; an unregistered rank publishes a NaN
// shard, so a peer whose slot was registered gathers NaN from it, never a plausible sum.
template <typename T, bool REG>
__device__ void two_stage_pull(const ArArgs& a) {
  __shared__ u64 ins[MAX_RANKS];
  __shared__ u32 ok;
  reg_load_then_wait<REG>(a, false, ins, &ok);
  RANK_SETUP
  const u64 sv = (nvec + n - 1) / n;
  const u64 mine = shard_len(nvec, sv, rank);
  const u64 tail = a.n - nvec * T::P;
  char* red = (char*)a.scratch[rank];
  char* out = (char*)a.dst[rank];
  if constexpr (REG) {
    barrier<false>(a, rank, flag, 0);
  } else if (stage<T>(a, rank, nvec, sv, n, true)) {
    barrier<true>(a, rank, flag, 0);
  } else {
    barrier<false>(a, rank, flag, 0);
  }
  auto input = [&](int p) { return (const char*)(REG ? ins[p] : a.in[p]); };
  if (!REG || ok) {
    // Every rank's input from in[] (this rank's own staged by this block, or src itself).
    for (u64 i = first; i < mine; i += stride) {
      const u64 off = ((u64)rank * sv + i) * 16;
      float acc[T::P];
      reduce_vec<T>(acc, n, [&](int p) { return input(p) + off; });
      st_v4(red + i * 16, pack_vec<T>(acc));
    }
    if (blockIdx.x == 0 && rank == n - 1) {
      for (u64 j = threadIdx.x; j < tail; j += blockDim.x) {
        float s = 0.f;
        for (int p = 0; p < n; p++) s += T::load1(input(p), nvec * T::P + j);
        T::store1(red + mine * 16, j, s);
      }
    }
  } else {
    const float nan = __uint_as_float(0x7fc00000u);
    float nans[T::P];
#pragma unroll
    for (int k = 0; k < T::P; k++) nans[k] = nan;
    const V4 q = pack_vec<T>(nans);
    for (u64 i = first; i < mine; i += stride) st_v4(red + i * 16, q);
    if (blockIdx.x == 0 && rank == n - 1)
      for (u64 j = threadIdx.x; j < tail; j += blockDim.x) T::store1(red + mine * 16, j, nan);
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
  FINISH
  if constexpr (REG) {
    if (!ok) reg_missed<T>(out, a.n, a.missed);
  }
}

// LL two-stage push: each thread sends word i of every other rank's shard to that rank, sums
// the words of its own shard that arrive, sends the sum to every peer and writes the words
// that come back into its output. Peers write only LL buffers here, never the output.
//
// Buffer reuse: lines alternate between two buffers by flag parity, and a receiver zeroes
// each line once read, so a stale line never carries the awaited flag. A writer reuses a
// buffer in LL call F + 2, after finishing F + 1 by reading a line every peer wrote in it
// (every pair exchanges one in both stages of every call: shards have at least one word), so
// every peer had finished F, reading and zeroing its lines there; those zeroes are
// program-ordered before the peer's writes of F + 1, which the writer saw.
template <typename T>
__device__ void two_stage_push_ll(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  const int n = a.nranks;
  Signal* self = (Signal*)a.sig[rank];
  if (!ll_launch_ok(self, a.n * T::SIZE, LL2_MAX_BYTES, n, true)) return;
  const u64 words = ll_words(a.n * T::SIZE);
  const u64 sw = ll_shard((u32)words, n);
  const u32 flag = ll_flag(self);
  const u32 q = flag & 1;
  const u64 smax = ll_shard(LL2_LINES, n);
  const u64 i = (u64)blockIdx.x * LL_THREADS + threadIdx.x;
  if (i < sw) {
    const char* in = (const char*)a.src[rank];
    char* out = (char*)a.dst[rank];
    // Reduce-scatter: loads of a group issued together, then the stores.
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 8) {
      if (g < n) {
        u64 x[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
          const u64 w = (u64)(g + k) * sw + i;
          x[k] = (g + k < n && g + k != rank) ? load_line<T>(in, w, a.n) : 0;
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (g + k < n && g + k != rank) ll_store(ll2(a.sig[g + k], n, smax, 0, q, rank, i), x[k], flag);
      }
    }
    const u64 own = (u64)rank * sw + i;
    const u64 mine = load_line<T>(in, own, a.n);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 8) {
      if (g < n) {
        const u32 want = peers_mask(g, n, rank);
        u64 d[8];
        if (ll_wait8(d, want, [&](int k) { return ll2(a.sig[rank], n, smax, 0, q, clamp_rank(g + k, n), i); }, flag, &self->status)) raise_fault(a);
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (g + k < n) add_line<T>(acc, g + k == rank ? mine : d[k]);
#pragma unroll
        for (int k = 0; k < 8; k++)
          if ((want >> k) & 1) ll_clear(ll2(a.sig[rank], n, smax, 0, q, g + k, i));
      }
    }
    // All-gather.
    const u64 r = pack_line<T>(acc);
#pragma unroll
    for (int p = 0; p < MAX_RANKS; p++)
      if (p < n && p != rank) ll_store(ll2(a.sig[p], n, smax, 1, q, rank, i), r, flag);
    if (own < words) store_line<T>(out, own, r, a.n);
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += 8) {
      if (g < n) {
        const u32 want = peers_mask(g, n, rank);
        u64 d[8];
        if (ll_wait8(d, want, [&](int k) { return ll2(a.sig[rank], n, smax, 1, q, clamp_rank(g + k, n), i); }, flag, &self->status)) raise_fault(a);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          if ((want >> k) & 1) {
            const u64 w = (u64)(g + k) * sw + i;
            if (w < words) store_line<T>(out, w, d[k], a.n);
            ll_clear(ll2(a.sig[rank], n, smax, 1, q, g + k, i));
          }
        }
      }
    }
  }
  if (threadIdx.x == 0) self->ll_epoch[blockIdx.x] = flag;
}

// Reduce-scatter by writing each shard to its owner's receive slot, then all-gather by
// writing the reduced shard into every rank's output.
//
// No barrier at the start: this rank's slots on a peer were last read in the peer's previous
// call before it arrived at that call's final barrier (a release), and this rank left that
// call only after every peer arrived there. Peers' shared outputs are written only after
// barrier 1, which every peer reaches only from this call, once it has copied the last call's
// result out of it: after barrier 2 each block copies what the peers' same block wrote.
//
// REG, the registered form (common.cuh, RegSlot): the reduced shards go straight into every
// rank's own output, nothing is copied out. A peer's output is written only after barrier 1
// of this call, which that peer reached inside this call (its stream's earlier work done),
// and barrier 2 keeps it in the call until every shard has landed. An unregistered rank sends
// NaN into the peers' slots, so every shard they reduce is NaN, and writes no peer's output;
// a thread that reads its rank's status set after barrier 1 (a wait gave up) gathers NaN, so
// no late shard of a failed call lands in a peer's output looking right: read after the
// barrier (whose __syncthreads follows the waiters' acquires) and needed only at the first
// store, so its round trip overlaps the first loads of the slots. It returns its status read
// for fail_safe: before barrier 2 (its loads of the slots have returned), the staged form
// after copying out what peers wrote.
// Loads per thread in flight in the reduce-scatter: enough to cover HBM latency, and still
// within 64 registers for sm_90 (a few bytes spill on older targets). See
// profiles/hardware/h200/NOTES-kernel-choices.md for what 4 and 8 measured.
#define RS_GROUP 8
template <typename T, bool REG>
__device__ bool two_stage_push(const ArArgs& a) {
  __shared__ u64 outs[MAX_RANKS];
  __shared__ u32 ok;
  reg_load_then_wait<REG>(a, true, outs, &ok);
  RANK_SETUP
  const u64 sv = (nvec + n - 1) / n;
  const u64 mine = shard_len(nvec, sv, rank);
  const u64 tail = a.n - nvec * T::P;
  const char* in = (const char*)a.src[rank];
  char* out = (char*)a.dst[rank];
  char* shared = (char*)a.out[rank];
  if constexpr (REG) __syncthreads();
  // Whether this rank sends its data (else NaN) and writes the peers' outputs.
  const bool sends = !REG || ok;
  const float nan = __uint_as_float(0x7fc00000u);
  // Where this rank's result goes on rank p: its own tensor here, the shared output there
  // (the registered form: that rank's own tensor).
  auto out_of = [&](int p) { return p == rank ? out : (char*)(REG ? outs[p] : a.out[p]); };
  // The input is read once here; the slots written here are read back by the reduce below
  // (on the receiving GPU, where peers' writes land in L2), so the input makes way first.
  const u64 once = evict_first_policy();
  for (u64 i = first; i < sv; i += stride) {
#pragma unroll
    for (int g = 0; g < MAX_RANKS; g += RS_GROUP) {
      V4 x[RS_GROUP];
#pragma unroll
      for (int j = 0; j < RS_GROUP; j++)
        if (g + j < n && g + j != rank && (u64)(g + j) * sv + i < nvec)
          x[j] = ld_v4_once(in + ((u64)(g + j) * sv + i) * 16, once);
      if (REG && !sends) {
        float nans[T::P];
#pragma unroll
        for (int k = 0; k < T::P; k++) nans[k] = nan;
#pragma unroll
        for (int j = 0; j < RS_GROUP; j++) x[j] = pack_vec<T>(nans);
      }
#pragma unroll
      for (int j = 0; j < RS_GROUP; j++)
        if (g + j < n && g + j != rank && (u64)(g + j) * sv + i < nvec) st_v4(slot(a, g + j, rank) + i * 16, x[j]);
    }
  }
  if (blockIdx.x == 0 && rank != n - 1) {
    char* dst = slot(a, n - 1, rank) + shard_len(nvec, sv, n - 1) * 16;
    for (u64 j = threadIdx.x; j < tail; j += blockDim.x) {
      if (sends) {
        copy1<T>(dst, in + nvec * 16, j);
      } else {
        T::store1(dst, j, nan);
      }
    }
  }
  barrier<true>(a, rank, flag, 1);
  const bool failed = REG && status_set(a);
  // Backwards: the vectors peers wrote last (this block's last reduce-scatter iterations) are
  // the likeliest still to be in this GPU's L2, where peers' writes land, so read them first.
  for (u64 m = first < mine ? (mine - 1 - first) / stride + 1 : 0; m-- > 0;) {
    const u64 i = first + m * stride;
    float acc[T::P];
    reduce_vec<T>(acc, n, [&](int p) { return p == rank ? in + ((u64)rank * sv + i) * 16 : slot(a, rank, p) + i * 16; });
    if (failed) {
#pragma unroll
      for (int k = 0; k < T::P; k++) acc[k] = nan;
    }
    const V4 r = pack_vec<T>(acc);
#pragma unroll
    for (int p = 0; p < MAX_RANKS; p++)
      if (p < n && (sends || p == rank)) st_v4(out_of(p) + ((u64)rank * sv + i) * 16, r);
  }
  if (blockIdx.x == 0 && rank == n - 1) {
    for (u64 j = threadIdx.x; j < tail; j += blockDim.x) {
      float s = 0.f;
      for (int p = 0; p < n; p++)
        s += p == rank ? T::load1(in + nvec * 16, j) : T::load1(slot(a, rank, p) + mine * 16, j);
      if (failed) s = nan;
      for (int p = 0; p < n; p++)
        if (sends || p == rank) T::store1(out_of(p) + nvec * 16, j, s);
    }
  }
  bool seen = REG && status_set(a);
  // Every shard has landed in our output once all peers pass this point.
  seen |= barrier<true, REG>(a, rank, flag, 2);
  if (REG && !ok) __syncthreads();  // reg_missed below: after every peer's (NaN) shard landed
  if (!REG && shared != out) {
    for (int s = 0; s < n; s++)
      if (s != rank)
        for (u64 i = first; i < shard_len(nvec, sv, s); i += stride) {
          const u64 off = ((u64)s * sv + i) * 16;
          st_v4(out + off, ld_v4(shared + off));
        }
    if (rank != n - 1) copy_tail<T>(out + nvec * 16, shared + nvec * 16, 0, tail);
  }
  if (!REG) seen = status_set(a);
  FINISH
  if constexpr (REG) {
    if (!ok) reg_missed<T>(out, a.n, a.missed);
  }
  return seen;
}

// The bandwidth kernels: two blocks per SM, so 64 registers. The LL kernels run small blocks
// and keep a line per peer in registers. Every kernel first waits for the previous call
// (pdl_wait; the flat bandwidth kernels call it themselves, after loading their registered
// slot) and lets the next one be scheduled only when its own work is done (pdl_trigger):
// triggering at the start would let the next call's blocks take SMs this call still needs
// (profiles/hardware/h200/NOTES-kernel-choices.md). fail_safe, last, leaves the output NaN where
// a wait of the group gave up (common.cuh); after the trigger, so the next call's launch
// overlaps its end, and the next call still sees its writes (pdl_wait waits for this grid to
// finish and its writes to be visible). Kernels that return `seen` read their status early
// (common.cuh, status_set).
#define AR_PULL_KERNELS(T, suffix)                                                                       \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) one_stage_pull_##suffix(const ArArgs a) {     \
    const bool seen = one_stage_pull<T, false>(a);                                                       \
    pdl_trigger();  fail_safe<T>(a, seen);                                                               \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) one_stage_pull_reg_##suffix(const ArArgs a) { \
    const bool seen = one_stage_pull<T, true>(a);                                                        \
    pdl_trigger();  fail_safe<T>(a, seen);                                                               \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) two_stage_pull_reg_##suffix(const ArArgs a) { \
    two_stage_pull<T, true>(a);                                                                          \
    pdl_trigger();  fail_safe<T>(a);                                                                     \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) two_stage_pull_##suffix(const ArArgs a) {     \
    two_stage_pull<T, false>(a);                                                                         \
    pdl_trigger();  fail_safe<T>(a);                                                                     \
  }

#define AR_PUSH_KERNELS(T, suffix)                                                                       \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) one_stage_push_##suffix(const ArArgs a) {     \
    pdl_wait();                                                                                          \
    one_stage_push<T>(a);                                                                                \
    pdl_trigger();  fail_safe<T>(a);                                                                     \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) two_stage_push_##suffix(const ArArgs a) {     \
    const bool seen = two_stage_push<T, false>(a);                                                       \
    pdl_trigger();  fail_safe<T>(a, seen);                                                               \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) two_stage_push_reg_##suffix(const ArArgs a) { \
    const bool seen = two_stage_push<T, true>(a);                                                        \
    pdl_trigger();  fail_safe<T>(a, seen);                                                               \
  }

#define AR_LL_KERNELS(T, suffix)                                                                        \
  extern "C" __global__ void __launch_bounds__(LL1_THREADS) one_stage_push_ll_##suffix(const ArArgs a) {\
    pdl_wait();                                                                                         \
    const bool seen = one_stage_push_ll<T>(a);                                                          \
    pdl_trigger();  fail_safe<T>(a, seen);                                                              \
  }                                                                                                     \
  extern "C" __global__ void __launch_bounds__(LL_THREADS) two_stage_pull_ll_##suffix(const ArArgs a) { \
    pdl_wait();                                                                                         \
    two_stage_pull_ll<T>(a);                                                                            \
    pdl_trigger();  fail_safe<T>(a);                                                                    \
  }                                                                                                     \
  extern "C" __global__ void __launch_bounds__(LL_THREADS) two_stage_push_ll_##suffix(const ArArgs a) { \
    pdl_wait();                                                                                         \
    two_stage_push_ll<T>(a);                                                                            \
    pdl_trigger();  fail_safe<T>(a);                                                                    \
  }

AR_PULL_KERNELS(Bf16, bf16)
AR_PULL_KERNELS(Fp16, fp16)
AR_PULL_KERNELS(Fp32, fp32)
AR_PUSH_KERNELS(Bf16, bf16)
AR_PUSH_KERNELS(Fp16, fp16)
AR_PUSH_KERNELS(Fp32, fp32)
AR_LL_KERNELS(Bf16, bf16)
AR_LL_KERNELS(Fp16, fp16)
AR_LL_KERNELS(Fp32, fp32)
