//! The one writer of standard output for every command.
//!
//! A reader that went away (`artune show p.json | head -1`) means the rest of the output is not
//! wanted, but not that the verdict is: `artune doctor | grep -q fail` must still exit 4 when a
//! check fails. So the first write that finds the pipe closed marks standard output closed,
//! every later write is dropped without a word, and the command runs on to its own exit code
//! (doctor 4/5, fleet 5, check 3; 0 for a command that only prints).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Error;

/// Set once standard output's reader has gone: the process's one stdout, so one flag (CLI only).
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes formatted text to standard output; after its reader went away, writes nothing.
pub fn write_fmt(args: std::fmt::Arguments<'_>) -> Result<(), Error> {
    if CLOSED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(Error::bad_input(format!(
            "cannot write to standard output ({e}); check where the output goes"
        ))),
    }
}

/// `print!` through [`write_fmt`]; `?`s the error out of the calling function.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::cli::output::write_fmt(format_args!($($t)*))?
    };
}

/// `println!` through [`write_fmt`]; `?`s the error out of the calling function.
macro_rules! outln {
    () => {
        $crate::cli::output::write_fmt(format_args!("\n"))?
    };
    ($($t:tt)*) => {
        $crate::cli::output::write_fmt(format_args!("{}\n", format_args!($($t)*)))?
    };
}

pub(crate) use {out, outln};
