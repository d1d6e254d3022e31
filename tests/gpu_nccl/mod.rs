//! The NCCL library as the GPU tests find it: explained when absent, loaded from a wheel.

mod channels;
mod switch;

use super::skip;
use artune::fabric::cuda::nccl;

#[test]
fn nccl_absence_is_explained_or_skips_when_nccl_is_installed() {
    match nccl::library() {
        Ok(lib) => skip(format!(
            "nccl_absence_is_explained: skipped: NCCL {} is installed ({})",
            nccl::version_string(lib.version),
            lib.path
        )),
        Err(e) => {
            assert!(nccl::nccl_version().is_none());
            assert!(
                e.contains("pip install nvidia-nccl-cu13") || e.contains("ARTUNE_NCCL_LIB"),
                "{e}"
            );
        }
    }
}

#[test]
fn nccl_wheel_lookup_loads_libnccl_so_2_or_skips_without_a_wheel() {
    let wheels = nccl::wheel_libraries();
    if wheels.is_empty() {
        skip("nccl_wheel_lookup: skipped: no nvidia-nccl wheel in python3's site-packages".into());
        return;
    }
    for w in wheels {
        let v = nccl::version_of(&w).unwrap_or_else(|e| panic!("{w}: {e}"));
        println!("nccl wheel found and loaded: {w} (NCCL {v})");
    }
}
