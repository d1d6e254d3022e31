//! Where artune may write: checked before anything is measured, so a tune never runs for a
//! minute to fail on its output, and never replaces a device node, FIFO or socket (as root,
//! `--out /dev/null` once turned the device into a regular file). A symlink is followed: its
//! target is what gets replaced, atomically, and the link stays a link.

use std::path::{Path, PathBuf};

use crate::error::Error;

/// What an output flag names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A file replaced whole (`--out`, `--prom`).
    File,
    /// A directory files are written into, created if missing (`--plot`, a multi-file export).
    Dir,
}

/// `path` with every symlink along it followed; a dangling link resolves to where it points.
pub fn resolve(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    // A bounded walk: a loop of links is left to the write to report.
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(&p) {
                Ok(t) if t.is_absolute() => p = t,
                Ok(t) => p = p.parent().map_or(t.clone(), |d| d.join(&t)),
                Err(_) => return p,
            },
            _ => return p,
        }
    }
    p
}

/// What kind of thing a path that is neither a regular file nor a directory is.
fn kind(m: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

/// Checks, before any work, that `flag PATH` can be written as `expect` says, and returns
/// the path writes go to (symlinks followed). Every refusal is one sentence naming `flag`.
pub fn check_output(path: &Path, flag: &str, expect: Expect) -> Result<PathBuf, Error> {
    let real = resolve(path);
    let shown = path.display();
    let refuse = |why: String| Error::bad_input(format!("{flag} {shown}: {why}"));
    use std::os::unix::ffi::OsStrExt;
    if expect == Expect::File && path.as_os_str().as_bytes().ends_with(b"/") {
        return Err(refuse(
            "it ends in /, so it names a directory; name the file to write".into(),
        ));
    }
    // Through the link as given too: /dev/stdout resolves to a name under /proc that stat
    // cannot follow, but is the pipe or terminal it points at.
    if let Ok(m) = std::fs::metadata(&real).or_else(|_| std::fs::metadata(path)) {
        if let Some(k) = kind(&m) {
            return Err(refuse(format!(
                "it is {k}, not a regular file; artune replaces its output whole and would replace the {}, so name a regular file",
                k.trim_start_matches("a ")
            )));
        }
        match expect {
            Expect::File if m.is_dir() => {
                return Err(refuse("it is a directory; name the file to write".into()))
            }
            Expect::Dir if !m.is_dir() => {
                return Err(refuse(
                    "it is a file, but this writes into a directory; give a directory".into(),
                ))
            }
            _ => {}
        }
    }
    let probe_in = match expect {
        Expect::File => match real.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        },
        Expect::Dir if real.is_dir() => real.clone(),
        // A directory still to be created: its nearest existing ancestor must take it.
        Expect::Dir => {
            let mut d = real.as_path();
            loop {
                match d.parent() {
                    Some(up) if up.as_os_str().is_empty() => break PathBuf::from("."),
                    Some(up) if up.exists() => break up.to_path_buf(),
                    Some(up) => d = up,
                    None => break PathBuf::from("/"),
                }
            }
        }
    };
    if !probe_in.is_dir() {
        return Err(refuse(format!(
            "{} is not a directory that exists; create it or choose another location",
            probe_in.display()
        )));
    }
    // The probe's own name is short: a name too long for the file system would pass it and
    // fail only at the final rename, after the work.
    let most = name_max(&probe_in);
    if let Some(long) = real
        .components()
        .map(|c| c.as_os_str().len())
        .find(|&n| n > most)
    {
        return Err(refuse(format!(
            "a name in it is {long} bytes, more than the {most} this file system allows; choose a shorter name"
        )));
    }
    // A probe file of this process's own (not tempfile's, whose error names the probe's path).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let probe = probe_in.join(format!(".artune-probe-{}-{nanos}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map(|f| {
            drop(f);
            let _ = std::fs::remove_file(&probe);
        })
        .map_err(|e| {
            use std::io::ErrorKind as K;
            let why = match e.kind() {
                K::PermissionDenied => "you may not create files there".to_string(),
                K::ReadOnlyFilesystem => "its file system is read-only".to_string(),
                // An existing directory that takes no new files: /proc, /sys and the like.
                K::NotFound => "it takes no new files".to_string(),
                _ => e.to_string(),
            };
            refuse(format!(
                "{} cannot be written: {why}; choose a writable location",
                probe_in.display()
            ))
        })?;
    Ok(real)
}

/// What an output flag writes, so that a file already there is replaced only where artune
/// wrote it: a typo in `--out` must not cost a user a file of theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// A profile (`tune --out`, fleet's class profiles): one of any version, or a broken one.
    Profile,
    /// An engine export (`export --out`): every file of one names artune in its provenance.
    Export,
    /// node_exporter text (`fleet --prom`): artune's metrics.
    Metrics,
    /// A plot in `--plot DIR`: an SVG.
    Plot,
    /// JSON artune wrote with a key of its own (`bench --out`'s report).
    Json(&'static str),
}

impl Writes {
    fn what(self) -> &'static str {
        match self {
            Writes::Profile => "an artune profile",
            Writes::Export => "an artune export",
            Writes::Metrics => "artune's metrics",
            Writes::Plot => "an SVG plot",
            Writes::Json(_) => "an artune report",
        }
    }
}

/// Whether replacing `path` (symlinks followed) loses nothing of the user's: it is missing,
/// empty, or a file artune writes as `writes`. Read only as far as the rule needs.
pub fn replaceable(path: &Path, writes: Writes) -> bool {
    use std::io::Read;
    let real = resolve(path);
    let Ok(m) = std::fs::metadata(&real) else {
        return true;
    };
    if !m.is_file() || m.len() == 0 {
        // Directories and devices are check_output's to refuse; an empty file holds nothing.
        return true;
    }
    let limit = match writes {
        Writes::Profile | Writes::Json(_) => crate::profile::LIMITS.file_bytes,
        _ => 64 << 10,
    };
    let mut text = String::new();
    let read = std::fs::File::open(&real).and_then(|f| f.take(limit).read_to_string(&mut text));
    if read.is_err() {
        return false;
    }
    match writes {
        Writes::Profile => match crate::profile::Profile::parse(&text) {
            Ok(_) => true,
            // A profile cut short (a copy interrupted) begins as artune writes one.
            Err(crate::profile::ProfileError::NotJson(_)) => begins_as_a_profile(&text),
            Err(e) => e.may_replace(),
        },
        Writes::Export => {
            text.contains("Generated by artune ")
                || text.contains("\"generated_by\":\"artune ")
                || text.contains("\"generated_by\": \"artune ")
                || p2p_cache(&text)
        }
        Writes::Metrics => text.contains("# TYPE artune_"),
        Writes::Plot => {
            let t = text.trim_start();
            t.starts_with("<svg") || (t.starts_with("<?xml") && t.contains("<svg"))
        }
        Writes::Json(key) => {
            serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| v.get(key).is_some())
        }
    }
}

/// vLLM's own GPU P2P access cache ("0->1": true, ...), which vLLM rewrites whenever it is
/// missing and the vLLM export replaces.
fn p2p_cache(text: &str) -> bool {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str(text) else {
        return false;
    };
    !m.is_empty()
        && m.iter().all(|(k, v)| {
            let pair = k.split_once("->");
            v.is_boolean()
                && pair.is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
        })
}

/// Refuses, before any work, to replace a file that is not what `flag` writes, in one
/// sentence naming the way out (`--force`).
pub fn check_replace(path: &Path, flag: &str, writes: Writes, force: bool) -> Result<(), Error> {
    let name = format!("{flag} {}", path.display());
    check_replace_as(path, &name, "choose another path", writes, force)
}

/// The same, for a path no flag gave (a default): the file named as `name` says, and `remedy`
/// the way out besides `--force`.
pub fn check_replace_as(
    path: &Path,
    name: &str,
    remedy: &str,
    writes: Writes,
    force: bool,
) -> Result<(), Error> {
    if force || replaceable(path, writes) {
        return Ok(());
    }
    let newer = match writes {
        Writes::Profile => {
            crate::topology::file::read_text(path, super::LIMITS.file_bytes, "profile")
                .ok()
                .and_then(|text| match super::Profile::parse(&text) {
                    Err(super::ProfileError::SchemaTooNew { found }) => Some(found),
                    _ => None,
                })
        }
        _ => None,
    };
    let what = match newer {
        Some(v) => format!("a newer artune's profile (schema version {v}), and this would replace it with an older one"),
        None => format!("not {} and this would replace it", writes.what()),
    };
    Err(Error::bad_input(format!(
        "{name}: that file is {what}; {remedy}, or pass --force to replace it"
    )))
}

/// Whether `text` begins as artune writes a profile of this schema or an older one: an object
/// whose first key is `schema_version`, however it ends.
fn begins_as_a_profile(text: &str) -> bool {
    let version = text
        .trim_start()
        .strip_prefix('{')
        .and_then(|t| t.trim_start().strip_prefix("\"schema_version\""))
        .and_then(|t| t.trim_start().strip_prefix(':'))
        .map(|t| {
            t.trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap_or("")
        });
    version
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|v| v <= crate::profile::SCHEMA_VERSION)
}

/// Refuses `out` where it is the very file `input` names (the same device and inode, through
/// whatever path or link): not even --force replaces what a command reads with what it derives
/// from it, which would leave neither.
pub fn check_not_input(out: &Path, flag: &str, input: &Path, what: &str) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(o), Ok(i)) = (std::fs::metadata(out), std::fs::metadata(input)) else {
        return Ok(());
    };
    if (o.dev(), o.ino()) != (i.dev(), i.ino()) {
        return Ok(());
    }
    Err(Error::bad_input(format!(
        "{flag} {}: that is the {what} being read; writing there would replace it, so choose another path",
        out.display()
    )))
}

/// The longest file name the file system of `dir` takes (NAME_MAX; 255 where it does not say).
fn name_max(dir: &Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 255;
    };
    // SAFETY: a NUL-terminated path; pathconf only reads it.
    let n = unsafe { libc::pathconf(c.as_ptr(), libc::_PC_NAME_MAX) };
    if n > 0 {
        n as usize
    } else {
        255
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_sockets_are_refused_naming_the_flag() {
        let e = check_output(Path::new("/dev/null"), "--out", Expect::File).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("--out /dev/null: it is a character device"),
            "{msg}"
        );
        assert_eq!(e.exit_code(), crate::error::EXIT_BAD_INPUT);
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates a node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let msg = check_output(&fifo, "--prom", Expect::File)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("--prom ") && msg.contains("a FIFO"),
            "{msg}"
        );
        let sock = dir.path().join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let msg = check_output(&sock, "--plot", Expect::Dir)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("--plot ") && msg.contains("a socket"),
            "{msg}"
        );
    }

    /// Refusals say what is wrong with the path itself, not an error of the probe beside it.
    #[test]
    fn a_directory_name_a_virtual_directory_and_a_linked_fifo_are_named() {
        let msg = |p: &str| {
            check_output(Path::new(p), "--out", Expect::File)
                .unwrap_err()
                .to_string()
        };
        let dir = tempfile::tempdir().unwrap();
        let slash = format!("{}/new/", dir.path().display());
        assert!(msg(&slash).contains("ends in /, so it names a directory"));
        assert!(msg("/proc/x.json").contains("/proc cannot be written: it takes no new files"));
        // A FIFO through a link.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates a node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let link = dir.path().join("out.json");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(msg(link.to_str().unwrap()).contains("it is a FIFO"));
    }

    #[test]
    fn a_name_too_long_for_the_file_system_is_refused_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        let long = dir.path().join(format!("{}.json", "a".repeat(300)));
        let msg = check_output(&long, "--out", Expect::File)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("is 305 bytes, more than the 255"), "{msg}");
        let plots = dir.path().join("b".repeat(256)).join("plots");
        assert!(check_output(&plots, "--plot", Expect::Dir).is_err());
        let fine = dir.path().join(format!("{}.json", "a".repeat(250)));
        assert!(check_output(&fine, "--out", Expect::File).is_ok());
    }

    #[test]
    fn a_symlink_resolves_to_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.json");
        std::fs::write(&target, "old").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink("real.json", &link).unwrap();
        assert_eq!(check_output(&link, "--out", Expect::File).unwrap(), target);
        let dangling = dir.path().join("dangling.json");
        std::os::unix::fs::symlink("new.json", &dangling).unwrap();
        assert_eq!(resolve(&dangling), dir.path().join("new.json"));
    }

    #[test]
    fn a_missing_directory_is_checked_where_it_would_be_created() {
        let dir = tempfile::tempdir().unwrap();
        let plots = dir.path().join("a/b/plots");
        assert_eq!(check_output(&plots, "--plot", Expect::Dir).unwrap(), plots);
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let msg = check_output(&file, "--plot", Expect::Dir)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("give a directory"), "{msg}");
        let msg = check_output(dir.path(), "--out", Expect::File)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("is a directory"), "{msg}");
    }
}
