//! Writing a profile (or any file artune replaces) so that a crash leaves the old file whole,
//! with the mode, owner and group engines read it by.

use std::io::Write;
use std::path::Path;

use super::paths;
use crate::error::Error;

/// The directory [`write_atomic`] creates its temporary file in; refuses a directory as `path`.
fn target_dir(path: &Path) -> Result<&Path, Error> {
    if path.is_dir() {
        return Err(Error::Write {
            path: path.into(),
            reason: "it is a directory".into(),
        });
    }
    Ok(match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    })
}

/// Fails, before any measuring, where [`write_atomic`] could not write `path` as `--out`: a
/// device, FIFO or socket, a directory, or a place it cannot create a file in.
pub fn check_writable(path: &Path) -> Result<(), Error> {
    paths::check_output(path, "--out", paths::Expect::File).map(drop)
}

/// Writes bytes to `path` atomically (temporary file in the same directory, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_all_atomic(&[(path, bytes)])
}

/// Writes several files so that either all of them are replaced or none is: every temporary
/// file is written and synced before the first rename, and a failure before then leaves no
/// target touched.
///
/// A symlink is followed: its target is replaced and the link kept.
pub fn write_all_atomic(files: &[(&Path, &[u8])]) -> Result<(), Error> {
    let real: Vec<std::path::PathBuf> = files.iter().map(|(p, _)| paths::resolve(p)).collect();
    let staged = real
        .iter()
        .zip(files)
        .map(|(path, (_, bytes))| stage(path, bytes).map(|tmp| (path.as_path(), tmp)))
        .collect::<Result<Vec<_>, Error>>()?;
    for (path, tmp) in staged {
        tmp.persist(path).map_err(|e| Error::Write {
            path: path.into(),
            reason: e.error.to_string(),
        })?;
        if let Ok(d) = std::fs::File::open(target_dir(path)?) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// `bytes` in a synced temporary file beside `path`, with the mode `path` will have.
fn stage(path: &Path, bytes: &[u8]) -> Result<tempfile::NamedTempFile, Error> {
    let err = |e: &dyn std::fmt::Display| Error::Write {
        path: path.into(),
        reason: e.to_string(),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".artune-")
        .suffix(".tmp")
        .tempfile_in(target_dir(path)?)
        .map_err(|e| err(&e))?;
    tmp.write_all(bytes).map_err(|e| err(&e))?;
    // tempfile creates 0600, but engines often run as another user: keep the mode, owner and
    // group of the file being replaced (as far as this user may give them: root re-tuning a
    // profile an engine's group reads), or give a new one the 0644 that `touch` gives.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let old = std::fs::metadata(path).ok();
    if let Some(m) = &old {
        let _ = std::os::unix::fs::fchown(tmp.as_file(), Some(m.uid()), Some(m.gid()));
    }
    let mode = old.map_or_else(
        || std::fs::Permissions::from_mode(0o644),
        |m| m.permissions(),
    );
    tmp.as_file().set_permissions(mode).map_err(|e| err(&e))?;
    tmp.as_file().sync_all().map_err(|e| err(&e))?;
    Ok(tmp)
}
