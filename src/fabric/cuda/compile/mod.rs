//! Run-time compilation of kernels/*.cu with NVRTC for the exact GPU found, cached per
//! architecture for the life of the process.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::sys;
use sha2::{Digest, Sha256};

use crate::allreduce::Dtype;
use crate::fabric::{DeviceError, FabricError};
use crate::fabric::{LoadedKernels, LoadedProgram};

pub const COMMON: &str = include_str!("../../../../kernels/common.cuh");
pub const ALLREDUCE: &str = include_str!("../../../../kernels/allreduce.cu");
pub const ISLAND: &str = include_str!("../../../../kernels/island.cu");
pub const PROBE: &str = include_str!("../../../../kernels/probe.cu");
pub const CHECK: &str = include_str!("../../../../kernels/check.cu");
pub const CE_SUM: &str = include_str!("../../../../kernels/ce_sum.cu");

/// The sources compiled for every GPU: (program name, source).
pub const PROGRAMS: [(&str, &str); 5] = [
    ("allreduce.cu", ALLREDUCE),
    ("probe.cu", PROBE),
    ("check.cu", CHECK),
    ("island.cu", ISLAND),
    ("ce_sum.cu", CE_SUM),
];

/// One thing NVRTC compiles: a program, or one instantiation line's share of its kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileUnit {
    /// The program's file name, with the instantiation where it was split (`probe.cu`,
    /// `ce_sum-bf16.cu`, `allreduce-ar_pull-bf16.cu`): the cache file and the compiler's
    /// messages name it.
    pub name: String,
    pub src: String,
    /// The program it is part of (`allreduce.cu`).
    pub program: &'static str,
    /// The element type its kernels reduce; None where it serves every type.
    pub dtype: Option<Dtype>,
}

/// What NVRTC compiles for a GPU: every program, those that instantiate their kernels with
/// top-level macro lines (`AR_PULL_KERNELS(Bf16, bf16)`) split into one unit per such line.
/// Units compile side by side, so the set costs its longest unit: a first tune on a freshly
/// booted H200 waited 7.1 s for kernels/allreduce.cu whole, and 3.16 s for the set split per
/// element type while its workers were ready after 1.79 s. Split per line, the longest unit
/// for sm_90 takes 1.28 s where the longest per element type took 2.87 s (NVRTC 13.0, one unit
/// at a time on a 2-core machine).
pub fn units() -> &'static [CompileUnit] {
    static UNITS: OnceLock<Vec<CompileUnit>> = OnceLock::new();
    UNITS.get_or_init(|| {
        let mut out = Vec::new();
        for (name, src) in PROGRAMS {
            let mut lines: Vec<(&str, Dtype)> = Vec::new();
            for l in src.lines().filter_map(instantiation) {
                if !lines.contains(&l) {
                    lines.push(l);
                }
            }
            // The macro is named only where the program has several.
            let several = lines.iter().any(|(m, _)| *m != lines[0].0);
            let stem = name.trim_end_matches(".cu");
            for &(mac, d) in &lines {
                let part = match several {
                    true => format!("-{}", mac.to_lowercase().trim_end_matches("_kernels")),
                    false => String::new(),
                };
                out.extend(instantiating(src, (mac, d)).map(|src| CompileUnit {
                    name: format!("{stem}{part}-{}.cu", d.id()),
                    src,
                    program: name,
                    dtype: Some(d),
                }));
            }
            if lines.is_empty() {
                out.push(CompileUnit {
                    name: name.into(),
                    src: src.into(),
                    program: name,
                    dtype: None,
                });
            }
        }
        out
    })
}

/// The element type whose units every set of kernels includes, so a profile's record of its
/// images ([`Images::record`]) is the same whichever types a command loaded.
pub const RECORDED: Dtype = Dtype::Bf16;

/// The units a command reducing `dtypes` loads: those of no element type, of these types and
/// of [`RECORDED`]. A first tune (bf16) compiles 8 of the 20 units: on a 2-core machine, one
/// at a time for sm_90, 5.0 s of NVRTC of 13.2 s for all, its longest unit alike (1.07 s).
pub fn units_for(dtypes: &[Dtype]) -> Vec<&'static CompileUnit> {
    let types = loaded_types(dtypes);
    units()
        .iter()
        .filter(|u| u.dtype.is_none_or(|d| types.contains(&d)))
        .collect()
}

/// The element types whose kernels a command measuring `dtypes` loads: those and
/// [`RECORDED`], in [`Dtype::ALL`]'s order.
pub fn loaded_types(dtypes: &[Dtype]) -> Vec<Dtype> {
    let wanted = |d: &Dtype| *d == RECORDED || dtypes.contains(d);
    Dtype::ALL.into_iter().filter(wanted).collect()
}

/// The macro and element type a top-level line such as `AR_PULL_KERNELS(Bf16, bf16)` (a
/// macro, the device type, the kernels' suffix) instantiates.
fn instantiation(line: &str) -> Option<(&str, Dtype)> {
    let (mac, rest) = line.trim().split_once('(')?;
    let (ty, suffix) = rest.strip_suffix(')')?.split_once(',')?;
    let upper = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
    let d = Dtype::ALL.into_iter().find(|d| d.id() == suffix.trim())?;
    (!mac.is_empty() && mac.chars().all(upper) && ty.trim().eq_ignore_ascii_case(d.id()))
        .then_some((mac, d))
}

/// `src` keeping, of its instantiation lines, only `keep`'s. None when `src` has no such line
/// (it is not split).
fn instantiating(src: &str, keep: (&str, Dtype)) -> Option<String> {
    let mut kept = false;
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        match instantiation(line) {
            Some(i) if i != keep => continue,
            Some(_) => kept = true,
            None => {}
        }
        out.push_str(line);
        out.push('\n');
    }
    kept.then_some(out)
}

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
    Err(FabricError::Device(DeviceError::Nvrtc {
        what: what.into(),
        detail: msg,
    }))
}

fn require_nvrtc() -> Result<(), FabricError> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(FabricError::Device(DeviceError::NoNvrtc))
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

/// Compiled images for one target, one per unit of [`Images::units`], in that order. Made
/// only by [`images_for`], so each image is fresh NVRTC output or a cache file whose header,
/// key (NVRTC, target, options, sources), length and SHA-256 were checked: what
/// [`super::module::Module::load`] requires.
#[derive(Debug)]
pub struct Images {
    target: Target,
    nvrtc: (i32, i32),
    units: Vec<&'static CompileUnit>,
    images: Vec<Vec<u8>>,
}

impl Images {
    pub fn target(&self) -> &Target {
        &self.target
    }

    pub fn images(&self) -> &[Vec<u8>] {
        &self.images
    }

    /// The units compiled, in the order of [`Images::images`].
    pub fn units(&self) -> &[&'static CompileUnit] {
        &self.units
    }

    /// What the profile records of these images (see [`record_units`]).
    pub fn record(&self) -> LoadedKernels {
        let loaded: Vec<(&CompileUnit, &[u8])> = (self.units.iter().copied())
            .zip(self.images.iter().map(Vec::as_slice))
            .collect();
        record_units(self.nvrtc, &self.target, &loaded)
    }
}

/// The record of `loaded` units: per program, its source and the images of its units of no
/// element type or of [`RECORDED`], which every load includes ([`units_for`]), so a tune
/// that loaded one type and an engine that loaded all record the same.
pub fn record_units(
    nvrtc: (i32, i32),
    target: &Target,
    loaded: &[(&CompileUnit, &[u8])],
) -> LoadedKernels {
    let images: Vec<(&str, &str, Vec<u8>)> = PROGRAMS
        .iter()
        .filter_map(|&(name, src)| {
            let mut image = Vec::new();
            for (u, img) in loaded.iter().filter(|(u, _)| u.program == name) {
                if u.dtype.is_none_or(|d| d == RECORDED) {
                    image.extend_from_slice(u.name.as_bytes());
                    image.push(0);
                    image.extend_from_slice(img);
                }
            }
            (!image.is_empty()).then_some((name, src, image))
        })
        .collect();
    let programs: Vec<(&str, &str, &[u8])> = (images.iter())
        .map(|(n, s, i)| (*n, *s, i.as_slice()))
        .collect();
    record(nvrtc, target, &programs)
}

/// The record of compiled programs `(name, source, image)` for `target` by NVRTC `nvrtc`: the
/// hashes that tell the kernels a tune timed from any others.
pub fn record(
    nvrtc: (i32, i32),
    target: &Target,
    programs: &[(&str, &str, &[u8])],
) -> LoadedKernels {
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    LoadedKernels {
        nvrtc: format!("{}.{}", nvrtc.0, nvrtc.1),
        target: match target {
            Target::Cubin(a) | Target::Ptx(a) => a.clone(),
        },
        programs: programs
            .iter()
            .map(|(name, src, img)| LoadedProgram {
                program: name.to_string(),
                source_sha256: hex(&source_digest(name, src, target)),
                image_sha256: hex(&Sha256::digest(img)),
            })
            .collect(),
    }
}

/// SHA-256 of what artune hands NVRTC for one program: the compiler options, the program's
/// name and source, and the shared header.
fn source_digest(name: &str, src: &str, target: &Target) -> Vec<u8> {
    let mut h = Sha256::new();
    for o in options(target) {
        h.update(o.as_bytes());
        h.update([0]);
    }
    for part in [name, src, COMMON] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize().to_vec()
}

/// Images compiled in this process, by target and the units' element types.
type Compiled = HashMap<(Target, Vec<Dtype>), Arc<Images>>;

fn cache() -> &'static Mutex<Compiled> {
    static CACHE: OnceLock<Mutex<Compiled>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles the units of `dtypes` ([`units_for`]) for a GPU of compute capability `cc`, once
/// per process.
pub fn images_for(cc: (u32, u32), dtypes: &[Dtype]) -> Result<Arc<Images>, FabricError> {
    let target = target_for(cc, &supported_archs()?).ok_or(DeviceError::NvrtcTooOld { cc })?;
    let key = (target.clone(), loaded_types(dtypes));
    let mut map = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hit) = map.get(&key) {
        return Ok(hit.clone());
    }
    let started = std::time::Instant::now();
    let nvrtc = nvrtc_version()?;
    let dir = cache_dir();
    let units = units_for(&key.1);
    // The programs are independent: compiled side by side, the set costs the longest one.
    let images = std::thread::scope(|s| {
        let jobs: Vec<_> = units
            .iter()
            .map(|u| {
                let (dir, target) = (dir.as_deref(), &target);
                s.spawn(move || {
                    let started = std::time::Instant::now();
                    let img = compile_cached(dir, nvrtc, &u.name, &u.src, target);
                    tracing::debug!(
                        "kernels/{} ready in {:.2} s",
                        u.name,
                        started.elapsed().as_secs_f64()
                    );
                    img
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.join().unwrap_or_else(|_| {
                    Err(FabricError::Device(DeviceError::Nvrtc {
                        what: "compilation".into(),
                        detail: "NVRTC panicked".into(),
                    }))
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    tracing::info!(
        "kernels for {} ready in {:.2} s ({} units; cache {})",
        target.option(),
        started.elapsed().as_secs_f64(),
        units.len(),
        dir.as_deref()
            .map_or_else(|| "off".into(), |d| d.display().to_string())
    );
    let out = Arc::new(Images {
        target,
        nvrtc,
        units,
        images,
    });
    map.insert(key, out.clone());
    Ok(out)
}

/// Where compiled kernels are kept between runs: `ARTUNE_CACHE_DIR`, else the user's cache
/// directory. A tune and the `check --measure` after it then compile once; `ARTUNE_CACHE_DIR=`
/// (empty) turns the cache off.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("ARTUNE_CACHE_DIR") {
        Some(d) if d.is_empty() => None,
        Some(d) => Some(PathBuf::from(d)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("artune").join("kernels")),
    }
}

/// The file an image is kept in: named by everything that makes it (NVRTC, options, the
/// program and the shared header), so a changed source or a new NVRTC never reads a stale one.
pub fn cache_file(
    dir: &Path,
    nvrtc: (i32, i32),
    name: &str,
    src: &str,
    target: &Target,
) -> PathBuf {
    let mut h = Sha256::new();
    h.update(format!("nvrtc {}.{}\0", nvrtc.0, nvrtc.1));
    h.update(source_digest(name, src, target));
    let hex: String = h
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    let ext = match target {
        Target::Cubin(_) => "cubin",
        Target::Ptx(_) => "ptx",
    };
    dir.join(format!("{}-{hex}.{ext}", name.trim_end_matches(".cu")))
}

/// [`compile`], through the cache in `dir` when there is one. The cache is an optimisation:
/// a file that cannot be read or written is compiled (and then left) as if there were none.
fn compile_cached(
    dir: Option<&Path>,
    nvrtc: (i32, i32),
    name: &str,
    src: &str,
    target: &Target,
) -> Result<Vec<u8>, FabricError> {
    let Some(dir) = dir else {
        return compile(name, src, target);
    };
    let file = cache_file(dir, nvrtc, name, src, target);
    let key = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match std::fs::read(&file) {
        Ok(bytes) => match unseal(&bytes, &key) {
            Ok(img) => return Ok(img.to_vec()),
            // A full disk, a kill during a write or another tool leaves such files: loading
            // one is undefined behaviour in the driver, so it is rebuilt instead.
            Err(why) => tracing::warn!(
                "kernel cache file {} is unusable ({why}); compiling it again",
                file.display()
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::debug!("cannot read {}: {e}", file.display()),
    }
    let img = compile(name, src, target)?;
    if let Err(e) = store(dir, &file, &seal(&img, &key)) {
        tracing::debug!("not caching {}: {e}", file.display());
    }
    Ok(img)
}

/// First line of every cache file.
const MAGIC: &[u8] = b"artune kernel cache 1\n";

/// A cache file: [`MAGIC`], the key (the file's name, which hashes NVRTC, target, options and
/// sources), the image's length and SHA-256, then the image.
fn seal(img: &[u8], key: &str) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend(format!("{key}\n{}\n", img.len()).as_bytes());
    out.extend(Sha256::digest(img));
    out.extend(img);
    out
}

/// The image in a cache file, or why the file cannot be trusted: wrong header, another key
/// (a file renamed or copied from elsewhere), a length or digest that does not match.
fn unseal<'a>(bytes: &'a [u8], key: &str) -> Result<&'a [u8], &'static str> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("not an artune cache file")?;
    let head = format!("{key}\n");
    let rest = rest
        .strip_prefix(head.as_bytes())
        .ok_or("made for another GPU, NVRTC or source")?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("truncated header")?;
    let len: usize = std::str::from_utf8(&rest[..nl])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("unreadable length")?;
    let rest = &rest[nl + 1..];
    if rest.len() < 32 {
        return Err("truncated header");
    }
    let (digest, img) = rest.split_at(32);
    if img.len() != len {
        return Err("truncated or padded image");
    }
    if img.is_empty() || Sha256::digest(img).as_slice() != digest {
        return Err("its contents do not match their checksum");
    }
    Ok(img)
}

/// Writes `bytes` to `file` whole or not at all (a temporary file, synced, renamed into
/// place), so a reader never sees half an image.
fn store(dir: &Path, file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(file).map_err(|e| e.error)?;
    Ok(())
}

/// The options passed to NVRTC for `target`.
pub fn options(target: &Target) -> Vec<String> {
    let mut o = vec![target.option(), "--std=c++17".into()];
    o.extend(super::layout::defines());
    o
}

/// Compiles one program (with common.cuh as its only header) to a cubin or PTX image.
pub fn compile(name: &str, src: &str, target: &Target) -> Result<Vec<u8>, FabricError> {
    require_nvrtc()?;
    let opts = options(target);
    let c = |s: &str| {
        CString::new(s).map_err(|_| {
            FabricError::Device(DeviceError::Bug(format!(
                "NUL byte in NVRTC input `{name}`"
            )))
        })
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
        return Err(FabricError::Device(DeviceError::Compile {
            program: name.into(),
            options: opts.join(" "),
            log: log.trim().into(),
        }));
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
mod tests;
