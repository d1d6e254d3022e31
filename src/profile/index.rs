//! A flat copy of what [`Profile::select`] reads, built once per profile on first use: each
//! group's sizes in one contiguous array and its answers precomputed, so a lookup is a short
//! scan over groups and one binary search over `u64`s — no maps, no pointer chasing.

use std::sync::OnceLock;

use super::{Profile, Query, Selection, UnknownReason};
use crate::allreduce::{Backend, Mode};

/// The lazily built index. Equality ignores it: it is a cache of the rest of the profile.
#[derive(Debug, Clone, Default)]
pub struct SelectIndex(OnceLock<Index>);

impl PartialEq for SelectIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

#[derive(Debug, Clone, Default)]
struct Index {
    groups: Vec<GroupIndex>,
}

#[derive(Debug, Clone)]
struct GroupIndex {
    tp: usize,
    mode: Mode,
    /// Index into `Profile::groups`.
    group: usize,
    /// The group a query without GPUs gets for this (tp, mode).
    default: bool,
    bytes: Vec<u64>,
    answers: Vec<Answer>,
}

#[derive(Debug, Clone, Copy)]
struct Answer {
    backend: Backend,
    expected_us: f64,
    buffer_bytes: u64,
}

impl Index {
    fn build(p: &Profile) -> Index {
        let groups = p
            .groups
            .iter()
            .enumerate()
            .map(|(gi, g)| {
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
                GroupIndex {
                    tp: g.tp,
                    mode: g.mode,
                    group: gi,
                    default,
                    bytes: g.buckets.iter().map(|b| b.bytes).collect(),
                    answers,
                }
            })
            .collect();
        Index { groups }
    }
}

impl SelectIndex {
    pub(super) fn select(&self, p: &Profile, q: Query<'_>, bytes: u64) -> Selection {
        let index = self.0.get_or_init(|| Index::build(p));
        let found = index.groups.iter().find(|g| {
            g.tp == q.tp
                && g.mode == q.mode
                && match q.gpus {
                    None => g.default,
                    Some(gpus) => p.groups[g.group].gpus == gpus,
                }
        });
        let Some(g) = found else {
            return Selection::Unknown(UnknownReason::NoGroup);
        };
        let i = g.bytes.partition_point(|&b| b < bytes);
        match g.answers.get(i) {
            Some(a) => Selection::Chosen {
                backend: a.backend,
                expected_us: a.expected_us,
                bucket_bytes: g.bytes[i],
                buffer_bytes: a.buffer_bytes,
            },
            None => Selection::Unknown(UnknownReason::AboveLargestBucket),
        }
    }
}
