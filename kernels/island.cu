// Island (hierarchical) allreduce kernels for bf16, fp16 and fp32: the GPUs of each island
// work together first, then each GPU exchanges once with its counterpart (the GPU at its
// place) in every other island, so the slow crossing between islands carries one shard per
// GPU instead of every pair's traffic.
//
// - island_two_shot: reduce-scatter inside the island (GPU j of an island sums shard j of the
//   island's inputs), the island's partial shards summed across islands between counterparts,
//   all-gather inside the island.
// - island_one_shot: the island's sum of the whole message in one stage, then the islands'
//   sums exchanged between counterparts once. For small messages: fewer phases.
//
// Ranks and places: a.order lists the ranks island by island, a.island ranks each, so the rank
// at place p is in island p / island at position p % island. The host derives the islands
// from the topology (src/plan.rs) and sends them with the group.
//
// Each phase pulls (reads peers' buffers) or pushes (writes into peers' slots) as a.dirs says:
// bit 0 for the phases inside islands, bit 1 for the phase across. The host picks them from the
// group's contention probe, so a fabric that writes at a fraction of its read rate is read.
//
// Sums: a rank sums the island's inputs in place order (j = 0 .. island-1) in fp32 and rounds
// once to the element type; the islands' partials are then summed in island order (k = 0 ..
// islands-1) in fp32 and rounded once. Every counterpart sums the same partials in the same
// order, so every rank of the group ends with the same bits.
//
// Barriers: one flag slot per (block, sender) in each rank's Signal (flags[0]), and flags that
// only grow: the c-th call of a block uses epoch + 1 .. epoch + FLAGS_PER_CALL, one per barrier,
// and a waiter accepts any value at or past the one it waits for. A barrier is among a subset
// (the island, the counterparts, or both) and each pair of ranks is in every subset symmetric,
// so a sender that already moved on to a later barrier (a larger value) has passed this one, and
// what it published before is visible through the later release (same thread, later store).
//
// Buffer reuse across calls: every call ends with a barrier among the island and the
// counterparts, which every rank reaches only after its last read of a peer's input, partial,
// slots or output; a rank writes into a peer's output only after a barrier of the island in
// the same call, which the peer reaches only once its stream is done with the last output.
//
// REG, the registered form (common.cuh, RegSlot): peers read each rank's own input and read or
// write its own output where they lie, with nothing staged. The one-shot's slot holds every
// rank's input; the two-shot's a.reg is two slots, every rank's input then its output. The
// first barrier then only says "ready" (the tensors were written by kernels that finished
// before). An unregistered rank reads and writes no peer's tensor: it keeps the barriers in
// step, sends NaN into the peers' slots and as its partial (so no sum made with it looks
// right), and leaves its output NaN (reg_missed).
#include "common.cuh"

#define FLAGS_PER_CALL 5
// Loads in flight per thread in a reduce: four, in a loop that is not unrolled over the ranks,
// keep the kernels within 64 registers (eight, or the loop unrolled as allreduce.cu's
// reduce_vec, spill: each peer's source pointer is chosen at run time here).
#define ISLAND_LOADS 4

__device__ __forceinline__ bool reached(u32 v, u32 want) { return (int)(v - want) >= 0; }

// As wait_for, for a flag that may have moved past `want`; true when it gave up.
template <bool ACQUIRE>
__device__ __forceinline__ bool wait_reach(const u32* p, u32 want, u32* status) {
  u64 start = 0;
  u32 spins = 0;
  while (!reached(ACQUIRE ? ld_acquire(p) : ld_relaxed(p), want)) {
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

// Announce `flag` to each rank in `mask` and wait until each has announced it to us.
template <bool PUBLISH>
__device__ __forceinline__ void set_barrier(const ArArgs& a, int rank, u32 mask, u32 flag) {
  __syncthreads();
  const int t = (int)threadIdx.x;
  if (t < a.nranks && ((mask >> t) & 1u)) {
    Signal* peer = (Signal*)a.sig[t];
    Signal* self = (Signal*)a.sig[rank];
    if (PUBLISH) {
      st_release(&peer->flags[0][blockIdx.x][rank], flag);
    } else {
      st_relaxed(&peer->flags[0][blockIdx.x][rank], flag);
    }
    if (wait_reach<PUBLISH>(&self->flags[0][blockIdx.x][t], flag, &self->status)) raise_fault(a);
  }
  __syncthreads();
}

// acc[0..P) = sum over q = 0 .. n-1, in order, of the vector at src(q).
template <typename T, typename Src>
__device__ __forceinline__ void reduce_island(float* acc, int n, Src src) {
#pragma unroll
  for (int e = 0; e < T::P; e++) acc[e] = 0.f;
#pragma unroll 1
  for (int g = 0; g < n; g += ISLAND_LOADS) {
    V4 x[ISLAND_LOADS];
#pragma unroll
    for (int j = 0; j < ISLAND_LOADS; j++)
      if (g + j < n) x[j] = ld_v4(src(g + j));
#pragma unroll
    for (int j = 0; j < ISLAND_LOADS; j++)
      if (g + j < n) add_vec<T>(acc, x[j]);
  }
}

// Where one rank stands among the islands.
struct Where {
  int k;       // its island
  int j;       // its place in the island
  int m;       // ranks per island
  int islands;
  u32 inside;  // mask of the other ranks of its island
  u32 across;  // mask of its counterparts
};

__device__ __forceinline__ Where where(const ArArgs& a, int rank) {
  Where w;
  w.m = a.island;
  w.islands = a.nranks / a.island;
  int pos = 0;
  for (int p = 0; p < a.nranks; p++)
    if (a.order[p] == rank) pos = p;
  w.k = pos / w.m;
  w.j = pos % w.m;
  w.inside = 0;
  w.across = 0;
  for (int q = 0; q < w.m; q++)
    if (q != w.j) w.inside |= 1u << a.order[w.k * w.m + q];
  for (int q = 0; q < w.islands; q++)
    if (q != w.k) w.across |= 1u << a.order[q * w.m + w.j];
  return w;
}

__device__ __forceinline__ int at(const ArArgs& a, const Where& w, int k, int j) { return a.order[k * w.m + j]; }

// Scratch regions of a rank: island-1 slots for its island peers, its partial, then
// islands-1 slots for the other islands, each a.slot_bytes apart.
__device__ __forceinline__ char* inside_slot(const ArArgs& a, const Where& w, int owner, int owner_j, int from_j) {
  const int idx = from_j < owner_j ? from_j : from_j - 1;
  return (char*)a.scratch[owner] + (u64)idx * a.slot_bytes;
}
__device__ __forceinline__ char* partial(const ArArgs& a, const Where& w, int owner) {
  return (char*)a.scratch[owner] + (u64)(w.m - 1) * a.slot_bytes;
}
__device__ __forceinline__ char* across_slot(const ArArgs& a, const Where& w, int owner, int owner_k, int from_k) {
  const int idx = from_k < owner_k ? from_k : from_k - 1;
  return (char*)a.scratch[owner] + (u64)(w.m + idx) * a.slot_bytes;
}

// Vectors in part s of nvec vectors cut into parts of sv.
__device__ __forceinline__ u64 part_len(u64 nvec, u64 sv, int s) {
  const u64 start = (u64)s * sv;
  if (start >= nvec) return 0;
  const u64 left = nvec - start;
  return left < sv ? left : sv;
}

// The elements after the last whole vector, summed by block 0 of each rank from every rank's
// shared input in rank order (its own too: staged by this block, or src itself): fewer than a
// vector, before the last barrier. Each rank's block 0 staged its tail (stage) before the
// first barrier, whose release reaches the ranks of other islands through the barrier across.
// The registered form: every rank's input from `ins` (its own tensors), and nothing read
// when `ok` is clear.
template <typename T>
__device__ __forceinline__ void tail(const ArArgs& a, int rank, u64 nvec, const u64* ins, bool ok) {
  if (blockIdx.x != 0 || !ok) return;
  char* out = (char*)a.dst[rank];
  for (u64 e = nvec * T::P + threadIdx.x; e < a.n; e += blockDim.x) {
    float s = 0.f;
    for (int p = 0; p < a.nranks; p++) s += T::load1((const char*)(ins ? ins[p] : a.in[p]), e);
    T::store1(out, e, s);
  }
}

// The two-shot's registered tensors: a.reg's first slot every rank's input, its second every
// rank's output, this rank's own from src and dst; `ok` when both hold this call's generation.
__device__ __forceinline__ void reg_load_both(const ArArgs& a, int rank, u64* ins, u64* outs, u32* ok) {
  const RegSlot* s = (const RegSlot*)a.reg;
  if (threadIdx.x == 0) *ok = a.reg != 0 && s[0].gen == a.reg_gen && s[1].gen == a.reg_gen;
  const int t = (int)threadIdx.x;
  if (t < a.nranks) {
    ins[t] = t == rank ? a.src[rank] : (a.reg != 0 ? s[0].peer[t] : 0);
    outs[t] = t == rank ? a.dst[rank] : (a.reg != 0 ? s[1].peer[t] : 0);
  }
}

// A vector of the type's quiet NaN: what an unregistered rank sends its peers, so no sum
// they make with it looks right.
template <typename T>
__device__ __forceinline__ V4 nan_v4() {
  return V4{T::NAN_WORD, T::NAN_WORD, T::NAN_WORD, T::NAN_WORD};
}

// Overwrites acc with NaN where this rank sends nothing (an unregistered registered form).
template <typename T>
__device__ __forceinline__ void nan_unless(float* acc, bool sends) {
  if (!sends) {
#pragma unroll
    for (int e = 0; e < T::P; e++) acc[e] = __uint_as_float(0x7fc00000u);
  }
}

template <typename T, bool REG>
__device__ void island_two_shot(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  Signal* self = (Signal*)a.sig[rank];
  const u32 flag = self->epoch[blockIdx.x] + 1;
  const Where w = where(a, rank);
  const bool push_in = a.dirs & 1u, push_across = a.dirs & 2u;
  const u64 nvec = a.n / T::P;
  const u64 sv = (nvec + w.m - 1) / w.m;
  const u64 mine = part_len(nvec, sv, w.j);
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const char* in = (const char*)a.src[rank];
  char* out = (char*)a.dst[rank];
  char* shared_out = (char*)a.out[rank];

  __shared__ u64 ins[MAX_RANKS], outs[MAX_RANKS];
  __shared__ u32 ok;
  // Inputs ready (peers read them; staged ones published) and slots free.
  if constexpr (REG) {
    reg_load_both(a, rank, ins, outs, &ok);
    set_barrier<false>(a, rank, w.inside, flag);
  } else if (stage<T>(a, rank, nvec, sv, w.m, !push_in)) {
    set_barrier<true>(a, rank, w.inside, flag);
  } else {
    set_barrier<false>(a, rank, w.inside, flag);
  }
  // Whether this rank reads and writes its peers' tensors (else it sends NaN).
  const bool sends = !REG || ok;
  auto input = [&](int p) { return (const char*)(REG ? ins[p] : a.in[p]); };
  auto output = [&](int p) { return (char*)(REG ? outs[p] : a.out[p]); };
  if (push_in) {
    // Shard q of this rank's input goes to the island peer at place q.
    for (u64 i = first; i < sv; i += stride)
      for (int q = 0; q < w.m; q++)
        if (q != w.j && (u64)q * sv + i < nvec)
          st_v4(inside_slot(a, w, at(a, w, w.k, q), q, w.j) + i * 16,
                sends ? ld_v4(in + ((u64)q * sv + i) * 16) : nan_v4<T>());
    set_barrier<true>(a, rank, w.inside, flag + 1);
  }
  // This rank's shard summed over the island: its partial, kept and (push) sent across.
  for (u64 i = first; i < mine; i += stride) {
    float acc[T::P];
    if (sends) {
      reduce_island<T>(acc, w.m, [&](int q) {
        return q == w.j ? in + ((u64)w.j * sv + i) * 16
               : push_in ? inside_slot(a, w, rank, w.j, q) + i * 16
                         : input(at(a, w, w.k, q)) + ((u64)w.j * sv + i) * 16;
      });
    }
    nan_unless<T>(acc, sends);
    const V4 p = pack_vec<T>(acc);
    st_v4(partial(a, w, rank) + i * 16, p);
    if (push_across)
      for (int q = 0; q < w.islands; q++)
        if (q != w.k) st_v4(across_slot(a, w, at(a, w, q, w.j), q, w.k) + i * 16, p);
  }
  // Partials published (pull) or landed (push).
  set_barrier<true>(a, rank, w.across, flag + 2);
  // The registered form's peers that push write this rank's result straight into the peers'
  // outputs: a block whose rank's status is set (a wait gave up) sends NaN, so no late shard
  // of a failed call lands in a peer's output looking right.
  const bool failed = REG && __syncthreads_or(ld_volatile(&self->status) != 0);
  // The islands' partials summed in island order: this shard of the result.
  for (u64 i = first; i < mine; i += stride) {
    float acc[T::P];
    reduce_island<T>(acc, w.islands, [&](int q) {
      const char* src = q == w.k ? partial(a, w, rank)
                        : push_across ? across_slot(a, w, rank, w.k, q)
                                      : partial(a, w, at(a, w, q, w.j));
      return src + i * 16;
    });
    nan_unless<T>(acc, !failed);
    const V4 r = pack_vec<T>(acc);
    const u64 off = ((u64)w.j * sv + i) * 16;
    st_v4(out + off, r);
    if (push_in) {
      if (sends) {
        for (int q = 0; q < w.m; q++)
          if (q != w.j) st_v4(output(at(a, w, w.k, q)) + off, r);
      }
    } else if (!REG && shared_out != out) {
      st_v4(shared_out + off, r);
    }
  }
  // Results published in the shared outputs (pull) or landed in the peers' (push).
  set_barrier<true>(a, rank, w.inside, flag + 3);
  // The island peers' shards: read from theirs (pull), or copied from ours, where the peers'
  // same block wrote them (push; the registered form's peers wrote them into ours).
  if (sends && (REG ? !push_in : !push_in || shared_out != out)) {
    for (u64 i = first; i < sv; i += stride)
      for (int q = 0; q < w.m; q++)
        if (q != w.j && (u64)q * sv + i < nvec) {
          const u64 off = ((u64)q * sv + i) * 16;
          const char* from = push_in ? shared_out : output(at(a, w, w.k, q));
          st_v4(out + off, ld_v4(from + off));
        }
  }
  tail<T>(a, rank, nvec, REG ? ins : nullptr, sends);
  // Every peer is done reading this rank's input, partial and output.
  set_barrier<false>(a, rank, w.inside | w.across, flag + 4);
  if (threadIdx.x == 0) self->epoch[blockIdx.x] = flag + FLAGS_PER_CALL - 1;
  if constexpr (REG) {
    if (!ok) reg_missed<T>(out, a.n, a.missed);
  }
}

template <typename T, bool REG>
__device__ void island_one_shot(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  Signal* self = (Signal*)a.sig[rank];
  const u32 flag = self->epoch[blockIdx.x] + 1;
  const Where w = where(a, rank);
  const bool push_in = a.dirs & 1u, push_across = a.dirs & 2u;
  const u64 nvec = a.n / T::P;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const char* in = (const char*)a.src[rank];
  char* out = (char*)a.dst[rank];

  __shared__ u64 ins[MAX_RANKS];
  __shared__ u32 ok;
  if constexpr (REG) {
    reg_load(a, rank, a.src[rank], ins, &ok);
    set_barrier<false>(a, rank, w.inside, flag);
  } else if (stage<T>(a, rank, nvec, nvec, 1, !push_in)) {
    set_barrier<true>(a, rank, w.inside, flag);
  } else {
    set_barrier<false>(a, rank, w.inside, flag);
  }
  // Whether this rank reads its peers' inputs (else it sends NaN).
  const bool sends = !REG || ok;
  auto input = [&](int p) { return (const char*)(REG ? ins[p] : a.in[p]); };
  if (push_in) {
    for (u64 v = first; v < nvec; v += stride) {
      const V4 x = sends ? ld_v4(in + v * 16) : nan_v4<T>();
      for (int q = 0; q < w.m; q++)
        if (q != w.j) st_v4(inside_slot(a, w, at(a, w, w.k, q), q, w.j) + v * 16, x);
    }
    set_barrier<true>(a, rank, w.inside, flag + 1);
  }
  // The island's sum: kept and (push) sent to the counterparts.
  for (u64 v = first; v < nvec; v += stride) {
    float acc[T::P];
    if (sends) {
      reduce_island<T>(acc, w.m, [&](int q) {
        const char* src = q == w.j ? in : push_in ? inside_slot(a, w, rank, w.j, q) : input(at(a, w, w.k, q));
        return src + v * 16;
      });
    }
    nan_unless<T>(acc, sends);
    const V4 p = pack_vec<T>(acc);
    st_v4(partial(a, w, rank) + v * 16, p);
    if (push_across)
      for (int q = 0; q < w.islands; q++)
        if (q != w.k) st_v4(across_slot(a, w, at(a, w, q, w.j), q, w.k) + v * 16, p);
  }
  set_barrier<true>(a, rank, w.across, flag + 2);
  for (u64 v = first; v < nvec; v += stride) {
    float acc[T::P];
    reduce_island<T>(acc, w.islands, [&](int q) {
      const char* src = q == w.k ? partial(a, w, rank)
                        : push_across ? across_slot(a, w, rank, w.k, q)
                                      : partial(a, w, at(a, w, q, w.j));
      return src + v * 16;
    });
    st_v4(out + v * 16, pack_vec<T>(acc));
  }
  tail<T>(a, rank, nvec, REG ? ins : nullptr, sends);
  set_barrier<false>(a, rank, w.inside | w.across, flag + 3);
  // Same flags per call as island_two_shot, so each backend's signal area sees one sequence.
  if (threadIdx.x == 0) self->epoch[blockIdx.x] = flag + FLAGS_PER_CALL - 1;
  if constexpr (REG) {
    if (!ok) reg_missed<T>(out, a.n, a.missed);
  }
}

// ---- LL forms, for small messages ----
//
// The phases of island_one_shot and island_two_shot with every 8-byte word sent beside its
// flag (common.cuh, LL lines), so no phase needs a barrier or a fence: a call is one flag
// round trip per phase. Each thread takes one data word of the message (one-shot), or one word
// of the island shard at one place (two-shot: m threads a word), and sums in the order and with
// the roundings of the bandwidth kernel it stands for, so both give the same bits.
//
// Each phase pushes or pulls as a.dirs says, like the bandwidth kernels. Push: the sender
// writes its slot in the receiver's lines (slot: the sender's rank), which the receiver polls
// locally and zeroes once read. Pull: the sender writes a slot of its own lines (the
// receiver's rank where each receiver gets another word, its own rank where all get its
// input or result, n where all get its island's partial) and the others poll it through peer
// memory.
//
// Lines (lli): in each of `stages` stages, two buffers by flag parity of n + 1 slots of `len`
// words. A rank's island peers and its counterparts are different ranks, so the phase inside
// and the phase across share a stage; the two-shot's all-gather, inside again, takes the
// second.
//
// Buffer reuse: word i of every slot is handled by block i / (words per block: LL_THREADS, or
// ll_island_block(m) in the two-shot, fixed for a group as lli's len is), whatever the message
// size, so a line of buffer q written in that block's LL call F is next written in its call
// F + 2. In its call F + 1 the block reads a line that each island peer and each counterpart
// wrote in F + 1: every block has a word (padding included) at every place, and for that word
// it takes every phase from every such peer (one-shot: each thread; two-shot: the thread at
// the rank's own place takes the reduce-scatter and across lines, the thread at each other
// place p the all-gather line of the peer at p). So each of them had begun F + 1 and so
// finished F, where it read (and, pushed, zeroed) the lines of F. A pulled line is only ever
// written by its owner, with the flag of each of its block's calls in turn, so a stale one
// never carries the flag awaited. Pushed and pulled lines of one pair never share a location
// within a call.

// Word i of slot s, stage `stage`, buffer q, in the lines of the rank whose signal allocation
// is `sig`; slots of `len` words.
__device__ __forceinline__ char* lli(u64 sig, int n, u64 len, int stage, u32 q, int s, u64 i) {
  return (char*)sig + LL_OFFSET + ((((u64)stage * 2 + q) * (n + 1) + s) * len + i) * LL_LINE;
}

// Words per slot of the two-shot's lines: an island shard of the largest LL message.
__device__ __forceinline__ u64 ll_island_len(int m) { return (LL1_LINES + m - 1) / m; }

// Island shard words per block of the two-shot's LL form: a thread per place and word
// (kernels.rs ll_blocks mirrors it).
__device__ __forceinline__ u32 ll_island_block(int m) { return LL_THREADS / (u32)m; }

// Waits for the word of each place p != me of `cnt` places (at line(p)) and hands every
// place's word to use(p, word) in place order, `own` at `me`; zeroes the lines read when
// `zero` (pushed lines).
template <typename Line, typename Use>
__device__ __forceinline__ void ll_take(const ArArgs& a, int cnt, int me, u64 own, Line line, bool zero, u32 flag,
                                        u32* status, Use use) {
// Groups of eight places, one after another (not unrolled: the kernels' compile time).
#pragma unroll 1
  for (int g = 0; g < cnt; g += 8) {
    u32 want = 0;
#pragma unroll
    for (int k = 0; k < 8; k++)
      if (g + k < cnt && g + k != me) want |= 1u << k;
    u64 d[8];
    if (ll_wait8(d, want, [&](int k) { return line(g + k < cnt ? g + k : cnt - 1); }, flag, status)) raise_fault(a);
#pragma unroll
    for (int k = 0; k < 8; k++)
      if (g + k < cnt) use(g + k, g + k == me ? own : d[k]);
    if (zero) {
#pragma unroll
      for (int k = 0; k < 8; k++)
        if ((want >> k) & 1) ll_clear(line(g + k));
    }
  }
}

// Where one rank's LL lines are: every argument of lli but the owner, slot and word.
struct Lines {
  const ArArgs* a;
  u64 len;
  int stage;
  u32 q;
  __device__ char* at(int owner, int slot, u64 i) const {
    return lli(a->sig[owner], a->nranks, len, stage, q, slot, i);
  }
};

// One phase in which this rank (at place `me` of `cnt`, rank_at(p) the rank at place p) gives
// the same word `mine` to every other place and hands each place's word to use(p, word) in
// place order (ll_take). `sums`: the words are island partials (pulled from slot n) rather than
// the owner's own words (pulled from the owner's rank's slot).
template <typename At, typename Use>
__device__ __forceinline__ void ll_share(const Lines& l, int rank, Signal* self, int cnt, int me, At rank_at,
                                         bool push, bool sums, u32 flag, u64 i, u64 mine, Use use) {
  const int n = l.a->nranks;
  if (push) {
    for (int p = 0; p < cnt; p++)
      if (p != me) ll_store(l.at(rank_at(p), rank, i), mine, flag);
  } else {
    ll_store(l.at(rank, sums ? n : rank, i), mine, flag);
  }
  ll_take(
      *l.a, cnt, me, mine,
      [&](int p) {
        const int r = rank_at(p);
        return push ? l.at(rank, r, i) : l.at(r, sums ? n : r, i);
      },
      push, flag, &self->status, use);
}

// ll_share, returning the sum over places in order of their words, rounded once.
template <typename T, typename At>
__device__ __forceinline__ u64 ll_sum(const Lines& l, int rank, Signal* self, int cnt, int me, At rank_at,
                                      bool push, bool sums, u32 flag, u64 i, u64 mine) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  ll_share(l, rank, self, cnt, me, rank_at, push, sums, flag, i, mine, [&](int, u64 x) { add_line<T>(acc, x); });
  return pack_line<T>(acc);
}

template <typename T>
__device__ void island_one_shot_ll(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  Signal* self = (Signal*)a.sig[rank];
  if (!ll_launch_ok(self, a.n * T::SIZE, LL1_MAX_BYTES, a.nranks, false)) return;
  const u64 words = ll_words(a.n * T::SIZE);
  const u32 flag = ll_flag(self);
  const Where w = where(a, rank);
  const Lines l{&a, LL1_LINES, 0, flag & 1};
  const u64 j = (u64)blockIdx.x * LL_THREADS + threadIdx.x;
  if (j < words) {
    const u64 mine = load_line<T>((const char*)a.src[rank], j, a.n);
    const u64 part = ll_sum<T>(l, rank, self, w.m, w.j, [&](int p) { return at(a, w, w.k, p); }, a.dirs & 1u,
                               false, flag, j, mine);
    const u64 sum = ll_sum<T>(l, rank, self, w.islands, w.k, [&](int k) { return at(a, w, k, w.j); },
                              a.dirs & 2u, true, flag, j, part);
    store_line<T>((char*)a.dst[rank], j, sum, a.n);
  }
  if (threadIdx.x == 0) self->ll_epoch[blockIdx.x] = flag;
}

// Word i of island shard s: word s * sw + i of the message. Each word of the shard is spread
// over the island's m places, a thread each (ll_island_block words per block; threads past m
// of them idle): the thread at place p != j (j: this rank's) sends word p * sw + i to the peer
// at p and writes that peer's result into the output; the thread at j sums the island's words
// of shard j, sums the partials across, and gives the result to the peers. So the m - 1 sends
// of the reduce-scatter and the m - 1 waits and m output words of the all-gather, which one
// thread per word did in a row, run side by side, and a shard's lines and polls go through m
// times as many multiprocessors.
template <typename T>
__device__ void island_two_shot_ll(const ArArgs& a) {
  const int rank = a.rank_base + (int)blockIdx.y;
  Signal* self = (Signal*)a.sig[rank];
  const u32 per = ll_island_block(a.island);
  if (!ll_launch_ok(self, a.n * T::SIZE, LL1_MAX_BYTES, a.island, true, per)) return;
  const u64 words = ll_words(a.n * T::SIZE);
  const u64 sw = ll_shard((u32)words, a.island);
  const u32 flag = ll_flag(self);
  const Where w = where(a, rank);
  const bool push_in = a.dirs & 1u;
  const u64 len = ll_island_len(w.m);
  const Lines rs{&a, len, 0, flag & 1}, ag{&a, len, 1, flag & 1};
  const int p = (int)(threadIdx.x / per);
  const u64 i = (u64)blockIdx.x * per + threadIdx.x % per;
  if (p < w.m && i < sw) {
    const u64 word = (u64)p * sw + i;
    const u64 x = load_line<T>((const char*)a.src[rank], word, a.n);
    u64 r = 0;
    if (p != w.j) {
      // Reduce-scatter inside: this word to the peer at place p (pulled: from the slot of this
      // rank's lines for that peer); then all-gather: that peer's result for it.
      const int peer = at(a, w, w.k, p);
      ll_store(push_in ? rs.at(peer, rank, i) : rs.at(rank, peer, i), x, flag);
      auto line = [&](int) { return push_in ? ag.at(rank, peer, i) : ag.at(peer, peer, i); };
      ll_take(a, 1, -1, 0, line, push_in, flag, &self->status, [&](int, u64 y) { r = y; });
    } else {
      // The island's words of shard j in place order, then the islands' partials in island
      // order: this rank's result for word i, given to every island peer.
      auto inside = [&](int q) { return at(a, w, w.k, q); };
      auto line = [&](int q) { return push_in ? rs.at(rank, inside(q), i) : rs.at(inside(q), rank, i); };
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      ll_take(a, w.m, w.j, x, line, push_in, flag, &self->status, [&](int, u64 y) { add_line<T>(acc, y); });
      auto across = [&](int k) { return at(a, w, k, w.j); };
      r = ll_sum<T>(rs, rank, self, w.islands, w.k, across, a.dirs & 2u, true, flag, i, pack_line<T>(acc));
      if (push_in) {
        for (int q = 0; q < w.m; q++)
          if (q != w.j) ll_store(ag.at(inside(q), rank, i), r, flag);
      } else {
        ll_store(ag.at(rank, rank, i), r, flag);
      }
    }
    if (word < words) store_line<T>((char*)a.dst[rank], word, r, a.n);
  }
  // Threads of a block wait on different peers, so one may finish before another has read
  // this call's flag from the epoch that thread 0 moves on here.
  __syncthreads();
  if (threadIdx.x == 0) self->ll_epoch[blockIdx.x] = flag;
}

#define ISLAND_TWO_SHOT_KERNELS(T, suffix)                                                                \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) island_two_shot_reg_##suffix(const ArArgs a) { \
    pdl_wait();                                                                                           \
    island_two_shot<T, true>(a);                                                                          \
    pdl_trigger();                                                                                        \
    fail_safe<T>(a);                                                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) island_two_shot_##suffix(const ArArgs a) {     \
    pdl_wait();                                                                                           \
    island_two_shot<T, false>(a);                                                                         \
    pdl_trigger();                                                                                        \
    fail_safe<T>(a);                                                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(LL_THREADS) island_two_shot_ll_##suffix(const ArArgs a) {  \
    pdl_wait();                                                                                           \
    island_two_shot_ll<T>(a);                                                                             \
    pdl_trigger();                                                                                        \
    fail_safe<T>(a);                                                                                      \
  }

#define ISLAND_ONE_SHOT_KERNELS(T, suffix)                                                                \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) island_one_shot_reg_##suffix(const ArArgs a) { \
    pdl_wait();                                                                                           \
    island_one_shot<T, true>(a);                                                                          \
    pdl_trigger();                                                                                        \
    fail_safe<T>(a);                                                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) island_one_shot_##suffix(const ArArgs a) {     \
    pdl_wait();                                                                                           \
    island_one_shot<T, false>(a);                                                                         \
    pdl_trigger();                                                                                        \
    fail_safe<T>(a);                                                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(LL_THREADS) island_one_shot_ll_##suffix(const ArArgs a) {  \
    pdl_wait();                                                                                           \
    island_one_shot_ll<T>(a);                                                                             \
    pdl_trigger();                                                                                        \
    fail_safe<T>(a);                                                                                      \
  }

ISLAND_TWO_SHOT_KERNELS(Bf16, bf16)
ISLAND_TWO_SHOT_KERNELS(Fp16, fp16)
ISLAND_TWO_SHOT_KERNELS(Fp32, fp32)
ISLAND_ONE_SHOT_KERNELS(Bf16, bf16)
ISLAND_ONE_SHOT_KERNELS(Fp16, fp16)
ISLAND_ONE_SHOT_KERNELS(Fp32, fp32)
