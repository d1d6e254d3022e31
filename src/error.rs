//! Errors a user can act on, and the exit codes they map to.
//!
//! Exit codes are a contract with provisioning scripts: 0 ok, 2 bad input, 3 stale profile,
//! 4 hardware or driver failure, 5 done with warnings, 6 no answer (keep the engine's default),
//! 7 a fleet outlier, 8 undecided, 9 fleet class profiles not written, 70 a bug in artune,
//! 130 interrupted.

use std::path::PathBuf;

/// Exit code for bad input (arguments, files).
pub const EXIT_BAD_INPUT: i32 = 2;
/// Exit code for a profile that no longer holds for this machine (`artune fleet`: a class
/// holds profiles tuned with different versions).
pub const EXIT_STALE: i32 = 3;
/// Exit code for a hardware, driver or library failure.
pub const EXIT_HARDWARE: i32 = 4;
/// Exit code for a bug in artune itself (a panic, or a profile it built and then found
/// invalid): neither the user's input nor the hardware is at fault. 70 is sysexits' EX_SOFTWARE.
pub const EXIT_BUG: i32 = 70;
/// Exit code for a command that did its work but has warnings to act on (`artune doctor`
/// found warnings and no failure; `artune fleet` skipped some profiles or left out nodes that
/// tuned other groups than their class).
pub const EXIT_WARNINGS: i32 = 5;
/// Exit code for a question the profile has no answer to (`select`, `why`: a TP size, GPUs or
/// a size it did not tune): not an error, the engine keeps its own default.
pub const EXIT_NO_ANSWER: i32 = 6;
/// Exit code for `artune fleet` when a node is an outlier of its class.
pub const EXIT_OUTLIER: i32 = 7;
/// Exit code of `check --measure` when the machine drifts too much right now to tell whether
/// the profile holds: neither confirmed (0) nor stale (3).
pub const EXIT_UNDECIDED: i32 = 8;
/// Exit code for `artune fleet` when it printed its report but could not write the class
/// profiles: the nodes would go on following older ones.
pub const EXIT_NOT_WRITTEN: i32 = 9;
/// Exit code after SIGINT/SIGTERM.
pub const EXIT_INTERRUPTED: i32 = 130;

/// Every failure artune reports. Each message is one sentence that says what is wrong and what
/// to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    BadInput(String),
    #[error("cannot read {path}: {reason}; check the path and permissions")]
    Read { path: PathBuf, reason: String },
    #[error("cannot write {path}: {reason}; choose a writable location with --out")]
    Write { path: PathBuf, reason: String },
    #[error("{path} is not a valid {what}: {reason}{}", parse_hint(what, path))]
    Parse {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    /// A file given as a profile that is not a valid one: the advice fits what it is.
    /// Built by `ProfileError::at`, which knows the kinds of refusal and their advice.
    #[error("{path} is not a valid profile: {reason}{hint}")]
    Profile {
        path: PathBuf,
        reason: String,
        hint: String,
    },
    /// `retune` is the command that tunes this machine again into the same file.
    #[error("profile is stale: {why}; run `{retune}` to tune this machine again")]
    Stale { why: String, retune: String },
    #[error("{0}")]
    Hardware(String),
    /// `check --nccl-audit`: NCCL does not run what the profile pins; the sentence says why.
    #[error("NCCL does not follow the profile: {0}")]
    NotFollowed(String),
    /// The real machine cannot be read (no NVML, no driver, no GPU); `hardware` where a
    /// driver is there and fails. Each edge says how to simulate one in its own words (the
    /// Python package names its keywords).
    #[error("{reason}, or simulate a machine with --sim PRESET / --topology FILE")]
    NoMachine { reason: String, hardware: bool },
    #[error("interrupted; the previous profile (if any) is left as it was; run the command again to finish")]
    Interrupted,
    /// artune broke its own rules; the message names what, and asks for a report.
    #[error("{0}; this is a bug in artune, please report it")]
    Bug(String),
    /// Standard output's reader went away: the rest of the output is not wanted. Not a
    /// failure; the CLI's edge exits 0 without a word.
    #[error("standard output was closed")]
    StdoutClosed,
}

/// What to do about a file that does not parse, where the reason does not already say.
fn parse_hint(what: &str, _path: &std::path::Path) -> String {
    match what {
        "workload file" => "; see `artune predict --help` for the format".into(),
        _ => String::new(),
    }
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::BadInput(_) | Error::Read { .. } | Error::Parse { .. } => EXIT_BAD_INPUT,
            Error::Profile { .. } => EXIT_BAD_INPUT,
            Error::Write { .. } => EXIT_BAD_INPUT,
            Error::Stale { .. } | Error::NotFollowed(_) => EXIT_STALE,
            Error::Hardware(_) | Error::NoMachine { hardware: true, .. } => EXIT_HARDWARE,
            Error::NoMachine { .. } => EXIT_BAD_INPUT,
            Error::Interrupted => EXIT_INTERRUPTED,
            Error::Bug(_) => EXIT_BUG,
            Error::StdoutClosed => 0,
        }
    }

    pub fn bad_input(msg: impl Into<String>) -> Self {
        Error::BadInput(msg.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_contract() {
        let p = || PathBuf::from("p.json");
        let cases = [
            (Error::bad_input("x"), EXIT_BAD_INPUT),
            (
                Error::Read {
                    path: p(),
                    reason: "x".into(),
                },
                EXIT_BAD_INPUT,
            ),
            (
                Error::Write {
                    path: p(),
                    reason: "x".into(),
                },
                EXIT_BAD_INPUT,
            ),
            (
                Error::Parse {
                    path: p(),
                    what: "topology file",
                    reason: "x".into(),
                },
                EXIT_BAD_INPUT,
            ),
            (
                crate::profile::ProfileError::NotAProfile.at(&p()),
                EXIT_BAD_INPUT,
            ),
            (
                Error::Stale {
                    why: "x".into(),
                    retune: "artune tune".into(),
                },
                EXIT_STALE,
            ),
            (Error::Hardware("x".into()), EXIT_HARDWARE),
            (Error::NotFollowed("x".into()), EXIT_STALE),
            (
                Error::NoMachine {
                    reason: "x".into(),
                    hardware: true,
                },
                EXIT_HARDWARE,
            ),
            (
                Error::NoMachine {
                    reason: "x".into(),
                    hardware: false,
                },
                EXIT_BAD_INPUT,
            ),
            (Error::Interrupted, EXIT_INTERRUPTED),
            (Error::Bug("x".into()), EXIT_BUG),
            (Error::StdoutClosed, 0),
        ];
        for (e, code) in cases {
            assert_eq!(e.exit_code(), code, "{e}");
        }
    }

    #[test]
    fn messages_name_the_next_step() {
        let p = PathBuf::from("p.json");
        let parse = |what| Error::Parse {
            path: p.clone(),
            what,
            reason: "it ends too early".into(),
        };
        use crate::profile::ProfileError as P;
        let profile = |error: P| error.at(&p);
        let old = profile(P::SchemaUnsupported { found: 0 }).to_string();
        assert!(
            old.ends_with("run `artune tune --out p.json` to write a new one"),
            "{old}"
        );
        let topo = profile(P::TopologyFile).to_string();
        assert!(
            topo.contains("pass it as `--topology p.json`") && !topo.contains("--out p.json"),
            "{topo}"
        );
        for e in [P::NotJson("x".into()), P::NotAProfile] {
            let m = profile(e).to_string();
            assert!(
                m.ends_with("name a profile that `artune tune` wrote"),
                "{m}"
            );
        }
        assert!(parse("workload file")
            .to_string()
            .contains("artune predict --help"));
        assert!(Error::Interrupted
            .to_string()
            .contains("run the command again"));
        let stale = Error::Stale {
            why: "x".into(),
            retune: "artune tune --out p.json".into(),
        };
        assert!(stale
            .to_string()
            .ends_with("run `artune tune --out p.json` to tune this machine again"));
    }
}
