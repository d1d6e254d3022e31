//! A copy plan (copy_plan/) as the calls one stream runs: device addresses for every copy and
//! sum, and the stream memory operations on IPC-mapped flags that stand for each barrier.
//! Pure data, so the host tests execute it on a model of several streams.
//!
//! A barrier is NCCL's copy-engine sync (src/ce_coll.cc, the unicast form): each rank copies a
//! word holding [`ARRIVED`] into its slot of every peer's inbox for that barrier, then waits
//! until each peer's slot of its own inbox equals it and clears the slot. The values never
//! change from call to call, so a CUDA graph replays them as captured; each barrier of a call
//! has its own inbox, and a peer reaches a barrier's inbox again only after the next call's
//! earlier barriers, which this rank passes after clearing it.
//!
//! Every call ends with a guard on each rank: its output NaN where its status word is set (a
//! wait of the group was released from the host, see super::watch), so a released call never
//! returns a sum made of a stale peer's shard.

use thiserror::Error;

use super::super::copy_plan::{peers_of, At, Buf, Op};
use super::super::layout::{MAX_RANKS, SIGNAL_STATUS_OFFSET};
use crate::allreduce::{Peers, Ranks};

/// Most barriers one call may hold (a phase each, and the last).
pub const BARRIERS: usize = 8;
/// The value a peer's arrival writes into an inbox slot.
pub const ARRIVED: u32 = 1;
/// Offset in a rank's signal allocation of the word holding [`ARRIVED`], the source of the
/// copies that signal peers (written at the start of every call).
pub const ONE: u64 = (BARRIERS * MAX_RANKS * 4) as u64;

const _: () = assert!(ONE as usize + 4 <= SIGNAL_STATUS_OFFSET);

/// A rank's inboxes with every slot holding [`ARRIVED`]: what the host writes over them to
/// let a stream past a peer that never arrives.
pub fn released() -> Vec<u8> {
    ARRIVED.to_le_bytes().repeat(ONE as usize / 4)
}

/// Offset in a rank's signal allocation of the slot peer `from` writes at `barrier`.
pub fn inbox(barrier: usize, from: usize) -> u64 {
    ((barrier * MAX_RANKS + from) * 4) as u64
}

/// One call a stream runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A copy-engine copy (cuMemcpyDtoDAsync).
    Copy { dst: u64, src: u64, bytes: u64 },
    /// The SM sum (kernels/ce_sum.cu): `elems` elements of every input added into `out`.
    Sum {
        inputs: Vec<u64>,
        out: u64,
        elems: u64,
    },
    /// Waits until the word at `addr` equals `value` (cuStreamWaitValue32, EQ).
    WaitEq { addr: u64, value: u32 },
    /// Writes `value` to the word at `addr` (cuStreamWriteValue32).
    Write { addr: u64, value: u32 },
    /// The sum kernel with no inputs: where the word at `status` is not 0, `elems` elements
    /// at `out` become NaN (and the host's fault word is set).
    Guard { status: u64, out: u64, elems: u64 },
}

/// Where every rank's buffers of one copy-engine backend lie in this process.
#[derive(Debug, Clone)]
pub struct Addrs {
    pub src: Vec<u64>,
    pub dst: Vec<u64>,
    pub input: Vec<u64>,
    pub scratch: Vec<u64>,
    pub sig: Vec<u64>,
    /// (start, slots, slot bytes) of each scratch entry (`kernels::scratch_entries`).
    pub entries: Vec<(u64, u64, u64)>,
    /// Bytes of one element.
    pub elem: u64,
}

/// Why a plan cannot be turned into a stream's calls.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StepError {
    #[error("a call of {0} barriers is more than the {BARRIERS} the flags have room for")]
    TooManyBarriers(usize),
    #[error("a sum of {0} buffers is more than the {MAX_RANKS} the sum kernel takes")]
    TooManyInputs(usize),
    #[error("rank {rank}'s {buf:?} is not mapped in this process")]
    Unmapped { rank: usize, buf: Buf },
    #[error("rank {0}'s flags are not mapped in this process")]
    NoFlags(usize),
    #[error("ranks {0} and {1} pass different barriers")]
    Barriers(usize, usize),
}

impl Addrs {
    fn addr(&self, at: At) -> Result<u64, StepError> {
        let unmapped = StepError::Unmapped {
            rank: at.rank,
            buf: at.buf,
        };
        let of = |v: &Vec<u64>| v.get(at.rank).copied().filter(|&a| a != 0);
        let base = match at.buf {
            Buf::Src => of(&self.src),
            Buf::Dst => of(&self.dst),
            Buf::Input => of(&self.input),
            Buf::Scratch { entry, slot } => match self.entries.get(entry) {
                Some(&(start, slots, bytes)) if (slot as u64) < slots => {
                    of(&self.scratch).map(|s| s + start + slot as u64 * bytes)
                }
                _ => None,
            },
        };
        Ok(base.ok_or(unmapped)? + at.offset * self.elem)
    }

    fn sig(&self, rank: usize) -> Result<u64, StepError> {
        self.sig
            .get(rank)
            .copied()
            .filter(|&a| a != 0)
            .ok_or(StepError::NoFlags(rank))
    }

    fn step(&self, op: &Op) -> Result<Option<Step>, StepError> {
        Ok(Some(match op {
            Op::Barrier(_) => return Ok(None),
            Op::Copy { from, to, len } => Step::Copy {
                dst: self.addr(*to)?,
                src: self.addr(*from)?,
                bytes: len * self.elem,
            },
            Op::Sum { inputs, out, len } => {
                if inputs.len() > MAX_RANKS {
                    return Err(StepError::TooManyInputs(inputs.len()));
                }
                Step::Sum {
                    inputs: inputs
                        .iter()
                        .map(|a| self.addr(*a))
                        .collect::<Result<_, _>>()?,
                    out: self.addr(*out)?,
                    elems: *len,
                }
            }
        }))
    }
}

/// A rank's operations cut at its barriers: the segments before each barrier, the barriers'
/// peers, and what follows the last.
fn cut(ops: &[Op]) -> (Vec<&[Op]>, Vec<Peers>, &[Op]) {
    let (mut segs, mut peers, mut start) = (Vec::new(), Vec::new(), 0);
    for (i, op) in ops.iter().enumerate() {
        if let Op::Barrier(p) = op {
            segs.push(&ops[start..i]);
            peers.push(*p);
            start = i + 1;
        }
    }
    (segs, peers, &ops[start..])
}

/// The calls one stream runs for one call of `plan` (every rank's operations, `elems`
/// elements each) for the ranks `local`, in order: all of their operations up to a barrier,
/// rank by rank, then their signals, then their waits, so ranks sharing the stream never wait
/// for one queued later; last, each rank's guard.
pub fn steps(
    plan: &[Vec<Op>],
    ranks: Ranks,
    elems: u64,
    local: &[usize],
    addrs: &Addrs,
) -> Result<Vec<Step>, StepError> {
    let cuts: Vec<_> = plan.iter().map(|ops| cut(ops)).collect();
    let barriers = cuts.first().map_or(&[][..], |c| &c.1[..]);
    if let Some(r) = cuts.iter().position(|c| c.1 != barriers) {
        return Err(StepError::Barriers(0, r));
    }
    if barriers.len() > BARRIERS {
        return Err(StepError::TooManyBarriers(barriers.len()));
    }
    let mut out = Vec::new();
    for &r in local {
        out.push(Step::Write {
            addr: addrs.sig(r)? + ONE,
            value: ARRIVED,
        });
    }
    for (b, &peers) in barriers.iter().enumerate() {
        for &r in local {
            for op in cuts[r].0[b] {
                out.extend(addrs.step(op)?);
            }
        }
        for &r in local {
            for p in peers_of(peers, ranks, r) {
                out.push(Step::Copy {
                    dst: addrs.sig(p)? + inbox(b, r),
                    src: addrs.sig(r)? + ONE,
                    bytes: 4,
                });
            }
        }
        for &r in local {
            for p in peers_of(peers, ranks, r) {
                let addr = addrs.sig(r)? + inbox(b, p);
                out.push(Step::WaitEq {
                    addr,
                    value: ARRIVED,
                });
                out.push(Step::Write { addr, value: 0 });
            }
        }
    }
    for &r in local {
        for op in cuts[r].2 {
            out.extend(addrs.step(op)?);
        }
    }
    for &r in local {
        let dst = At {
            rank: r,
            buf: Buf::Dst,
            offset: 0,
        };
        out.push(Step::Guard {
            status: addrs.sig(r)? + SIGNAL_STATUS_OFFSET as u64,
            out: addrs.addr(dst)?,
            elems,
        });
    }
    Ok(out)
}

/// What queues a stream's calls: the driver on a GPU, a recorder in tests.
pub trait Enqueue {
    type Error;
    /// # Safety
    /// `dst` and `src` start `bytes` of live device memory that stay alive until it ran.
    unsafe fn copy(&mut self, dst: u64, src: u64, bytes: u64) -> Result<(), Self::Error>;
    /// # Safety
    /// Every input and `out` hold `elems` elements of live device memory, as above.
    unsafe fn sum(&mut self, inputs: &[u64], out: u64, elems: u64) -> Result<(), Self::Error>;
    /// # Safety
    /// `addr` is a live, 4-byte aligned word of device memory, as above.
    unsafe fn wait_eq(&mut self, addr: u64, value: u32) -> Result<(), Self::Error>;
    /// # Safety
    /// As [`Enqueue::wait_eq`].
    unsafe fn write(&mut self, addr: u64, value: u32) -> Result<(), Self::Error>;
    /// # Safety
    /// `status` as [`Enqueue::wait_eq`], `out` as [`Enqueue::sum`].
    unsafe fn guard(&mut self, status: u64, out: u64, elems: u64) -> Result<(), Self::Error>;
}

/// Queues `steps` in order.
///
/// # Safety
/// Every address the steps name lies in memory that stays allocated until the queue's work
/// has run (the buffers [`Addrs`] was made from, each sized for the plan's message).
pub unsafe fn enqueue<Q: Enqueue>(steps: &[Step], q: &mut Q) -> Result<(), Q::Error> {
    for s in steps {
        // SAFETY: the caller's contract covers every address of every step.
        unsafe {
            match s {
                Step::Copy { dst, src, bytes } => q.copy(*dst, *src, *bytes),
                Step::Sum { inputs, out, elems } => q.sum(inputs, *out, *elems),
                Step::WaitEq { addr, value } => q.wait_eq(*addr, *value),
                Step::Write { addr, value } => q.write(*addr, *value),
                Step::Guard { status, out, elems } => q.guard(*status, *out, *elems),
            }
        }?;
    }
    Ok(())
}
