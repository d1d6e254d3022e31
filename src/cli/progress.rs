//! What a long command shows while it runs, and how it stops on SIGINT or SIGTERM.
//!
//! On a terminal a spinner with the elapsed time says what is happening from the first
//! moment (a large machine takes seconds to model before anything is measured), then becomes
//! a bar once the tune knows how many steps (cells and contention probes) it plans.
//! Elsewhere (a pipe, a log, a scheduler) only warnings are printed, one line each.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::cancel::Cancel;
use crate::error::{Error, EXIT_INTERRUPTED};
use crate::measure::Progress;

/// How long a first signal waits for the run to stop between measurements before the process
/// ends anyway: a step that checks no token (a large simulated machine being built, one GPU
/// call) must not keep an operator waiting.
const GRACE: Duration = Duration::from_secs(2);

/// The status line on standard error (None when standard error is not a terminal).
#[derive(Clone)]
pub struct StatusLine {
    bar: Option<ProgressBar>,
    /// The group being measured, which a probe's message names and a cell's restores.
    group: Arc<Mutex<String>>,
}

impl StatusLine {
    pub fn new() -> StatusLine {
        let bar = std::io::stderr().is_terminal().then(|| {
            let pb = ProgressBar::new_spinner();
            pb.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            pb.enable_steady_tick(Duration::from_millis(100));
            pb
        });
        StatusLine {
            bar,
            group: Arc::default(),
        }
    }

    /// What the command is doing now, before the cells are counted.
    pub fn stage(&self, what: &str) {
        if let Some(pb) = &self.bar {
            pb.set_message(what.to_string());
        }
    }

    /// One line above the status line (or alone, off a terminal).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(pb) => pb.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Follows the harness: steps done of those planned (each cell and each contention probe;
    /// refinement adds cells, so the total grows when the count reaches it), and the group
    /// being measured, with the probe running where one is.
    pub fn progress(&self, p: Progress) {
        match &p {
            Progress::Fault(f) => self.line(&format!("warning: {f}")),
            Progress::Beside { gpus, who } => {
                let who: Vec<String> = who.iter().map(ToString::to_string).collect();
                self.line(&format!(
                    "warning: another process started using the GPUs while GPUs {} were measured: {}; measuring beside it (--allow-busy), and the profile records each group measured beside it",
                    crate::topology::fmt_gpus(gpus),
                    who.join("; ")
                ))
            }
            _ => {}
        }
        let Some(pb) = &self.bar else { return };
        let mut group = self.group.lock().unwrap_or_else(|e| e.into_inner());
        let step = || {
            if pb.length().is_some_and(|n| pb.position() + 1 >= n) {
                pb.inc_length(1);
            }
            pb.inc(1);
        };
        match p {
            Progress::Planned(n) => {
                pb.set_style(
                    ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} steps  {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                pb.set_length(n);
            }
            Progress::Group { gpus, placement } => {
                *group = format!(
                    "TP{} GPUs {} ({placement})",
                    gpus.len(),
                    crate::topology::fmt_gpus(&gpus)
                );
                pb.set_message(group.clone());
            }
            Progress::Probe {
                direction,
                peers,
                of,
            } => {
                let how = match direction {
                    crate::fabric::Direction::Read => "reads",
                    crate::fabric::Direction::Write => "writes",
                };
                pb.set_message(format!(
                    "{group}: contention probe, {how} with {peers} of {of} peers at once"
                ));
                step();
            }
            Progress::Cell { .. } => {
                if pb.message() != *group {
                    pb.set_message(group.clone());
                }
                step();
            }
            Progress::Fault(_) | Progress::Beside { .. } => {}
        }
    }

    pub fn finish(&self) {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
    }
}

/// Connects SIGINT and SIGTERM to `cancel`. The first signal asks the run to stop between
/// measurements and says so at once; if the run has not stopped [`GRACE`] later, the process
/// ends with 130 anyway, which is safe until [`Stopping::commit`]: a profile is only ever
/// written whole, and the workers die with this process. A second signal ends it at once.
pub fn stop_on_signals(cancel: &Cancel, status: &StatusLine) -> Stopping {
    let committed = Arc::new(AtomicBool::new(false));
    let stopping = Stopping {
        committed: committed.clone(),
    };
    let signals = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM];
    let Ok(mut incoming) = signal_hook::iterator::Signals::new(signals) else {
        tracing::warn!("SIGINT and SIGTERM could not be caught; they end the process at once");
        return stopping;
    };
    let (cancel, status) = (cancel.clone(), status.clone());
    std::thread::spawn(move || {
        for (n, _) in incoming.forever().enumerate() {
            if n > 0 {
                std::process::exit(EXIT_INTERRUPTED);
            }
            // Said before the run is asked to stop, so it is never lost to a run that stops
            // and prints its error first.
            let finishing = committed.load(Ordering::SeqCst);
            if !finishing {
                status
                    .line("stopping after the current measurement (signal again to stop at once)");
            }
            cancel.cancel();
            if finishing {
                continue;
            }
            let (committed, status) = (committed.clone(), status.clone());
            std::thread::spawn(move || {
                std::thread::sleep(GRACE);
                if !committed.load(Ordering::SeqCst) {
                    status.finish();
                    eprintln!("error: {}", Error::Interrupted);
                    std::process::exit(EXIT_INTERRUPTED);
                }
            });
        }
    });
    stopping
}

/// Whether a signal may still end the process before the run returns.
pub struct Stopping {
    committed: Arc<AtomicBool>,
}

impl Stopping {
    /// From here the command finishes what it does (writing the profile and the plots):
    /// a first signal no longer ends the process.
    pub fn commit(&self) {
        self.committed.store(true, Ordering::SeqCst);
    }
}
