//! The one writer of standard output for every command.
//!
//! A reader that went away (`artune show p.json | head -1`) means the rest of the output is not
//! wanted: the command stops there and exits 0 without a word, as ripgrep does. Commands write
//! through [`out!`]/[`outln!`], which return [`Error::StdoutClosed`] from the calling function;
//! the edge (`cli::main`) turns that into a quiet success.

use std::io::Write;

use crate::error::Error;

/// Writes formatted text to standard output.
pub fn write_fmt(args: std::fmt::Arguments<'_>) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_fmt(args)
        .and_then(|()| stdout.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => Error::StdoutClosed,
            _ => Error::bad_input(format!(
                "cannot write to standard output ({e}); check where the output goes"
            )),
        })
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
