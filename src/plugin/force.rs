//! A measurement hook: `artune_tuner_force(algo, proto, channels)` makes the tuner favour one
//! NCCL algorithm x protocol (and channel count) for every allreduce of this process, ahead of
//! the profile and of NCCL's own costs, until cleared. artune's K-rank timings (`__nccl-rank`)
//! switch NCCL's variant with it between calls of one communicator instead of starting ranks
//! per `NCCL_ALGO`/`NCCL_PROTO`; the profiler tags what ran with it, so what NCCL did with
//! each switch is read back, not assumed.
//!
//! One atomic word (no lock on NCCL's per-call path, no torn pair while it changes). The user's
//! own pins win as they win over a profile ([`super::UserPins`]).

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Pin;
use crate::allreduce::Backend;

/// What the override asks for: NCCL's cost-table entry and, where set, its channel count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forced {
    pub algo: u8,
    pub proto: u8,
    /// NCCL's `nChannels` for the call; None leaves NCCL's (or the communicator's) count.
    pub channels: Option<u32>,
}

impl Forced {
    /// The override for an NCCL pin (`Backend::nccl_pin`); None for NCCL's own choice.
    pub fn of(variant: Backend, channels: Option<u32>) -> Option<Forced> {
        super::pin_of(variant).map(|p| Forced {
            algo: p.algo,
            proto: p.proto,
            channels,
        })
    }

    /// As the profiler and the audit name it ("RING/LL").
    pub fn name(self) -> String {
        super::audit::pin_name(Pin {
            backend: Backend::Nccl,
            algo: self.algo,
            proto: self.proto,
        })
    }
}

/// Nothing forced.
const NONE: u64 = u64::MAX;

/// One override cell; the library's is [`GLOBAL`], tests make their own.
#[derive(Debug)]
pub struct Force(AtomicU64);

/// The override `artune_tuner_force` sets and every tuner context of this process reads.
pub static GLOBAL: Force = Force::new();

impl Force {
    pub const fn new() -> Force {
        Force(AtomicU64::new(NONE))
    }

    /// Sets (Some) or clears (None) the override.
    pub fn set(&self, f: Option<Forced>) {
        let word = f.map_or(NONE, |f| {
            u64::from(f.algo) | u64::from(f.proto) << 8 | u64::from(f.channels.unwrap_or(0)) << 32
        });
        self.0.store(word, Ordering::SeqCst);
    }

    pub fn get(&self) -> Option<Forced> {
        let w = self.0.load(Ordering::SeqCst);
        (w != NONE).then(|| Forced {
            algo: (w & 0xff) as u8,
            proto: (w >> 8 & 0xff) as u8,
            channels: Some((w >> 32) as u32).filter(|&c| c > 0),
        })
    }
}

impl Default for Force {
    fn default() -> Force {
        Force::new()
    }
}

/// NCCL's cost table as its headers define it (`NCCL_NUM_ALGORITHMS`, 7 from 2.23 with PAT;
/// `NCCL_NUM_PROTOCOLS`, 3): an index past them names no entry, whatever size of table a
/// later call passes (the tuner's own bounds, [`super::MAX_ALGO`], only guard a table read).
pub const NCCL_ALGOS: c_int = 7;
pub const NCCL_PROTOS: c_int = 3;

/// An algorithm or protocol index beyond NCCL's cost table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no such entry in NCCL's cost table")]
pub struct BeyondTable;

/// The override `(algo, proto, channels)` as C passes it: a negative algorithm or protocol
/// clears it; Err where an index is beyond NCCL's table.
pub fn parse(algo: c_int, proto: c_int, channels: c_int) -> Result<Option<Forced>, BeyondTable> {
    if algo < 0 || proto < 0 {
        return Ok(None);
    }
    if algo >= NCCL_ALGOS || proto >= NCCL_PROTOS {
        return Err(BeyondTable);
    }
    Ok(Some(Forced {
        algo: algo as u8,
        proto: proto as u8,
        channels: u32::try_from(channels).ok().filter(|&c| c > 0),
    }))
}

/// `int artune_tuner_force(int algo, int proto, int channels)` (src/artune.h): makes this
/// process's tuner favour cost-table entry `[algo][proto]` for every allreduce, with
/// `channels` where > 0; a negative `algo` or `proto` clears it. 0 on success, -1 for an index
/// beyond NCCL's table (the override is then unchanged).
#[no_mangle]
pub extern "C" fn artune_tuner_force(algo: c_int, proto: c_int, channels: c_int) -> c_int {
    match parse(algo, proto, channels) {
        Ok(f) => {
            GLOBAL.set(f);
            0
        }
        Err(BeyondTable) => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_holds_what_was_set_and_a_negative_index_clears_it() {
        let f = Force::new();
        assert_eq!(f.get(), None);
        let set = Forced {
            algo: 1,
            proto: 2,
            channels: Some(48),
        };
        f.set(Some(set));
        assert_eq!(f.get(), Some(set));
        f.set(Some(Forced {
            channels: None,
            ..set
        }));
        assert_eq!(f.get().unwrap().channels, None);
        f.set(None);
        assert_eq!(f.get(), None);
        assert_eq!(parse(-1, 2, 8), Ok(None));
        assert_eq!(parse(0, -1, 8), Ok(None));
        assert_eq!(parse(1, 0, 0).unwrap().unwrap().channels, None);
        // NCCL's last entry is taken; one past it, in either index, is not.
        assert_eq!(parse(6, 2, 0).unwrap().unwrap().algo, 6);
        assert_eq!(parse(7, 0, 0), Err(BeyondTable));
        assert_eq!(parse(0, 3, 0), Err(BeyondTable));
        // Through the C entry point, as an engine calls it: refused, the override unchanged.
        for (a, p) in [(9, 0), (0, 3), (0, 9)] {
            assert_eq!(artune_tuner_force(a, p, 0), -1, "({a}, {p})");
        }
        assert_eq!(
            Forced::of(Backend::NcclTreeLl128, None).unwrap().name(),
            "TREE/LL128"
        );
        assert_eq!(Forced::of(Backend::Nccl, None), None);
    }
}
