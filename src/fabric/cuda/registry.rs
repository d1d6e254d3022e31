//! The registered form inside an engine (graph mode, as vLLM's and SGLang's custom allreduce
//! run CUDA graphs): under capture the op records each call's tensor that peers touch (its
//! input, which peers read, or its output, which two-stage push's peers write); after capture
//! one collective call exchanges the IPC handles of the allocations holding them (with the
//! offsets) and fills each captured call's slot with its peers' tensors, so replays reach the
//! peers' tensors where they lie, with nothing staged. A slot carries the generation its call
//! was captured in; a replay whose slot holds another one (not registered yet, or dropped)
//! reads no peer address and leaves its output NaN (kernels/common.cuh, RegSlot).
//!
//! [`Book`] is the bookkeeping, with no CUDA in it; [`Registry`] holds it with the slot table
//! in device memory and the peers' allocations it opened.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{dev, Ctx, DevBuf, HostWord, Imported, IpcHandle};
use super::kernels::Registered;
use super::layout::{RegSlot, MAX_RANKS};
use crate::allreduce::memory;
use crate::fabric::FabricError;

/// Calls one op can have captured and not dropped: as many slots as fill the graph table the
/// memory model counts for every custom backend ([`memory::GRAPH_TABLE_BYTES`], 3 MiB: 23 130
/// slots; vLLM's 8 MiB buffer of 8-pointer slots holds 16 384), so the profile's memory counts
/// what registration holds. Decode graphs of 67 batch sizes x 2 allreduces x 80 layers fit
/// even where every call is an island two-shot past its LL form, which takes two slots.
pub const SLOTS: usize = memory::GRAPH_TABLE_BYTES as usize / RegSlot::BYTES;
const _: () = assert!(
    SLOTS >= 67 * 2 * 80 * 2,
    "a decode engine's captured calls fit"
);

/// Why a call cannot be recorded or the group's recordings cannot be registered.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum RegError {
    #[error("{SLOTS} captured allreduce tensors (a slot each) are registered or waiting for registration, the most artune keeps; call unregister_graph_buffers() before capturing more")]
    Full,
    #[error("rank {rank} recorded {theirs} captured allreduce tensors (a slot each) since the last registration and this rank {mine}; every rank must capture the same graphs before register_graph_buffers()")]
    Count {
        rank: usize,
        theirs: usize,
        mine: usize,
    },
    #[error("{0} ranks' recordings for a group of {1}")]
    Ranks(usize, usize),
}

/// One slot of a captured call: this rank's registered tensor (its input, or its output
/// where peers reach outputs; the island two-shot has a slot of each) and its length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    pub tensor: u64,
    pub bytes: u64,
    pub gen: u32,
    /// The call's first slot (a call of two tensors has a second).
    pub first: bool,
}

/// Which slot each captured call has, which are registered, and the generation new captures
/// get. Slot i holds record i; a reset starts again at slot 0 with a new generation, so no
/// graph captured before it ever matches a slot registered after.
#[derive(Debug)]
pub struct Book {
    gen: u32,
    records: Vec<Record>,
    registered: usize,
}

impl Default for Book {
    fn default() -> Self {
        Book {
            gen: 1,
            records: Vec::new(),
            registered: 0,
        }
    }
}

impl Book {
    /// Consecutive slots for a call being captured, one per tensor its peers reach (in the
    /// order its kernel reads the slots: kernels::RegTensors), all or none: the first one's
    /// index and the generation they must hold.
    pub fn record(&mut self, tensors: &[u64], bytes: u64) -> Result<(usize, u32), RegError> {
        if tensors.is_empty() || self.records.len() + tensors.len() > SLOTS {
            return Err(RegError::Full);
        }
        let first = self.records.len();
        self.records
            .extend(tensors.iter().enumerate().map(|(i, &tensor)| Record {
                tensor,
                bytes,
                gen: self.gen,
                first: i == 0,
            }));
        Ok((first, self.gen))
    }

    /// The calls captured since the last registration, from slot [`Book::first_pending`].
    pub fn pending(&self) -> &[Record] {
        &self.records[self.registered..]
    }

    pub fn first_pending(&self) -> usize {
        self.registered
    }

    /// Calls registered, whose replays reach their peers' tensors.
    pub fn registered(&self) -> usize {
        calls(&self.records[..self.registered])
    }

    /// Calls captured and waiting for registration.
    pub fn pending_calls(&self) -> usize {
        calls(self.pending())
    }

    /// The slots of the pending calls: `peers[r][i]` is where rank r's tensor of pending call
    /// i lies as this rank maps it (this rank's own entry is ignored: its tensor is its own).
    /// Every rank must have recorded as many calls.
    pub fn fill(&self, rank: usize, peers: &[Vec<u64>]) -> Result<Vec<RegSlot>, RegError> {
        let pending = self.pending();
        if peers.len() > MAX_RANKS || rank >= peers.len() {
            return Err(RegError::Ranks(peers.len(), rank + 1));
        }
        if let Some((r, p)) = peers
            .iter()
            .enumerate()
            .find(|(_, p)| p.len() != pending.len())
        {
            return Err(RegError::Count {
                rank: r,
                theirs: p.len(),
                mine: pending.len(),
            });
        }
        Ok(pending
            .iter()
            .enumerate()
            .map(|(i, rec)| {
                let mut s = RegSlot {
                    gen: rec.gen,
                    ..RegSlot::default()
                };
                for (r, p) in peers.iter().enumerate() {
                    s.peer[r] = if r == rank { rec.tensor } else { p[i] };
                }
                s
            })
            .collect())
    }

    /// The pending calls are registered now.
    pub fn mark_registered(&mut self) {
        self.registered = self.records.len();
    }

    /// Forgets every call: the slots of graphs captured so far stop matching (their replays
    /// return NaN), and new captures start at slot 0 with a generation none of them had.
    pub fn reset(&mut self) {
        self.records.clear();
        self.registered = 0;
        self.gen = self.gen.wrapping_add(1).max(1);
    }
}

/// The calls whose slots `records` are.
fn calls(records: &[Record]) -> usize {
    records.iter().filter(|r| r.first).count()
}

/// What a rank publishes for one captured call: the IPC handle of the allocation holding its
/// tensor (cuMemGetAddressRange's base) and where the tensor starts in it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Published {
    pub handle: IpcHandle,
    pub offset: u64,
}

/// One rank's registrations: the bookkeeping, the slot table the kernels read, the host word
/// they set on a replay that found its slot unregistered, and the peers' allocations opened.
pub struct Registry {
    pub book: Book,
    table: DevBuf,
    missed: HostWord,
    opened: HashMap<String, Imported>,
}

impl Registry {
    pub fn alloc(ctx: &Arc<Ctx>) -> Result<Registry, FabricError> {
        let table = dev(
            DevBuf::alloc(ctx, SLOTS * RegSlot::BYTES),
            "allocating the registered calls' slots",
        )?;
        dev(table.fill(0), "clearing the registered calls' slots")?;
        let missed = dev(
            HostWord::alloc(ctx),
            "allocating the registration word in pinned host memory",
        )?;
        Ok(Registry {
            book: Book::default(),
            table,
            missed,
            opened: HashMap::new(),
        })
    }

    /// Device bytes the registrations hold: the slot table (peers' allocations opened add
    /// address space, not memory).
    pub fn bytes(&self) -> u64 {
        self.table.bytes() as u64
    }

    /// Records a call being captured (`tensors`: what its peers read or write, as
    /// [`Book::record`]) and returns its registered form.
    pub fn record(&mut self, tensors: &[u64], bytes: u64) -> Result<Registered, RegError> {
        let (slot, gen) = self.book.record(tensors, bytes)?;
        Ok(Registered {
            slot: self.table.ptr() + (slot * RegSlot::BYTES) as u64,
            gen,
            missed: self.missed.device_ptr(),
        })
    }

    /// Whether a replay found its slot unregistered since the last [`Registry::clear_missed`].
    pub fn missed(&self) -> bool {
        self.missed.get() != 0
    }

    pub fn clear_missed(&self) {
        self.missed.clear()
    }

    /// The handles of the allocations holding the pending calls' tensors, with offsets.
    pub fn publish(&self, ctx: &Arc<Ctx>) -> Result<Vec<Published>, FabricError> {
        dev(ctx.bind_to_thread(), "binding the CUDA context")?;
        let mut seen: HashMap<u64, IpcHandle> = HashMap::new();
        let mut out = Vec::new();
        for rec in self.book.pending() {
            let (mut base, mut size) = (0, 0usize);
            // SAFETY: out-pointers valid; the tensor is a live device address of this context
            // (the engine keeps its captured graph's memory).
            dev(
                unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, rec.tensor).result() },
                "finding the allocation that holds a captured tensor",
            )?;
            let handle = match seen.get(&base) {
                Some(h) => h.clone(),
                None => {
                    let h = dev(
                        super::driver::export_base(base, size),
                        "exporting a captured tensor's allocation (cuIpcGetMemHandle; torch's expandable segments cannot be shared)",
                    )?;
                    seen.insert(base, h.clone());
                    h
                }
            };
            out.push(Published {
                handle,
                offset: rec.tensor - base,
            });
        }
        Ok(out)
    }

    /// Opens every peer's published allocations and fills the pending calls' slots: from now
    /// on their replays reach the peers' tensors. `all[r]` is rank r's [`Registry::publish`].
    pub fn register(
        &mut self,
        ctx: &Arc<Ctx>,
        rank: usize,
        all: &[Vec<Published>],
    ) -> Result<usize, String> {
        let pending = self.book.pending().to_vec();
        let mut peers = Vec::new();
        for (r, theirs) in all.iter().enumerate() {
            if r == rank || theirs.len() != pending.len() {
                peers.push(vec![0; theirs.len()]);
                continue;
            }
            let mut at = Vec::new();
            for (p, rec) in theirs.iter().zip(&pending) {
                if p.offset.saturating_add(rec.bytes) > p.handle.bytes {
                    return Err(format!(
                        "rank {r}'s captured tensor ends past the allocation it published"
                    ));
                }
                let base = match self.opened.get(&p.handle.hex) {
                    Some(i) => i.span().ptr(),
                    None => {
                        let i = Imported::open(ctx, &p.handle).map_err(|e| {
                            format!("rank {r}'s captured tensor could not be opened ({e})")
                        })?;
                        let b = i.span().ptr();
                        self.opened.insert(p.handle.hex.clone(), i);
                        b
                    }
                };
                at.push(base + p.offset);
            }
            peers.push(at);
        }
        let slots = self.book.fill(rank, &peers).map_err(|e| e.to_string())?;
        let bytes: Vec<u8> = slots.iter().flat_map(|s| s.to_bytes()).collect();
        dev(ctx.bind_to_thread(), "binding the CUDA context").map_err(|e| e.to_string())?;
        self.table
            .upload(self.book.first_pending() * RegSlot::BYTES, &bytes)
            .map_err(|e| format!("writing the registered calls' slots failed: {e}"))?;
        let registered = self.book.pending_calls();
        self.book.mark_registered();
        Ok(registered)
    }

    /// Drops every registration: replays of graphs captured so far return NaN from here on.
    /// The caller has drained the work that may read the slots or the peers' allocations.
    pub fn reset(&mut self) -> Result<(), FabricError> {
        dev(self.table.fill(0), "clearing the registered calls' slots")?;
        self.opened.clear();
        self.book.reset();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_calls_get_slots_in_order_with_the_capture_generation() {
        let mut b = Book::default();
        assert_eq!(b.record(&[0x1000], 64), Ok((0, 1)));
        assert_eq!(b.record(&[0x2000], 64), Ok((1, 1)));
        assert_eq!(b.pending().len(), 2);
        b.mark_registered();
        assert!(b.pending().is_empty());
        assert_eq!(b.record(&[0x3000], 64), Ok((2, 1)));
        assert_eq!(b.first_pending(), 2);
    }

    /// The island two-shot's registered form reads two slots from its one (island.cu,
    /// reg_load_both): every rank's input, then every rank's output.
    #[test]
    fn a_call_of_two_tensors_gets_two_consecutive_slots_or_none() {
        let mut b = Book::default();
        assert_eq!(b.record(&[0xa0, 0xc0], 64), Ok((0, 1)));
        assert_eq!(b.record(&[0xb0], 64), Ok((2, 1)));
        // Three slots, two calls.
        assert_eq!((b.pending().len(), b.pending_calls()), (3, 2));
        let peers = vec![vec![0x10, 0x11, 0x20], vec![0; 3]];
        let s = b.fill(1, &peers).unwrap();
        // The rank's own input, then its own output, each beside the peer's same tensor.
        assert_eq!(s[0].peer[..2], [0x10, 0xa0]);
        assert_eq!(s[1].peer[..2], [0x11, 0xc0]);
        assert_eq!(s[2].peer[..2], [0x20, 0xb0]);
        b.mark_registered();
        assert_eq!((b.registered(), b.pending_calls()), (2, 0));
        // With one slot left, a call of two records nothing.
        let mut full = Book::default();
        for i in 0..SLOTS - 1 {
            full.record(&[i as u64 * 16 + 16], 16).unwrap();
        }
        assert_eq!(full.record(&[0x10, 0x20], 16), Err(RegError::Full));
        assert_eq!(full.pending().len(), SLOTS - 1);
        assert_eq!(full.record(&[0x10], 16), Ok((SLOTS - 1, 1)));
    }

    #[test]
    fn a_slot_holds_each_peers_input_and_the_rank_its_own() {
        let mut b = Book::default();
        b.record(&[0xa0], 64).unwrap();
        b.record(&[0xb0], 64).unwrap();
        let peers = vec![vec![0x10, 0x20], vec![0, 0], vec![0x30, 0x40]];
        let s = b.fill(1, &peers).unwrap();
        assert_eq!(s[0].peer[..3], [0x10, 0xa0, 0x30]);
        assert_eq!(s[1].peer[..3], [0x20, 0xb0, 0x40]);
        assert!(s.iter().all(|s| s.gen == 1));
    }

    #[test]
    fn ranks_that_captured_different_calls_are_refused() {
        let mut b = Book::default();
        b.record(&[0xa0], 64).unwrap();
        let e = b.fill(0, &[vec![0], vec![1, 2]]).unwrap_err();
        assert_eq!(
            e,
            RegError::Count {
                rank: 1,
                theirs: 2,
                mine: 1
            }
        );
        assert!(e.to_string().contains("register_graph_buffers()"), "{e}");
    }

    #[test]
    fn after_a_reset_no_earlier_capture_matches_a_new_slot() {
        let mut b = Book::default();
        let (slot, old) = b.record(&[0xa0], 64).unwrap();
        b.mark_registered();
        b.reset();
        let (again, new) = b.record(&[0xa0], 64).unwrap();
        assert_eq!(slot, again);
        assert_ne!(old, new);
        let s = b.fill(0, &[vec![0]]).unwrap();
        assert_eq!(s[0].gen, new);
        // Zeroed slots (never registered) match no generation a capture gets.
        assert_ne!(new, 0);
    }

    #[test]
    fn the_table_has_a_limit() {
        let mut b = Book::default();
        for i in 0..SLOTS as u64 {
            b.record(&[i], 1).unwrap();
        }
        assert_eq!(b.record(&[0], 1), Err(RegError::Full));
    }
}
