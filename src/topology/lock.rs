//! One measurement per GPU at a time, across processes: an advisory lock (flock) per GPU on a
//! file named by its UUID in the temporary directory, taken before a command starts its
//! workers and held until it exits. Two `check --measure` started a second apart both failed,
//! each timing the other's workers; with the lock the second waits for the first, saying so,
//! and the first always finishes.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Longest a command waits for another artune measuring the same GPUs.
pub const WAIT: Duration = Duration::from_secs(60);

/// How often a waiting command tries the lock again.
const POLL: Duration = Duration::from_millis(100);

/// The locks a command holds; dropping them (or the process exiting) releases them.
#[derive(Debug, Default)]
pub struct GpuLocks {
    _files: Vec<File>,
}

/// The lock file of the GPU with this UUID (or bus id): in the temporary directory every user
/// shares, so another user's artune is seen too.
pub fn path(gpu: &str) -> PathBuf {
    let name: String = gpu
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || c == '-' {
            true => c,
            false => '_',
        })
        .collect();
    std::env::temp_dir().join(format!("artune-gpu-{name}.lock"))
}

/// Locks the GPUs named by `gpus` (UUIDs) for `command`, waiting up to `wait` for another
/// artune that holds one; `waiting` hears, once, whom it waits for. Err is the sentence the
/// command stops with when the wait ran out. A lock file that cannot be opened is skipped:
/// the lock is advice, the occupancy check still stands.
pub fn acquire(
    gpus: &[String],
    command: &str,
    wait: Duration,
    waiting: &mut dyn FnMut(&str),
) -> Result<GpuLocks, String> {
    let started = Instant::now();
    let mut files = Vec::new();
    let mut said = false;
    for gpu in gpus {
        let p = path(gpu);
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .or_else(|_| File::open(&p));
        let Ok(mut f) = opened else {
            tracing::debug!("GPU lock {} not opened", p.display());
            continue;
        };
        loop {
            // SAFETY: a valid open descriptor; flock only changes its lock.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let holder = holder(&mut f);
            if started.elapsed() >= wait {
                let (after, wait_more) = match wait.is_zero() {
                    true => (String::new(), "to wait for it"),
                    false => (
                        format!(", still after {} s", wait.as_secs()),
                        "to wait longer",
                    ),
                };
                return Err(format!(
                    "{gpu} is being measured by another artune ({holder}){after}; run {command} again when it has finished, or give --wait SECONDS {wait_more} (two measurements at once would time each other)"
                ));
            }
            if !std::mem::replace(&mut said, true) {
                waiting(&format!(
                    "waiting up to {} s for another artune ({holder}) to finish measuring {gpu}",
                    wait.as_secs()
                ));
            }
            std::thread::sleep(POLL);
        }
        let _ = f.set_len(0);
        let _ = f.rewind();
        let _ = write!(f, "pid {} ({command})", std::process::id());
        files.push(f);
    }
    Ok(GpuLocks { _files: files })
}

/// Who holds a lock, as its file says.
fn holder(f: &mut File) -> String {
    let mut s = String::new();
    let _ = f.rewind();
    let _ = f.take(200).read_to_string(&mut s);
    match s.trim() {
        "" => "pid unknown".into(),
        t => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two holders in one process (flock locks belong to the open file, so two opens conflict
    /// as two processes would): the second waits, names the first, and is refused when the
    /// wait runs out; once the first is dropped the second takes the GPU.
    #[test]
    fn a_second_measurement_of_a_gpu_waits_for_the_first() {
        let gpu = format!("GPU-lock-unit-{}", std::process::id());
        let first = acquire(std::slice::from_ref(&gpu), "tune", WAIT, &mut |_| {}).unwrap();
        let mut heard = Vec::new();
        let e = acquire(
            std::slice::from_ref(&gpu),
            "check --measure",
            Duration::from_millis(300),
            &mut |w| heard.push(w.to_string()),
        )
        .unwrap_err();
        let pid = std::process::id();
        assert!(
            e.starts_with(&format!(
                "{gpu} is being measured by another artune (pid {pid} (tune)), still after 0 s"
            )),
            "{e}"
        );
        assert_eq!(heard.len(), 1, "{heard:?}");
        assert!(heard[0].contains("to finish measuring GPU"), "{heard:?}");
        drop(first);
        let second = acquire(std::slice::from_ref(&gpu), "check", WAIT, &mut |_| {});
        assert!(second.is_ok());
        drop(second);
        let _ = std::fs::remove_file(path(&gpu));
    }

    #[test]
    fn lock_file_names_keep_only_safe_characters() {
        let p = path("GPU-1a/../b c");
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "artune-gpu-GPU-1a____b_c.lock");
    }
}
