//! A copy-engine backend's call as operations: the copies, sums and barriers each rank's stream
//! runs, made from the table row's phases and buffers (allreduce/backend/), so the CUDA
//! executor enqueues them and [`run`] executes them on the host for tests with no GPU.
//!
//! Every copy pulls into the rank's own memory (a peer's copy engine never writes here), so a
//! barrier is needed only where a phase reads what peers produced, and at the end, before the
//! next call overwrites what peers may still be reading.

use crate::allreduce::{memory, Backend, Part, Peers, Ranks};

/// A rank's buffer: its own input and output tensors, the shared input peers copy from, or
/// slot `slot` of the row's scratch entry `entry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    Src,
    Dst,
    Input,
    Scratch { entry: usize, slot: usize },
}

/// Elements of one rank's buffer, from `offset` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    pub rank: usize,
    pub buf: Buf,
    pub offset: u64,
}

/// One operation of a rank's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `len` elements from `from` (this rank's or a peer's) into `to` (this rank's).
    Copy { from: At, to: At, len: u64 },
    /// The SM kernel: the element-wise sum of `inputs` into `out`, `len` elements.
    Sum { inputs: Vec<At>, out: At, len: u64 },
    /// Every rank of this rank's set of `peers` has reached here.
    Barrier(Peers),
}

/// Where a rank's share of a phase lies: its index among the phase's parts and their size.
fn share(part: Part, elems: u64, ranks: Ranks, rank: usize) -> (u64, u64) {
    let (parts, index) = match part {
        Part::Message => (1, 0),
        Part::Shard => (ranks.n, rank),
        Part::IslandShard => (ranks.island, rank % ranks.island.max(1)),
    };
    let size = elems.div_ceil(parts.max(1) as u64);
    let start = (index as u64 * size).min(elems);
    (start, (start + size).min(elems) - start)
}

/// The ranks of `rank`'s set of `peers`, from the next one on (the staggered order the
/// simulator prices: the k-th copy from the peer k places on). Ranks are numbered island by
/// island: island `rank / island`, place `rank % island`.
pub(crate) fn peers_of(peers: Peers, ranks: Ranks, rank: usize) -> Vec<usize> {
    let m = ranks.island.max(1);
    let (i, j, c) = (rank / m, rank % m, ranks.n / m);
    match peers {
        Peers::All => (1..ranks.n).map(|k| (rank + k) % ranks.n).collect(),
        Peers::Island => (1..m).map(|k| i * m + (j + k) % m).collect(),
        Peers::Counterparts => (1..c).map(|k| ((i + k) % c) * m + j).collect(),
    }
}

/// What a rank holds between phases: the whole message in a buffer, or its share of a part.
#[derive(Debug, Clone, Copy)]
struct Held {
    buf: Buf,
    part: Part,
}

/// Each rank's operations for one call of copy-engine backend `backend` of `elems` elements
/// over `ranks`; empty lists for a backend without phases.
pub fn plan(backend: Backend, ranks: Ranks, elems: u64) -> Vec<Vec<Op>> {
    (0..ranks.n)
        .map(|r| rank_plan(backend, ranks, elems, r))
        .collect()
}

fn rank_plan(backend: Backend, ranks: Ranks, elems: u64, r: usize) -> Vec<Op> {
    let phases = backend.phases();
    let Some(first) = phases.first() else {
        return Vec::new();
    };
    let at = |rank, buf, offset| At { rank, buf, offset };
    let mut ops = vec![
        Op::Copy {
            from: at(r, Buf::Src, 0),
            to: at(r, Buf::Input, 0),
            len: elems,
        },
        Op::Barrier(first.peers),
    ];
    let mut held = Held {
        buf: Buf::Input,
        part: Part::Message,
    };
    let mut entry = 0;
    for (i, ph) in phases.iter().enumerate() {
        if i > 0 {
            ops.push(Op::Barrier(ph.peers));
        }
        let peers = peers_of(ph.peers, ranks, r);
        if ph.reduces {
            // Each peer's copy of this rank's share: a slice of the whole message it holds,
            // or all of what it holds where it already holds this rank's part.
            let (start, len) = share(ph.part, elems, ranks, r);
            let from = |p| match held.part == ph.part {
                true => at(p, held.buf, 0),
                false => at(p, held.buf, start),
            };
            let slot = |k| Buf::Scratch { entry, slot: k };
            for (k, &p) in peers.iter().enumerate() {
                ops.push(Op::Copy {
                    from: from(p),
                    to: at(r, slot(k), 0),
                    len,
                });
            }
            let mut inputs = vec![from(r)];
            inputs.extend((0..peers.len()).map(|k| at(r, slot(k), 0)));
            let out = Buf::Scratch {
                entry: entry + 1,
                slot: 0,
            };
            ops.push(Op::Sum {
                inputs,
                out: at(r, out, 0),
                len,
            });
            held = Held {
                buf: out,
                part: ph.part,
            };
            entry += 2;
        } else {
            // A gather: each peer's share, and this rank's own, into the output.
            for &p in peers.iter().chain([&r]) {
                let (start, len) = share(held.part, elems, ranks, p);
                ops.push(Op::Copy {
                    from: at(p, held.buf, 0),
                    to: at(r, Buf::Dst, start),
                    len,
                });
            }
            held = Held {
                buf: Buf::Dst,
                part: Part::Message,
            };
        }
    }
    if held.buf != Buf::Dst {
        ops.push(Op::Copy {
            from: at(r, held.buf, 0),
            to: at(r, Buf::Dst, 0),
            len: elems,
        });
    }
    // Peers done reading this rank's buffers before the next call refills them.
    ops.push(Op::Barrier(Peers::All));
    ops.retain(|op| !matches!(op, Op::Copy { len: 0, .. } | Op::Sum { len: 0, .. }));
    ops
}

/// Elements one rank's buffer holds for messages of up to `elems` elements: what the memory
/// model counts (memory.rs) and the CUDA fabric allocates.
pub fn capacity(backend: Backend, ranks: Ranks, elems: u64, buf: Buf) -> u64 {
    let b = backend.spec().buffers;
    match buf {
        Buf::Src | Buf::Dst => elems,
        Buf::Input if b.is_some_and(|b| b.input) => elems,
        Buf::Input => 0,
        Buf::Scratch { entry, slot } => match b.and_then(|b| b.scratch.get(entry).copied()) {
            Some((count, extent)) if (slot as u64) < memory::count(count, ranks) => {
                memory::extent_bytes(extent, ranks, elems)
            }
            _ => 0,
        },
    }
}

/// Runs `plan` on the host over every rank's input (`inputs[r]`), rank by rank up to each
/// barrier, as the barriers order the ranks' streams; returns each rank's output, or why an
/// operation reaches outside its buffer.
pub fn run(
    backend: Backend,
    ranks: Ranks,
    plan: &[Vec<Op>],
    inputs: &[Vec<f32>],
) -> Result<Vec<Vec<f32>>, String> {
    use std::collections::HashMap;
    let elems = inputs.first().map_or(0, |v| v.len() as u64);
    let mut mem: HashMap<(usize, Buf), Vec<f32>> = HashMap::new();
    let buf = |mem: &mut HashMap<(usize, Buf), Vec<f32>>, a: At, len: u64| {
        let cap = capacity(backend, ranks, elems, a.buf);
        if a.offset + len > cap {
            return Err(format!(
                "rank {} reaches {:?} up to element {} of {cap}",
                a.rank,
                a.buf,
                a.offset + len
            ));
        }
        let v = mem.entry((a.rank, a.buf)).or_insert_with(|| match a.buf {
            Buf::Src => inputs[a.rank].clone(),
            _ => vec![f32::NAN; cap as usize],
        });
        Ok(v[a.offset as usize..(a.offset + len) as usize].to_vec())
    };
    let mut pos = vec![0usize; plan.len()];
    loop {
        let mut moved = false;
        for (r, ops) in plan.iter().enumerate() {
            while let Some(op) = ops.get(pos[r]) {
                pos[r] += 1;
                moved = true;
                let (to, data) = match op {
                    Op::Barrier(_) => break,
                    Op::Copy { from, to, len } => (*to, buf(&mut mem, *from, *len)?),
                    Op::Sum { inputs, out, len } => {
                        let mut acc = vec![0.0f32; *len as usize];
                        for i in inputs {
                            for (a, x) in acc.iter_mut().zip(buf(&mut mem, *i, *len)?) {
                                *a += x;
                            }
                        }
                        (*out, acc)
                    }
                };
                buf(&mut mem, to, data.len() as u64)?;
                let v = mem.get_mut(&(to.rank, to.buf)).expect("made above");
                v[to.offset as usize..to.offset as usize + data.len()].copy_from_slice(&data);
            }
        }
        if !moved {
            break;
        }
    }
    Ok((0..plan.len())
        .map(|r| {
            mem.remove(&(r, Buf::Dst))
                .unwrap_or_else(|| vec![f32::NAN; elems as usize])
        })
        .collect())
}

#[cfg(test)]
pub(super) mod tests;
