//! Run-time compilation of kernels/*.cu with NVRTC for the exact GPU found, cached per
//! architecture for the life of the process.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::sys;

use crate::fabric::FabricError;

pub const COMMON: &str = include_str!("../../../kernels/common.cuh");
pub const ALLREDUCE: &str = include_str!("../../../kernels/allreduce.cu");
pub const PROBE: &str = include_str!("../../../kernels/probe.cu");
pub const CHECK: &str = include_str!("../../../kernels/check.cu");

/// The sources compiled for every GPU: (program name, source).
pub const PROGRAMS: [(&str, &str); 3] = [
    ("allreduce.cu", ALLREDUCE),
    ("probe.cu", PROBE),
    ("check.cu", CHECK),
];

/// What NVRTC is asked to produce for a GPU of compute capability `cc`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Machine code for exactly this GPU (`--gpu-architecture=sm_XY`).
    Cubin(String),
    /// PTX for the newest virtual architecture NVRTC knows below the GPU's, when NVRTC is
    /// older than the GPU; the driver finishes compiling it.
    Ptx(String),
}

impl Target {
    pub fn option(&self) -> String {
        match self {
            Target::Cubin(a) | Target::Ptx(a) => format!("--gpu-architecture={a}"),
        }
    }
}

/// Chooses the target from the compute capability and the architectures NVRTC lists
/// (as numbers, 90 for sm_90). `None` when NVRTC supports nothing at or below the GPU.
pub fn target_for(cc: (u32, u32), supported: &[i32]) -> Option<Target> {
    let want = (cc.0 * 10 + cc.1) as i32;
    if supported.is_empty() || supported.contains(&want) {
        return Some(Target::Cubin(format!("sm_{want}")));
    }
    supported
        .iter()
        .copied()
        .filter(|&a| a <= want)
        .max()
        .map(|a| Target::Ptx(format!("compute_{a}")))
}

/// True when libnvrtc can be loaded (cudarc panics on first use when it cannot).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<(), FabricError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: NVRTC returns a static string for every result code.
    let msg = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(r)) }
        .to_string_lossy()
        .into_owned();
    Err(FabricError::Device(format!("NVRTC {what} failed: {msg}")))
}

fn require_nvrtc() -> Result<(), FabricError> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(FabricError::Device(
            "NVRTC (libnvrtc.so) was not found; install the CUDA toolkit's NVRTC or \
             `pip install nvidia-cuda-nvrtc` and put its lib directory on LD_LIBRARY_PATH"
                .into(),
        ))
    }
}

/// NVRTC's version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32), FabricError> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    check(
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) },
        "version query",
    )?;
    Ok((major, minor))
}

/// Architectures NVRTC can compile for, as numbers (75, 80, ..., 121).
pub fn supported_archs() -> Result<Vec<i32>, FabricError> {
    require_nvrtc()?;
    let mut n: c_int = 0;
    // SAFETY: writes one int, then n ints.
    unsafe {
        check(sys::nvrtcGetNumSupportedArchs(&mut n), "architecture query")?;
        let mut v = vec![0 as c_int; n.max(0) as usize];
        check(
            sys::nvrtcGetSupportedArchs(v.as_mut_ptr()),
            "architecture query",
        )?;
        Ok(v)
    }
}

/// Compiled images for one target, one per program in [`PROGRAMS`] order.
#[derive(Debug)]
pub struct Images {
    pub target: Target,
    pub images: Vec<Vec<u8>>,
}

fn cache() -> &'static Mutex<HashMap<Target, Arc<Images>>> {
    static CACHE: OnceLock<Mutex<HashMap<Target, Arc<Images>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles every program for a GPU of compute capability `cc`, once per process.
pub fn images_for(cc: (u32, u32)) -> Result<Arc<Images>, FabricError> {
    let target = target_for(cc, &supported_archs()?).ok_or_else(|| {
        FabricError::Device(format!(
            "this NVRTC cannot compile for compute capability {}.{}; install an NVRTC at least \
             as new as the GPU",
            cc.0, cc.1
        ))
    })?;
    let mut map = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hit) = map.get(&target) {
        return Ok(hit.clone());
    }
    let mut images = Vec::new();
    for (name, src) in PROGRAMS {
        images.push(compile(name, src, &target)?);
    }
    let out = Arc::new(Images {
        target: target.clone(),
        images,
    });
    map.insert(target, out.clone());
    Ok(out)
}

/// The options passed to NVRTC for `target`.
pub fn options(target: &Target) -> Vec<String> {
    let mut o = vec![target.option(), "--std=c++17".into()];
    o.extend(super::kernels::defines());
    o
}

/// Compiles one program (with common.cuh as its only header) to a cubin or PTX image.
pub fn compile(name: &str, src: &str, target: &Target) -> Result<Vec<u8>, FabricError> {
    require_nvrtc()?;
    let opts = options(target);
    let c = |s: &str| {
        CString::new(s)
            .map_err(|_| FabricError::Device(format!("NUL byte in NVRTC input `{name}`")))
    };
    let (csrc, cname, hdr, hdr_name) = (c(src)?, c(name)?, c(COMMON)?, c("common.cuh")?);
    let copts: Vec<CString> = opts.iter().map(|o| c(o)).collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    let headers = [hdr.as_ptr()];
    let include_names = [hdr_name.as_ptr()];
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all strings are NUL-terminated and outlive the calls; the program is destroyed
    // below on every path.
    unsafe {
        check(
            sys::nvrtcCreateProgram(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                1,
                headers.as_ptr(),
                include_names.as_ptr(),
            ),
            "program creation",
        )?;
        let out = compile_program(prog, name, &opts, &opt_ptrs, target);
        let _ = sys::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// SAFETY: `prog` is a live NVRTC program.
unsafe fn compile_program(
    prog: sys::nvrtcProgram,
    name: &str,
    opts: &[String],
    opt_ptrs: &[*const c_char],
    target: &Target,
) -> Result<Vec<u8>, FabricError> {
    let r = sys::nvrtcCompileProgram(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(prog);
        return Err(FabricError::Device(format!(
            "NVRTC could not compile kernels/{name} with options [{}]: {}",
            opts.join(" "),
            log.trim()
        )));
    }
    let mut size = 0usize;
    let mut buf;
    match target {
        Target::Cubin(_) => {
            check(sys::nvrtcGetCUBINSize(prog, &mut size), "cubin size")?;
            buf = vec![0u8; size];
            check(
                sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char),
                "cubin copy",
            )?;
        }
        Target::Ptx(_) => {
            check(sys::nvrtcGetPTXSize(prog, &mut size), "PTX size")?;
            buf = vec![0u8; size];
            check(
                sys::nvrtcGetPTX(prog, buf.as_mut_ptr() as *mut c_char),
                "PTX copy",
            )?;
        }
    }
    Ok(buf)
}

/// SAFETY: `prog` is a live NVRTC program.
unsafe fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    if sys::nvrtcGetProgramLogSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS || size == 0
    {
        return "(no compiler log)".into();
    }
    let mut buf = vec![0u8; size];
    if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char)
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return "(compiler log unavailable)".into();
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVRTC13: [i32; 12] = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

    #[test]
    fn arch_string_comes_from_compute_capability() {
        assert_eq!(
            target_for((9, 0), &NVRTC13),
            Some(Target::Cubin("sm_90".into()))
        );
        assert_eq!(
            target_for((12, 1), &NVRTC13),
            Some(Target::Cubin("sm_121".into()))
        );
        assert_eq!(
            target_for((7, 5), &NVRTC13),
            Some(Target::Cubin("sm_75".into()))
        );
        assert_eq!(
            target_for((9, 0), &NVRTC13).unwrap().option(),
            "--gpu-architecture=sm_90"
        );
    }

    #[test]
    fn newer_gpu_than_nvrtc_gets_ptx_for_the_closest_older_arch() {
        assert_eq!(
            target_for((13, 0), &NVRTC13),
            Some(Target::Ptx("compute_121".into()))
        );
        assert_eq!(
            target_for((10, 1), &NVRTC13),
            Some(Target::Ptx("compute_100".into()))
        );
        assert_eq!(target_for((7, 0), &NVRTC13), None);
    }

    #[test]
    fn sources_are_embedded() {
        assert!(
            ALLREDUCE.contains("one_stage_pull_bf16")
                || ALLREDUCE.contains("AR_KERNELS(Bf16, bf16)")
        );
        assert!(PROBE.contains("latch_wait"));
        assert!(COMMON.contains("struct ArArgs"));
    }
}
