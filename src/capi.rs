//! C ABI over [`Profile::load`] and [`Profile::select`], declared in `src/artune.h`.
//!
//! 1. `artune_profile_open(path, &handle)` loads and validates a profile.
//! 2. `artune_select(handle, tp, mode, bytes, &out)` answers per message, without allocating.
//! 3. `artune_check(handle, nccl)` applies the validity rule (`profile::validity`) for this
//!    machine, as every consumer does: ARTUNE_OK to follow it, ARTUNE_NOT_VALID not to, the
//!    verdict in `artune_last_error()` either way.
//! 4. `artune_profile_close(handle)` frees it; `artune_last_error()` explains the last failure
//!    on the calling thread.
//!
//! Every function returns an integer code (0 ok, 1 "no answer, keep your default", negative on
//! error), checks its pointers, and catches panics: nothing unwinds into C.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use crate::allreduce::{Backend, Mode};
use crate::profile::validity::{Allow, Validity};
use crate::profile::{Profile, Query, Selection, Selector};

pub const ARTUNE_OK: c_int = 0;
/// The profile has no answer for this query (no group, or above its largest size).
pub const ARTUNE_NO_ANSWER: c_int = 1;
/// `artune_check`: the profile is not valid for this machine (ABI 3).
pub const ARTUNE_NOT_VALID: c_int = 2;
/// A null pointer, a mode that is neither graph nor eager, or a path that is not UTF-8.
pub const ARTUNE_ERR_ARGUMENT: c_int = -1;
/// The file could not be read.
pub const ARTUNE_ERR_READ: c_int = -2;
/// The file is not a valid profile (syntax, schema version, limits).
pub const ARTUNE_ERR_INVALID: c_int = -3;
/// A bug in artune (a caught panic).
pub const ARTUNE_ERR_INTERNAL: c_int = -4;

pub const ARTUNE_MODE_GRAPH: c_int = 0;
pub const ARTUNE_MODE_EAGER: c_int = 1;

/// Version of this ABI; bumped on any incompatible change to artune.h, and when a function is
/// added (3: `artune_check`), so a caller can tell it is there.
pub const ARTUNE_ABI_VERSION: c_int = 3;

/// An open profile (opaque to C) and the one [`Selector`] every consumer answers through.
pub struct ArtuneProfile {
    simulated: bool,
    selector: Selector,
    profile: Profile,
}

impl ArtuneProfile {
    fn new(profile: Profile) -> ArtuneProfile {
        ArtuneProfile {
            simulated: profile.simulated,
            selector: profile.selector(),
            profile,
        }
    }

    /// `artune_check`'s code for the rule's verdict `v`, with the verdict as the last error.
    fn check(&self, v: &Validity, allow: Allow) -> c_int {
        set_error(&v.verdict(allow));
        match v.followed(allow) {
            true => ARTUNE_OK,
            false => ARTUNE_NOT_VALID,
        }
    }

    /// The same answer as `Profile::select` with default placement.
    fn select(&self, tp: usize, mode: Mode, bytes: u64) -> Selection {
        self.selector.select(
            Query {
                tp,
                mode,
                gpus: None,
            },
            bytes,
        )
    }
}

/// The answer of `artune_select`, laid out as `artune_selection` in artune.h.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArtuneSelection {
    /// Backend id as profiles write it (static string, never freed), or NULL without an answer.
    pub backend: *const c_char,
    /// Index into ARTUNE_BACKEND_* (the order of `Backend::ALL`), or -1.
    pub backend_code: c_int,
    /// 1 when the profile was measured on the simulated fabric.
    pub simulated: c_int,
    /// Median time measured at the serving bucket, microseconds.
    pub expected_us: f64,
    /// Bytes the serving bucket covers up to.
    pub bucket_bytes: u64,
    /// Device memory per GPU the backend's buffers need (0 for NCCL).
    pub buffer_bytes: u64,
    /// What a caller without artune's kernels runs (ABI 2): `backend` where engines have a
    /// path of its shape, else the profile's choice among those (for an island schedule).
    pub fallback: *const c_char,
    pub fallback_code: c_int,
}

/// Bytes the error keeps room for from a thread's first call: every message `artune_select`
/// writes fits, so it never allocates, answer or not.
const ERROR_ROOM: usize = 1024;

thread_local! {
    /// NUL-terminated bytes: cleared and refilled in place.
    static LAST_ERROR: RefCell<Vec<u8>> = RefCell::new({
        let mut v = Vec::with_capacity(ERROR_ROOM);
        v.push(0);
        v
    });
}

/// Sets the error from format arguments, written in place (no `format!`, no allocation while
/// the message fits [`ERROR_ROOM`]); `append` keeps what is there and adds to it.
fn write_error(args: std::fmt::Arguments, append: bool) {
    use std::io::Write;
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        let keep = if append { e.len().saturating_sub(1) } else { 0 };
        e.truncate(keep);
        let _ = e.write_fmt(args);
        for b in &mut e[keep..] {
            if *b == 0 {
                *b = b' ';
            }
        }
        e.push(0);
    });
}

fn set_error(msg: &str) {
    write_error(format_args!("{msg}"), false);
}

/// Runs `f`, turning a panic into ARTUNE_ERR_INTERNAL with a message.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_error("internal error in artune (a bug); the caller should keep its default");
        ARTUNE_ERR_INTERNAL
    })
}

/// NUL-terminated backend ids, in `Backend::ALL` order, made once from the backend table.
fn ids() -> &'static [CString] {
    static IDS: std::sync::OnceLock<Vec<CString>> = std::sync::OnceLock::new();
    IDS.get_or_init(|| {
        Backend::ALL
            .iter()
            .map(|b| CString::new(b.id()).unwrap_or_default())
            .collect()
    })
}

/// A backend's id as a C string and its ARTUNE_BACKEND_* code.
fn c_backend(b: Backend) -> (*const c_char, c_int) {
    let i = Backend::ALL.iter().position(|x| *x == b).unwrap_or(0);
    (ids()[i].as_ptr(), i as c_int)
}

/// Opens and validates the profile at `path`; on success stores a handle in `*out`.
///
/// # Safety
/// `path` is null or a NUL-terminated string; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn artune_profile_open(
    path: *const c_char,
    out: *mut *mut ArtuneProfile,
) -> c_int {
    guard(|| {
        if path.is_null() || out.is_null() {
            set_error("artune_profile_open: path and out must not be NULL");
            return ARTUNE_ERR_ARGUMENT;
        }
        // SAFETY: checked non-null; the caller promises NUL termination.
        unsafe { *out = std::ptr::null_mut() };
        let Ok(p) = unsafe { CStr::from_ptr(path) }.to_str() else {
            set_error("artune_profile_open: the path is not UTF-8");
            return ARTUNE_ERR_ARGUMENT;
        };
        if p.is_empty() {
            set_error(
                "artune_profile_open: the path is empty; name the file that artune tune --out wrote",
            );
            return ARTUNE_ERR_ARGUMENT;
        }
        match Profile::load(Path::new(p)) {
            Ok(profile) => {
                unsafe { *out = Box::into_raw(Box::new(ArtuneProfile::new(profile))) };
                set_error("");
                ARTUNE_OK
            }
            Err(e) => {
                set_error(&e.to_string());
                match e {
                    crate::Error::Read { .. } => ARTUNE_ERR_READ,
                    _ => ARTUNE_ERR_INVALID,
                }
            }
        }
    })
}

/// Selects the backend for one allreduce of `bytes` bytes on `tp` GPUs (ranks on GPUs 0..tp)
/// in `mode` (ARTUNE_MODE_GRAPH or ARTUNE_MODE_EAGER). Does not allocate on success.
///
/// # Safety
/// `profile` is null or a live handle from `artune_profile_open`; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn artune_select(
    profile: *const ArtuneProfile,
    tp: u32,
    mode: c_int,
    bytes: u64,
    out: *mut ArtuneSelection,
) -> c_int {
    guard(|| {
        // No answer, unless one is found below: what *out holds on every other return.
        let none = ArtuneSelection {
            backend: std::ptr::null(),
            backend_code: -1,
            simulated: 0,
            expected_us: f64::NAN,
            bucket_bytes: 0,
            buffer_bytes: 0,
            fallback: std::ptr::null(),
            fallback_code: -1,
        };
        if !out.is_null() {
            // SAFETY: checked non-null; writable per the contract.
            unsafe { *out = none };
        }
        if profile.is_null() || out.is_null() {
            set_error("artune_select: profile and out must not be NULL");
            return ARTUNE_ERR_ARGUMENT;
        }
        let mode = match mode {
            ARTUNE_MODE_GRAPH => Mode::Graph,
            ARTUNE_MODE_EAGER => Mode::Eager,
            m => {
                write_error(format_args!("artune_select: mode {m} is neither ARTUNE_MODE_GRAPH (0) nor ARTUNE_MODE_EAGER (1)"), false);
                return ARTUNE_ERR_ARGUMENT;
            }
        };
        // What `artune select` refuses (exit 2) this refuses: no group has one GPU, no message
        // is empty.
        if tp < 2 || bytes == 0 {
            write_error(format_args!(
                "artune_select: tp {tp} and {bytes} bytes: a group has at least 2 GPUs and a message at least 1 byte"
            ), false);
            return ARTUNE_ERR_ARGUMENT;
        }
        // SAFETY: checked non-null; a live handle per the contract.
        let h = unsafe { &*profile };
        let mut sel = ArtuneSelection {
            simulated: c_int::from(h.simulated),
            ..none
        };
        let rc = match h.select(tp as usize, mode, bytes) {
            Selection::Chosen {
                backend,
                fallback,
                expected_us,
                bucket_bytes,
                buffer_bytes,
                ..
            } => {
                (sel.backend, sel.backend_code) = c_backend(backend);
                (sel.fallback, sel.fallback_code) = c_backend(fallback);
                sel.expected_us = expected_us;
                sel.bucket_bytes = bucket_bytes;
                sel.buffer_bytes = buffer_bytes;
                set_error("");
                ARTUNE_OK
            }
            Selection::Unknown(why) => {
                write_error(
                    format_args!("TP{tp} {} {bytes} bytes: {why}", mode.id()),
                    false,
                );
                ARTUNE_NO_ANSWER
            }
        };
        unsafe { *out = sel };
        rc
    })
}

/// Applies the validity rule to the profile for this machine (read through NVML and sysfs):
/// ARTUNE_OK where the caller may follow it (valid here, or overridden by
/// `ARTUNE_ALLOW_INVALID` / `ARTUNE_ALLOW_SIMULATED`), ARTUNE_NOT_VALID where not; the verdict
/// ("valid here; driver … → …: …") is `artune_last_error()` either way. `nccl_version` is the
/// NCCL the caller runs ("2.28.9"), or NULL to leave it unchecked.
///
/// # Safety
/// `profile` is null or a live handle; `nccl_version` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn artune_check(
    profile: *const ArtuneProfile,
    nccl_version: *const c_char,
) -> c_int {
    guard(|| {
        if profile.is_null() {
            set_error("artune_check: profile must not be NULL");
            return ARTUNE_ERR_ARGUMENT;
        }
        // SAFETY: checked non-null; the caller promises NUL termination.
        let nccl = (!nccl_version.is_null()).then(|| {
            unsafe { CStr::from_ptr(nccl_version) }
                .to_string_lossy()
                .into_owned()
        });
        // SAFETY: checked non-null; a live handle per the contract.
        let h = unsafe { &*profile };
        let (allow, odd) = Allow::from_env();
        let rc = h.check(&crate::profile::validity::here(&h.profile, nccl), allow);
        // A value that is neither on nor off is taken as off: the verdict says so.
        if let Some(odd) = odd {
            write_error(format_args!("; {odd}"), true);
        }
        rc
    })
}

/// Frees a handle from `artune_profile_open`; NULL is ignored.
///
/// # Safety
/// `profile` is null or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn artune_profile_close(profile: *mut ArtuneProfile) {
    if !profile.is_null() {
        // SAFETY: from Box::into_raw in artune_profile_open, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(profile) })));
    }
}

/// The last error on this thread ("" if none), valid until the next artune call on this thread.
#[no_mangle]
pub extern "C" fn artune_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr().cast::<c_char>()))
        .unwrap_or(c"".as_ptr())
}

/// The ABI version this library implements (ARTUNE_ABI_VERSION in artune.h).
#[no_mangle]
pub extern "C" fn artune_abi_version() -> c_int {
    catch_unwind(|| ARTUNE_ABI_VERSION).unwrap_or(ARTUNE_ERR_INTERNAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = include_str!("artune.h");

    /// Names of `#[no_mangle]` functions in this file.
    fn exported() -> Vec<String> {
        let src = include_str!("capi.rs");
        let mut names = Vec::new();
        let mut lines = src.lines();
        while let Some(l) = lines.next() {
            if l.trim() == "#[no_mangle]" {
                let sig = lines.next().unwrap_or_default();
                let name = sig
                    .split("fn ")
                    .nth(1)
                    .and_then(|s| s.split('(').next())
                    .unwrap_or_default();
                names.push(name.trim().to_string());
            }
        }
        names
    }

    #[test]
    fn header_declares_every_exported_function() {
        let names = exported();
        assert_eq!(names.len(), 6, "{names:?}");
        for n in names {
            assert!(
                HEADER.contains(&format!(" {n}(")),
                "src/artune.h does not declare {n}"
            );
        }
    }

    /// The value of `#define name` in src/artune.h.
    fn header_number(name: &str) -> i64 {
        let line = HEADER
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("{name}"));
        line.split_whitespace()
            .nth(2)
            .unwrap()
            .trim_matches(|c| c == '(' || c == ')')
            .parse()
            .unwrap()
    }

    #[test]
    fn header_constants_match() {
        let num = header_number;
        for (name, v) in [
            ("ARTUNE_OK", ARTUNE_OK),
            ("ARTUNE_NO_ANSWER", ARTUNE_NO_ANSWER),
            ("ARTUNE_NOT_VALID", ARTUNE_NOT_VALID),
            ("ARTUNE_ERR_ARGUMENT", ARTUNE_ERR_ARGUMENT),
            ("ARTUNE_ERR_READ", ARTUNE_ERR_READ),
            ("ARTUNE_ERR_INVALID", ARTUNE_ERR_INVALID),
            ("ARTUNE_ERR_INTERNAL", ARTUNE_ERR_INTERNAL),
            ("ARTUNE_MODE_GRAPH", ARTUNE_MODE_GRAPH),
            ("ARTUNE_MODE_EAGER", ARTUNE_MODE_EAGER),
            ("ARTUNE_ABI_VERSION", ARTUNE_ABI_VERSION),
        ] {
            assert_eq!(num(name), i64::from(v), "{name}");
        }
        for (i, b) in Backend::ALL.iter().enumerate() {
            assert_eq!(ids()[i].to_str().unwrap(), b.id());
            assert_eq!(
                num(&format!("ARTUNE_BACKEND_{}", b.id().to_ascii_uppercase())),
                i as i64
            );
        }
    }

    #[test]
    fn open_select_close_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        crate::export::sample::profile()
            .write_atomic(&path)
            .unwrap();
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        let mut h = std::ptr::null_mut();
        unsafe {
            assert_eq!(artune_profile_open(cpath.as_ptr(), &mut h), ARTUNE_OK);
            let mut s = std::mem::zeroed::<ArtuneSelection>();
            assert_eq!(
                artune_select(h, 2, ARTUNE_MODE_GRAPH, 1000, &mut s),
                ARTUNE_OK
            );
            assert_eq!(
                CStr::from_ptr(s.backend).to_str().unwrap(),
                "one_stage_pull"
            );
            assert_eq!(s.bucket_bytes, 1024);
            assert_eq!(s.simulated, 1);
            assert_eq!(
                artune_select(h, 8, ARTUNE_MODE_GRAPH, 1000, &mut s),
                ARTUNE_NO_ANSWER
            );
            assert!(s.backend.is_null());
            let err = CStr::from_ptr(artune_last_error()).to_str().unwrap();
            assert!(err.contains("no group"), "{err}");
            assert_eq!(artune_select(h, 2, 7, 1000, &mut s), ARTUNE_ERR_ARGUMENT);
            assert_eq!(
                artune_select(h, 2, ARTUNE_MODE_GRAPH, 1000, std::ptr::null_mut()),
                ARTUNE_ERR_ARGUMENT
            );
            artune_profile_close(h);
        }
    }

    /// A profile whose answers are set by hand: TP2 graph buckets at 8 KiB, 64 KiB and 1 MiB
    /// choosing one_stage_pull, two_stage_push and nccl_ring_simple, at made-up times.
    fn handmade() -> crate::profile::Profile {
        let mut p = crate::export::sample::profile_with(
            "pcie-4x-1switch",
            &[2],
            &[8 << 10, 64 << 10, 1 << 20],
        );
        let g = p
            .groups
            .iter_mut()
            .find(|g| g.tp == 2 && g.mode == Mode::Graph)
            .unwrap();
        let picks = [
            (Backend::OneStagePull, 11.5),
            (Backend::TwoStagePush, 22.25),
            (Backend::NcclRingSimple, 99.0),
        ];
        for (bucket, (b, us)) in g.buckets.iter_mut().zip(picks) {
            bucket.choice = b;
            let t = bucket.results.get_mut(&b).unwrap();
            (t.median_us, t.ci_low_us, t.ci_high_us) = (us, us - 0.5, us + 0.5);
        }
        let m = g.memory.get_mut(&Backend::OneStagePull).unwrap();
        (m.bytes_per_gpu, m.required_bytes_per_gpu) = (4_000_000, None);
        // What the backend needs to serve (the profile's required size) outranks its total.
        let m = g.memory.get_mut(&Backend::TwoStagePush).unwrap();
        (m.bytes_per_gpu, m.required_bytes_per_gpu) = (999, Some(123_456));
        p
    }

    #[test]
    fn select_answers_as_the_header_says() {
        // Expectations from src/artune.h: the bucket serving a message is the smallest measured
        // size >= bytes; above the largest, below a smallest above the 4 KiB latency floor, or
        // without the group: ARTUNE_NO_ANSWER, backend NULL, code -1; buffer_bytes 0 for NCCL.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        handmade().write_atomic(&path).unwrap();
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        let num = |name: &str| header_number(name) as c_int;
        // (backend id, bucket_bytes, expected_us, buffer_bytes), or None: no answer.
        type Want = Option<(&'static str, u64, f64, u64)>;
        let rows: [(u32, c_int, u64, Want); 9] = [
            (2, ARTUNE_MODE_GRAPH, 4096, None),
            (2, ARTUNE_MODE_GRAPH, 8191, None),
            (
                2,
                ARTUNE_MODE_GRAPH,
                8192,
                Some(("one_stage_pull", 8192, 11.5, 4_000_000)),
            ),
            (
                2,
                ARTUNE_MODE_GRAPH,
                8193,
                Some(("two_stage_push", 65536, 22.25, 123_456)),
            ),
            (
                2,
                ARTUNE_MODE_GRAPH,
                65536,
                Some(("two_stage_push", 65536, 22.25, 123_456)),
            ),
            (
                2,
                ARTUNE_MODE_GRAPH,
                65537,
                Some(("nccl_ring_simple", 1 << 20, 99.0, 0)),
            ),
            (
                2,
                ARTUNE_MODE_GRAPH,
                1 << 20,
                Some(("nccl_ring_simple", 1 << 20, 99.0, 0)),
            ),
            (2, ARTUNE_MODE_GRAPH, (1 << 20) + 1, None),
            (4, ARTUNE_MODE_GRAPH, 8192, None),
        ];
        let mut h = std::ptr::null_mut();
        unsafe {
            let rc = artune_profile_open(cpath.as_ptr(), &mut h);
            let err = CStr::from_ptr(artune_last_error()).to_str().unwrap();
            assert_eq!(rc, ARTUNE_OK, "{err}");
            for (tp, mode, bytes, want) in rows {
                let mut s = std::mem::zeroed::<ArtuneSelection>();
                let rc = artune_select(h, tp, mode, bytes, &mut s);
                let at = format!("TP{tp} mode {mode} {bytes} bytes");
                assert_eq!(s.simulated, 1, "{at}");
                match want {
                    None => {
                        assert_eq!(rc, ARTUNE_NO_ANSWER, "{at}");
                        assert!(s.backend.is_null(), "{at}");
                        assert_eq!(s.backend_code, -1, "{at}");
                    }
                    Some((id, bucket, us, buffer)) => {
                        assert_eq!(rc, ARTUNE_OK, "{at}");
                        assert_eq!(CStr::from_ptr(s.backend).to_str().unwrap(), id, "{at}");
                        let code = num(&format!("ARTUNE_BACKEND_{}", id.to_ascii_uppercase()));
                        assert_eq!(s.backend_code, code, "{at}");
                        assert_eq!(s.bucket_bytes, bucket, "{at}");
                        assert_eq!(s.expected_us, us, "{at}");
                        assert_eq!(s.buffer_bytes, buffer, "{at}");
                    }
                }
            }
            artune_profile_close(h);
        }
        // A group whose smallest bucket is at the latency floor answers below it.
        let p = crate::export::sample::profile_with("pcie-4x-1switch", &[2], &[4096, 65536]);
        let h = ArtuneProfile::new(p);
        assert!(matches!(
            h.select(2, Mode::Graph, 1),
            Selection::Chosen {
                bucket_bytes: 4096,
                ..
            }
        ));
    }

    #[test]
    fn open_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("g.json");
        std::fs::write(&garbage, "{ not json").unwrap();
        let mut h = std::ptr::null_mut();
        unsafe {
            assert_eq!(
                artune_profile_open(std::ptr::null(), &mut h),
                ARTUNE_ERR_ARGUMENT
            );
            let missing = CString::new(dir.path().join("nope.json").to_str().unwrap()).unwrap();
            assert_eq!(
                artune_profile_open(missing.as_ptr(), &mut h),
                ARTUNE_ERR_READ
            );
            assert!(h.is_null());
            let g = CString::new(garbage.to_str().unwrap()).unwrap();
            assert_eq!(artune_profile_open(g.as_ptr(), &mut h), ARTUNE_ERR_INVALID);
            assert!(!CStr::from_ptr(artune_last_error()).to_bytes().is_empty());
            artune_profile_close(std::ptr::null_mut());
        }
    }

    /// The rule's verdict as a C caller gets it: the code, and the verdict as the last error.
    #[test]
    fn check_gives_the_rules_verdict_and_says_it() {
        let mut p = crate::export::sample::profile();
        p.simulated = false;
        p.versions.driver = Some("570.86.15".into());
        let mut now = p.topology.clone();
        now.origin.kind = "nvml".into();
        let h = ArtuneProfile::new(p.clone());
        let said = || {
            unsafe { CStr::from_ptr(artune_last_error()) }
                .to_str()
                .unwrap()
                .to_string()
        };
        let mut upgraded = now.clone();
        upgraded.host.driver = Some("999.1".into());
        let v = crate::profile::validity::validity(&p, &upgraded);
        assert_eq!(h.check(&v, Allow::default()), ARTUNE_OK);
        assert!(
            said().starts_with("valid here; driver 570.86.15 → 999.1"),
            "{}",
            said()
        );
        let mut fewer = now.clone();
        fewer.gpus[3].pcie.max_width = Some(4);
        let v = crate::profile::validity::validity(&p, &fewer);
        assert_eq!(h.check(&v, Allow::default()), ARTUNE_NOT_VALID);
        assert!(
            said().contains("GPU 3 PCIe link Gen5 x16 → Gen5 x4"),
            "{}",
            said()
        );
        let allow = Allow {
            invalid: true,
            ..Allow::default()
        };
        assert_eq!(h.check(&v, allow), ARTUNE_OK);
        assert!(
            said().ends_with("followed because ARTUNE_ALLOW_INVALID=1"),
            "{}",
            said()
        );
        assert_eq!(
            unsafe { artune_check(std::ptr::null(), std::ptr::null()) },
            ARTUNE_ERR_ARGUMENT
        );
    }
}
