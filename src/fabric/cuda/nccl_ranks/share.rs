//! How K rank processes share one GPU: under MPS their kernels run at once, so a call costs
//! NCCL's work; without it the driver gives each process's context the GPU in turn, and a
//! rank's kernel spins until the others' slices end (milliseconds a call, whatever the size).
//! The two kinds of time mean different things, so the profile says which it holds.

use cudarc::driver::result;
use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED;

/// How the processes on one GPU share it, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// Contexts made here are shared through the MPS server: the ranks' kernels run at once.
    Mps,
    /// No MPS: each process's context has the GPU in time slices.
    TimeSlices,
    /// The driver would not say (why); `pipe`: an MPS control pipe was found.
    Unknown { why: String, pipe: bool },
}

/// Where an MPS client looks for the control daemon: `CUDA_MPS_PIPE_DIRECTORY`, else NVIDIA's
/// default.
fn pipe_dir(env: Option<std::ffi::OsString>) -> std::path::PathBuf {
    env.map_or_else(|| "/tmp/nvidia-mps".into(), Into::into)
}

/// How processes share GPU `ordinal`: the driver's `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` (CUDA
/// 12.3 and later drivers), which is true only where this process's contexts go through a
/// running MPS server; where the driver cannot answer, whether a control pipe is there.
pub fn sharing(ordinal: usize) -> Sharing {
    let asked = result::init().and_then(|()| {
        let dev = result::device::get(ordinal as i32)?;
        // SAFETY: `dev` was returned by cuDeviceGet just above.
        unsafe { result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_MPS_ENABLED) }
    });
    from_driver(
        asked.map_err(|e| e.to_string()),
        &pipe_dir(std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")),
    )
}

/// The sharing the driver's answer means; a pipe in `dir` counts only where it gave none.
fn from_driver(asked: Result<i32, String>, dir: &std::path::Path) -> Sharing {
    match asked {
        Ok(0) => Sharing::TimeSlices,
        Ok(_) => Sharing::Mps,
        Err(why) => Sharing::Unknown {
            why,
            pipe: dir.join("control").exists(),
        },
    }
}

/// What a profile says of NCCL times from `k` rank processes sharing GPU 0.
pub fn note(k: usize, s: &Sharing) -> String {
    let how = match s {
        Sharing::Mps => "under MPS (the driver shares their contexts, so their kernels run at \
                         once): one GPU's work"
            .to_string(),
        Sharing::TimeSlices => "by time slices (no MPS: a call waits out the other ranks' \
                                slices, milliseconds whatever its size): time slices of one GPU"
            .to_string(),
        Sharing::Unknown { why, pipe } => format!(
            "(whether under MPS or by time slices the driver did not say: {why}; an MPS control \
             pipe {}): one GPU's times",
            match pipe {
                true => "was found",
                false => "was not found",
            }
        ),
    };
    format!("NCCL timed as {k} rank processes sharing GPU 0 {how}, not multi-GPU evidence")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_s_answer_decides_and_a_pipe_counts_only_where_it_gave_none() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("control"), "").unwrap();
        assert_eq!(from_driver(Ok(1), d.path()), Sharing::Mps);
        assert_eq!(from_driver(Ok(0), d.path()), Sharing::TimeSlices);
        let u = from_driver(Err("CUDA_ERROR_INVALID_VALUE".into()), d.path());
        assert!(matches!(u, Sharing::Unknown { pipe: true, .. }), "{u:?}");
        let none = from_driver(Err("x".into()), &d.path().join("nowhere"));
        assert!(
            matches!(none, Sharing::Unknown { pipe: false, .. }),
            "{none:?}"
        );
        assert_eq!(pipe_dir(None), std::path::Path::new("/tmp/nvidia-mps"));
        assert_eq!(
            pipe_dir(Some("/tmp/p".into())),
            std::path::Path::new("/tmp/p")
        );
    }

    /// Each note says how the ranks shared the GPU, and every one that it is no multi-GPU
    /// evidence.
    #[test]
    fn the_note_says_mps_or_time_slices_and_never_multi_gpu() {
        let mps = note(4, &Sharing::Mps);
        assert!(
            mps.starts_with("NCCL timed as 4 rank processes sharing GPU 0 under MPS"),
            "{mps}"
        );
        let slices = note(2, &Sharing::TimeSlices);
        assert!(
            slices.contains("sharing GPU 0 by time slices (no MPS"),
            "{slices}"
        );
        let unknown = note(
            2,
            &Sharing::Unknown {
                why: "old driver".into(),
                pipe: true,
            },
        );
        assert!(
            unknown.contains("did not say: old driver; an MPS control pipe was found"),
            "{unknown}"
        );
        for n in [mps, slices, unknown] {
            assert!(n.ends_with(", not multi-GPU evidence"), "{n}");
            assert!(
                !n.contains("under MPS") || !n.contains("time slices of"),
                "{n}"
            );
        }
    }
}
