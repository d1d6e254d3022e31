//! The one lookup from a message to a backend: [`Profile::select`], the C ABI and the NCCL
//! plugin all answer through a [`Selector`].
//!
//! Built once from a profile and immutable after, so it cannot go stale against the profile it
//! came from (edit the profile, build a new one). Each group's bucket bounds sit in one
//! contiguous array with its answers precomputed: a lookup is a short scan over groups and one
//! binary search over `u64`s, with no allocation.

use super::{answers_below, Profile, Query, Selection, UnknownReason};
use crate::allreduce::{Backend, Mode};

/// What the profile answers at one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    pub backend: Backend,
    /// The NCCL variant to run where NCCL serves (see `Bucket::nccl_choice`).
    pub nccl: Backend,
    /// What a caller without artune's kernels runs (see `Bucket::fallback`); `backend`
    /// where engines have it.
    pub fallback: Backend,
    /// The channel count to run `nccl` with (see `GroupProfile::pin_channels`), if the profile
    /// states one.
    pub nccl_channels: Option<u32>,
    /// Median time measured for `backend` at the bucket.
    pub expected_us: f64,
    /// Device memory per GPU the backend's buffers need (0 for NCCL, which owns its own).
    pub buffer_bytes: u64,
}

/// One group's buckets, ready for lookup.
#[derive(Debug, Clone)]
pub struct GroupSelector {
    tp: usize,
    mode: Mode,
    gpus: Vec<usize>,
    /// The group a query without GPUs gets for this (tp, mode).
    default: bool,
    bytes: Vec<u64>,
    answers: Vec<Answer>,
}

impl GroupSelector {
    /// The bucket serving `bytes` (its size and answer), or None above the largest and below
    /// the smallest where that does not answer ([`answers_below`]).
    pub fn at(&self, bytes: u64) -> Option<(u64, &Answer)> {
        self.serving(bytes).ok()
    }

    fn serving(&self, bytes: u64) -> Result<(u64, &Answer), UnknownReason> {
        if self
            .bytes
            .first()
            .is_some_and(|&b| !answers_below(b, bytes))
        {
            return Err(UnknownReason::BelowSmallestBucket);
        }
        let i = self.bytes.partition_point(|&b| b < bytes);
        match (self.bytes.get(i), self.answers.get(i)) {
            (Some(&b), Some(a)) => Ok((b, a)),
            _ => Err(UnknownReason::AboveLargestBucket),
        }
    }

    /// The GPUs of the group this answers for.
    pub fn gpus(&self) -> &[usize] {
        &self.gpus
    }

    /// Bucket bounds, ascending.
    pub fn sizes(&self) -> &[u64] {
        &self.bytes
    }

    pub fn answers(&self) -> &[Answer] {
        &self.answers
    }

    pub fn tp(&self) -> usize {
        self.tp
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }
}

/// Every group of a profile, ready for lookup.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    groups: Vec<GroupSelector>,
}

impl Selector {
    pub fn new(p: &Profile) -> Selector {
        let groups = p
            .groups
            .iter()
            .map(|g| {
                let default = p
                    .group(Query {
                        tp: g.tp,
                        mode: g.mode,
                        gpus: None,
                    })
                    .is_some_and(|d| std::ptr::eq(d, g));
                let answers = g
                    .buckets
                    .iter()
                    .map(|b| Answer {
                        backend: b.choice,
                        nccl: b.nccl_choice.unwrap_or(Backend::Nccl),
                        fallback: b.fallback.unwrap_or(b.choice),
                        nccl_channels: g.channels_at(b.bytes),
                        expected_us: b.results.get(&b.choice).map_or(f64::NAN, |t| t.median_us),
                        buffer_bytes: if b.choice.is_custom() {
                            g.memory
                                .get(&b.choice)
                                .map_or(0, |m| m.required_bytes_per_gpu.unwrap_or(m.bytes_per_gpu))
                        } else {
                            0
                        },
                    })
                    .collect();
                GroupSelector {
                    tp: g.tp,
                    mode: g.mode,
                    gpus: g.gpus.clone(),
                    default,
                    bytes: g.buckets.iter().map(|b| b.bytes).collect(),
                    answers,
                }
            })
            .collect();
        Selector { groups }
    }

    /// The group a query is about, with [`Profile::group`]'s placement rule.
    pub fn group(&self, q: Query<'_>) -> Option<&GroupSelector> {
        self.groups.iter().find(|g| {
            g.tp == q.tp
                && g.mode == q.mode
                && match q.gpus {
                    None => g.default,
                    Some(_) => q.names(&g.gpus),
                }
        })
    }

    /// The backend for a message of `bytes` bytes. O(groups + log buckets), no allocation.
    pub fn select(&self, q: Query<'_>, bytes: u64) -> Selection {
        let Some(g) = self.group(q) else {
            return Selection::Unknown(UnknownReason::NoGroup);
        };
        match g.serving(bytes) {
            Ok((bucket_bytes, a)) => Selection::Chosen {
                backend: a.backend,
                nccl: a.nccl,
                fallback: a.fallback,
                expected_us: a.expected_us,
                bucket_bytes,
                buffer_bytes: a.buffer_bytes,
            },
            Err(why) => Selection::Unknown(why),
        }
    }
}
