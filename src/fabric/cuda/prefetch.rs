//! Kernels compiled while the command does other things. On a freshly booted machine the first
//! set-up took 6.2 s of a 23.8 s tune (run 20 on the H200), most of it NVRTC loading and
//! compiling inside the first workers; the coordinator knows the GPU's compute capability
//! before any worker starts, so it compiles into the kernel cache while the busy check
//! samples utilization and the workers start, and the workers then load from the cache.

use std::sync::Mutex;
use std::thread::JoinHandle;

use cudarc::driver::{result, sys};

static PENDING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// The compute capability of every GPU CUDA can see, without creating a context (a context
/// would make this process one of the GPU's users, which the busy check counts).
fn compute_capabilities() -> Result<Vec<(u32, u32)>, result::DriverError> {
    use sys::CUdevice_attribute::*;
    result::init()?;
    let mut out = Vec::new();
    for o in 0..result::device::get_count()?.max(0) {
        let d = result::device::get(o)?;
        // SAFETY: `d` was returned by `device::get`.
        let major = unsafe {
            result::device::get_attribute(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        }?;
        // SAFETY: as above.
        let minor = unsafe {
            result::device::get_attribute(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        }?;
        let cc = (major.max(0) as u32, minor.max(0) as u32);
        if !out.contains(&cc) {
            out.push(cc);
        }
    }
    Ok(out)
}

/// Starts compiling the kernels of `dtypes` for the GPUs found, in the background. Anything
/// that fails here is left for the workers to meet and report; this only saves time. Even
/// finding the libraries is left to the thread: loading NVRTC's is part of the cost it hides.
pub fn start(dtypes: &[crate::fabric::Dtype]) {
    let dtypes = dtypes.to_vec();
    let handle = std::thread::spawn(move || {
        // NVRTC's library loads and lists its architectures beside the driver's start, not
        // after it: on the H200 after boot the compile began 0.57 s into the process, the
        // two libraries found at 0.31 s (speed3/first.txt).
        let nvrtc = std::thread::spawn(|| {
            super::compile::nvrtc_present() && super::compile::supported_archs().is_ok()
        });
        let ccs = super::driver::driver_present().then(compute_capabilities);
        // Joined on every path: NVRTC still loading at exit meets its teardown (see exit).
        let nvrtc = nvrtc.join().unwrap_or(false);
        let (Some(ccs), true) = (ccs, nvrtc) else {
            return;
        };
        let started = std::time::Instant::now();
        match ccs {
            Ok(ccs) => {
                for cc in ccs {
                    if let Err(e) = super::compile::images_for(cc, &dtypes) {
                        tracing::debug!("kernels not compiled ahead: {e}");
                    }
                }
                tracing::info!(
                    "kernels compiled ahead in {:.2} s",
                    started.elapsed().as_secs_f64()
                );
            }
            Err(e) => tracing::debug!("kernels not compiled ahead: {e}"),
        }
    });
    PENDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(handle);
}

/// Waits for what [`start`] began, so the workers find the cache filled rather than compile
/// the same kernels beside it.
pub fn wait() {
    let pending: Vec<JoinHandle<()>> =
        std::mem::take(&mut *PENDING.lock().unwrap_or_else(|p| p.into_inner()));
    for h in pending {
        let _ = h.join();
    }
}

/// Ends the process with `code`. A compile still running in the background would meet the
/// CUDA and NVRTC libraries' own teardown at exit (a SIGSEGV on the H200 when a tune refused
/// as busy ended 0.24 s in, its kernel cache empty): then the process ends without that
/// teardown, its output flushed first.
pub fn exit(code: i32) -> ! {
    let running = PENDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|h| !h.is_finished());
    if running {
        exit_now(code)
    }
    std::process::exit(code)
}

/// Ends the process with `code` now, its output flushed, without the C exit handlers (the
/// libraries' teardown); the kernel still releases its GPU context before it can be reaped.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process at once; no Rust code runs after it.
    unsafe { libc::_exit(code) }
}
