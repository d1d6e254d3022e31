//! A cancel token: how a caller asks a running tune to stop between measurements.
//!
//! The library owns no global state: the CLI connects SIGINT/SIGTERM to a token it passes in
//! the options, an engine or test cancels its own. A fresh token starts a fresh run, so a
//! second tune in one process after an interrupted one works.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Cheap to clone; every clone sees the same state.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Asks the run to stop at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The flag itself, for async-signal-safe setters such as `signal_hook::flag::register`.
    pub fn flag(&self) -> &Arc<AtomicBool> {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_state_and_new_tokens_start_clear() {
        let a = Cancel::new();
        let b = a.clone();
        assert!(!b.is_cancelled());
        a.cancel();
        assert!(b.is_cancelled());
        assert!(!Cancel::new().is_cancelled());
    }
}
