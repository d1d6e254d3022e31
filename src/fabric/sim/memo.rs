//! What a group's model remembers per backend (and mode) and size. Every simulated timing call
//! looks its time up here, so the key's backend and mode pick a row by index and only the row's
//! sizes are searched: no whole keys compared down a tree, no hashing.

use std::marker::PhantomData;

use super::{Backend, Mode};

/// What picks a row: a backend, or a backend in a mode.
pub(super) trait Row: Copy {
    const ROWS: usize;
    fn index(self) -> usize;
    /// The rows of `b`, whatever else the key holds.
    fn of(b: Backend) -> std::ops::Range<usize>;
}

impl Row for Backend {
    const ROWS: usize = Backend::COUNT;
    fn index(self) -> usize {
        self as usize
    }
    fn of(b: Backend) -> std::ops::Range<usize> {
        b as usize..b as usize + 1
    }
}

const MODES: usize = 2;

impl Row for (Backend, Mode) {
    const ROWS: usize = Backend::COUNT * MODES;
    fn index(self) -> usize {
        let mode = match self.1 {
            Mode::Graph => 0,
            Mode::Eager => 1,
        };
        self.0 as usize * MODES + mode
    }
    fn of(b: Backend) -> std::ops::Range<usize> {
        b as usize * MODES..(b as usize + 1) * MODES
    }
}

/// Values per (row key, bytes): each row's sizes kept sorted.
#[derive(Debug, Clone)]
pub(super) struct BySize<K, V> {
    rows: Vec<Vec<(u64, V)>>,
    key: PhantomData<K>,
}

impl<K: Row, V: Copy> BySize<K, V> {
    pub(super) fn new() -> Self {
        BySize {
            rows: vec![Vec::new(); K::ROWS],
            key: PhantomData,
        }
    }

    pub(super) fn get(&self, key: K, bytes: u64) -> Option<V> {
        let row = &self.rows[key.index()];
        let i = row.binary_search_by_key(&bytes, |e| e.0).ok()?;
        Some(row[i].1)
    }

    pub(super) fn insert(&mut self, key: K, bytes: u64, value: V) {
        let row = &mut self.rows[key.index()];
        match row.binary_search_by_key(&bytes, |e| e.0) {
            Ok(i) => row[i].1 = value,
            Err(i) => row.insert(i, (bytes, value)),
        }
    }

    /// Forgets every value of the backends `drop` picks.
    pub(super) fn forget(&mut self, drop: impl Fn(Backend) -> bool) {
        for b in Backend::ALL.into_iter().filter(|&b| drop(b)) {
            for row in K::of(b) {
                self.rows[row].clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_do_not_overlap_and_forgetting_one_backend_keeps_the_rest() {
        let mut m: BySize<(Backend, Mode), f64> = BySize::new();
        for (i, b) in Backend::ALL.into_iter().enumerate() {
            for (j, mode) in [Mode::Graph, Mode::Eager].into_iter().enumerate() {
                for bytes in [4096, 1, 1 << 20] {
                    m.insert((b, mode), bytes, (i * 10 + j) as f64 + bytes as f64);
                }
            }
        }
        let gone = Backend::ALL[3];
        m.forget(|b| b == gone);
        for (i, b) in Backend::ALL.into_iter().enumerate() {
            for (j, mode) in [Mode::Graph, Mode::Eager].into_iter().enumerate() {
                for bytes in [1, 4096, 1 << 20, 2] {
                    let want =
                        (b != gone && bytes != 2).then(|| (i * 10 + j) as f64 + bytes as f64);
                    assert_eq!(m.get((b, mode), bytes), want, "{b:?} {mode:?} {bytes}");
                }
            }
        }
        let mut s: BySize<Backend, (f64, f64)> = BySize::new();
        s.insert(Backend::Nccl, 8, (1.0, 2.0));
        s.insert(Backend::Nccl, 8, (3.0, 4.0));
        assert_eq!(s.get(Backend::Nccl, 8), Some((3.0, 4.0)));
        assert_eq!(s.get(Backend::NcclRingLl, 8), None);
    }
}
