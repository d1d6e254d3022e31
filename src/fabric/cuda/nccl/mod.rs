//! NCCL, loaded at run time from wherever users installed it.
//!
//! cudarc's NCCL loader only asks the dynamic loader for `libnccl.so` (and numbered names
//! other than `.so.2`), so it misses `libnccl.so.2`, the only name pip's nvidia-nccl-cu12/cu13
//! wheels and Debian's libnccl2 ship, and it panics when nothing is found. We dlopen NCCL
//! ourselves, in this order: the file named by `ARTUNE_NCCL_LIB`; the system library
//! (`libnccl.so`, then `libnccl.so.2`, through the loader's search path); the pip wheel in the
//! active virtualenv or conda prefix, then in python3's `sys.path`. Types and constants come
//! from `cudarc::nccl::sys`.
//!
//! NCCL has no per-communicator setting for the algorithm or protocol (ncclConfig_t carries
//! none up to 2.30), but reads `NCCL_ALGO` and `NCCL_PROTO` when a communicator is created.
//! A pinned backend therefore runs in worker processes started with those two variables set
//! (see the coordinator); nothing here changes the environment of a live process.
//!
//! Communicators are non-blocking (NCCL 2.14+, `ncclConfig_t.blocking = 0`): setup, enqueue
//! and teardown return at once and are polled with `ncclCommGetAsyncError` against a deadline
//! ([`super::watchdog`]), so a hang in NCCL ends in `ncclCommAbort` instead of a process that
//! never returns. An NCCL without those entry points gets blocking `ncclCommInitAll`
//! communicators (collectives are still watched; their setup cannot be).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId};

use super::watchdog::{self, Poll, Waited};
use crate::fabric::Dtype;

/// The variables that pin `algo` x `proto` for the communicators a process creates (NCCL reads
/// them then): from NCCL 2.24 for allreduce alone, leaving other collectives NCCL's choice.
pub fn pin_env(algo: &str, proto: &str) -> [(String, String); 2] {
    let per_collective = library().is_ok_and(|l| l.version >= 22400);
    let value = |v: &str| match per_collective {
        true => format!("allreduce:{v}"),
        false => v.to_string(),
    };
    [
        ("NCCL_ALGO".into(), value(algo)),
        ("NCCL_PROTO".into(), value(proto)),
    ]
}

/// The environment variable that names a libnccl file to use.
pub const ENV_LIB: &str = "ARTUNE_NCCL_LIB";

/// What to tell a user who has no NCCL.
pub const INSTALL_HINT: &str =
    "install it with `pip install nvidia-nccl-cu13` (or nvidia-nccl-cu12 for CUDA 12) or set ARTUNE_NCCL_LIB to the path of libnccl.so.2";

/// Where pip wheels put the library, relative to a site-packages directory.
const WHEEL_PATHS: [&str; 3] = [
    "nvidia/nccl/lib/libnccl.so.2",
    "nvidia/cu13/lib/libnccl.so.2",
    "nvidia/cu12/lib/libnccl.so.2",
];

/// The libraries to try, in order. `env_lib` wins alone when set: a user who names a file
/// means that file. `site_dirs` are site-packages directories; `exists` filters wheel paths.
pub fn candidates(
    env_lib: Option<&str>,
    site_dirs: &[PathBuf],
    exists: impl Fn(&Path) -> bool,
) -> Vec<String> {
    if let Some(p) = env_lib.filter(|p| !p.is_empty()) {
        return vec![p.to_string()];
    }
    let mut out = vec!["libnccl.so".to_string(), "libnccl.so.2".to_string()];
    for dir in site_dirs {
        for rel in WHEEL_PATHS {
            let p = dir.join(rel);
            if exists(&p) {
                let s = p.display().to_string();
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }
    out
}

/// site-packages directories of the active virtualenv/conda prefix, then python3's sys.path.
pub fn site_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = std::env::var_os(var) {
            let lib = PathBuf::from(prefix).join("lib");
            if let Ok(rd) = std::fs::read_dir(&lib) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with("python") {
                        dirs.push(e.path().join("site-packages"));
                    }
                }
            }
        }
    }
    dirs.extend(python_sys_path());
    dirs
}

/// python3's sys.path, or nothing when python3 is absent or slow.
fn python_sys_path() -> Vec<PathBuf> {
    let child = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys; print('\\n'.join(p for p in sys.path if p))",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return Vec::new();
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Vec::new();
            }
        }
    }
    let Ok(out) = child.wait_with_output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// Formats ncclGetVersion's code: 22803 -> "2.28.3" (codes below 10000 are pre-2.9 style).
pub fn version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

type Res = c_int;
pub type Comm = *mut c_void;

const SUCCESS: Res = ncclResult_t::ncclSuccess as Res;
const IN_PROGRESS: Res = ncclResult_t::ncclInProgress as Res;

/// `ncclConfig_t` up to `netName`, as NCCL 2.17 laid it out. NCCL copies `size` bytes of it
/// and fills fields added later with their defaults, so this prefix works with every later
/// version; but it resets every field newer than the `version` the config states (init.cc,
/// "check version"), so the CTA bounds hold only where the config says 2.17 or later.
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

/// NCCL's per-communicator CTA bounds (`ncclConfig_t.minCTAs`/`maxCTAs`); None: NCCL's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ctas {
    pub min: Option<c_int>,
    pub max: Option<c_int>,
}

impl Ctas {
    /// The bounds for a run: a forced channel count fixes both (it wins over room for ranks
    /// sharing a GPU, which bounds only the maximum).
    pub fn of(forced: Option<c_int>, max: Option<c_int>) -> Ctas {
        match forced {
            Some(c) => Ctas {
                min: Some(c),
                max: Some(c),
            },
            None => Ctas { min: None, max },
        }
    }
}

/// NCCL_VERSION(2, 17, 0): the first NCCL whose config carries the CTA bounds.
const CTA_BOUNDS: i32 = 21700;

/// The version a config states to `lib_version`'s NCCL (see [`Config`]).
fn config_version(lib_version: i32) -> u32 {
    if lib_version >= CTA_BOUNDS {
        CTA_BOUNDS as u32
    } else {
        21400
    }
}

/// Whether a NCCL of `version` applies the CTA bounds of a config (where it takes configs).
fn takes_cta_bounds(takes_config: bool, version: i32) -> bool {
    takes_config && version >= CTA_BOUNDS
}

/// NCCL_CONFIG_UNDEF_INT: "let NCCL choose".
const UNDEF: c_int = c_int::MIN;

impl Config {
    /// NCCL_CONFIG_INITIALIZER, made non-blocking, stating the version the fields are read
    /// as: 2.17 (where `minCTAs`/`maxCTAs` came) for a library that has them, else 2.14.
    fn nonblocking(lib_version: i32) -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: config_version(lib_version),
            blocking: 0,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
        }
    }
}

/// The entry points of non-blocking communicators (NCCL 2.14+).
#[derive(Clone, Copy)]
struct NonBlocking {
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> Res,
    init_rank_config:
        unsafe extern "C" fn(*mut Comm, c_int, ncclUniqueId, c_int, *mut Config) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    get_async_error: unsafe extern "C" fn(Comm, *mut Res) -> Res,
    finalize: unsafe extern "C" fn(Comm) -> Res,
}

/// The NCCL entry points we use.
pub struct Lib {
    pub path: String,
    pub version: i32,
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    comm_abort: Option<unsafe extern "C" fn(Comm) -> Res>,
    nonblocking: Option<NonBlocking>,
    #[allow(clippy::type_complexity)]
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Res,
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local string or NULL.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null C string from the loader.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// SAFETY: `h` is a live dlopen handle and `T` is the symbol's true function type.
unsafe fn sym<T: Copy>(h: *mut c_void, name: &str) -> Option<T> {
    let c = CString::new(name).ok()?;
    let p = libc::dlsym(h, c.as_ptr());
    if p.is_null() {
        None
    } else {
        Some(std::mem::transmute_copy::<*mut c_void, T>(&p))
    }
}

impl Lib {
    /// Opens one candidate; Err says why it could not be used.
    fn open(name: &str) -> Result<Lib, String> {
        let c = CString::new(name).map_err(|_| format!("`{name}` contains a NUL byte"))?;
        // SAFETY: loading a shared library; it stays loaded for the life of the process.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(dlerror());
        }
        let missing = |s: &str| format!("{name} has no symbol {s}; it is not a usable NCCL");
        // SAFETY: symbol types follow nccl.h.
        unsafe {
            let get_version: unsafe extern "C" fn(*mut c_int) -> Res =
                sym(h, "ncclGetVersion").ok_or_else(|| missing("ncclGetVersion"))?;
            let mut version = 0;
            if get_version(&mut version) != 0 {
                return Err(format!("ncclGetVersion failed in {name}"));
            }
            Ok(Lib {
                path: name.to_string(),
                version,
                get_error_string: sym(h, "ncclGetErrorString")
                    .ok_or_else(|| missing("ncclGetErrorString"))?,
                get_last_error: sym(h, "ncclGetLastError"),
                comm_init_all: sym(h, "ncclCommInitAll")
                    .ok_or_else(|| missing("ncclCommInitAll"))?,
                comm_destroy: sym(h, "ncclCommDestroy")
                    .ok_or_else(|| missing("ncclCommDestroy"))?,
                comm_abort: sym(h, "ncclCommAbort"),
                nonblocking: (|| {
                    Some(NonBlocking {
                        get_unique_id: sym(h, "ncclGetUniqueId")?,
                        init_rank_config: sym(h, "ncclCommInitRankConfig")?,
                        group_start: sym(h, "ncclGroupStart")?,
                        group_end: sym(h, "ncclGroupEnd")?,
                        get_async_error: sym(h, "ncclCommGetAsyncError")?,
                        finalize: sym(h, "ncclCommFinalize")?,
                    })
                })(),
                all_reduce: sym(h, "ncclAllReduce").ok_or_else(|| missing("ncclAllReduce"))?,
            })
        }
    }

    fn error(&self, code: Res, comm: Comm) -> String {
        // SAFETY: NCCL returns static strings.
        let mut s = unsafe { CStr::from_ptr((self.get_error_string)(code)) }
            .to_string_lossy()
            .into_owned();
        if let Some(last) = self.get_last_error {
            // SAFETY: NULL comm is allowed; the string is NCCL's.
            let p = unsafe { last(comm) };
            if !p.is_null() {
                let detail = unsafe { CStr::from_ptr(p) }.to_string_lossy();
                if !detail.is_empty() {
                    s = format!("{s} ({detail})");
                }
            }
        }
        s
    }
}

/// The process's NCCL, looked up once.
pub fn library() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let env = std::env::var(ENV_LIB).ok();
        let dirs = if env.as_deref().is_some_and(|e| !e.is_empty()) {
            Vec::new()
        } else {
            site_dirs()
        };
        let mut tried = Vec::new();
        for c in candidates(env.as_deref(), &dirs, |p| p.is_file()) {
            match Lib::open(&c) {
                Ok(lib) => return Ok(lib),
                Err(e) => tried.push(format!("{c}: {e}")),
            }
        }
        let why = tried.join("; ");
        Err(match env.filter(|e| !e.is_empty()) {
            Some(e) => {
                format!("{ENV_LIB}={e} could not be loaded ({why}); point it at libnccl.so.2")
            }
            None => format!("NCCL was not found (tried {why}); {INSTALL_HINT}"),
        })
    })
    .as_ref()
    .map_err(|e| e.clone())
}

/// libnccl.so.2 files of pip wheels found in the active environment or python3's sys.path
/// (the third place [`library`] looks).
pub fn wheel_libraries() -> Vec<String> {
    candidates(None, &site_dirs(), |p| p.is_file())
        .into_iter()
        .skip(2)
        .collect()
}

/// Loads the NCCL at `path` and returns its version, e.g. "2.28.9".
pub fn version_of(path: &str) -> Result<String, String> {
    Lib::open(path).map(|l| version_string(l.version))
}

/// The NCCL version artune would use, e.g. "2.28.3"; None when NCCL cannot be loaded.
pub fn nccl_version() -> Option<String> {
    library().ok().map(|l| version_string(l.version))
}

pub fn datatype(d: Dtype) -> c_int {
    (match d {
        Dtype::Bf16 => ncclDataType_t::ncclBfloat16,
        Dtype::Fp16 => ncclDataType_t::ncclFloat16,
        Dtype::Fp32 => ncclDataType_t::ncclFloat32,
    }) as c_int
}

/// Communicators of one clique, one per device in `devices` order; finalized and destroyed
/// on drop, or aborted.
pub struct Comms {
    lib: &'static Lib,
    comms: Vec<Comm>,
    /// Created non-blocking: calls return at once and are polled.
    nonblocking: bool,
    /// Aborted: NCCL frees them; never touch them again.
    aborted: bool,
}

// Neither Send nor Sync (the raw communicators keep it so): NCCL allows one thread per
// communicator at a time, and a worker drives its communicators from its one thread.

/// A new NCCL unique id (ncclGetUniqueId), in hex, for the coordinator to hand to every rank.
pub fn unique_id() -> Result<String, String> {
    let lib = library()?;
    let nb = lib
        .nonblocking
        .ok_or("this NCCL has no ncclGetUniqueId/ncclCommInitRankConfig (NCCL 2.14+ needed)")?;
    // SAFETY: zeroed bytes are a valid ncclUniqueId to be filled in.
    let mut id: ncclUniqueId = unsafe { std::mem::zeroed() };
    // SAFETY: `id` is a valid out-pointer.
    let r = unsafe { (nb.get_unique_id)(&mut id) };
    if r != SUCCESS {
        return Err(format!(
            "ncclGetUniqueId failed: {}",
            lib.error(r, std::ptr::null_mut())
        ));
    }
    Ok(id
        .internal
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect())
}

fn parse_id(hex: &str) -> Option<ncclUniqueId> {
    // SAFETY: zeroed bytes are a valid ncclUniqueId.
    let mut id: ncclUniqueId = unsafe { std::mem::zeroed() };
    let raw = hex.as_bytes();
    if raw.len() != 2 * id.internal.len() {
        return None;
    }
    for (i, pair) in raw.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        id.internal[i] = u8::from_str_radix(s, 16).ok()? as c_char;
    }
    Some(id)
}

/// Reads every communicator's state: done when all are ready, failed when any failed.
fn poll_all(states: impl IntoIterator<Item = Poll>) -> Poll {
    let mut out = Poll::Done;
    for s in states {
        match s {
            Poll::Failed(e) => return Poll::Failed(e),
            Poll::Pending => out = Poll::Pending,
            Poll::Done => {}
        }
    }
    out
}

impl Lib {
    /// Whether communicators take CTA bounds in their config (NCCL 2.17+), which forcing a
    /// channel count needs.
    pub fn forces_channels(&self) -> bool {
        takes_cta_bounds(self.nonblocking.is_some(), self.version)
    }
}

impl Comms {
    /// Creates this process's rank `rank` of `nranks` from the unique id `id_hex` (see
    /// [`unique_id`]), non-blocking, on the current context's device. NCCL reads NCCL_ALGO and
    /// NCCL_PROTO from the environment the process was started with. Setup that does not
    /// finish within `limit` is aborted.
    pub fn init_rank(
        lib: &'static Lib,
        id_hex: &str,
        rank: usize,
        nranks: usize,
        limit: Duration,
    ) -> Result<Comms, String> {
        Comms::init_rank_ctas(lib, id_hex, rank, nranks, limit, Ctas::default())
    }

    /// [`Comms::init_rank`] with NCCL's per-communicator `minCTAs`/`maxCTAs`: its run-time
    /// channels, which connect.cc bounds by `maxCTAs` and then duplicates up to `minCTAs`, so
    /// both at one count force it; `maxCTAs` alone leaves room for ranks sharing one GPU.
    pub fn init_rank_ctas(
        lib: &'static Lib,
        id_hex: &str,
        rank: usize,
        nranks: usize,
        limit: Duration,
        ctas: Ctas,
    ) -> Result<Comms, String> {
        let Some(nb) = lib.nonblocking else {
            if nranks != 1 {
                return Err(format!(
                    "NCCL {} has no ncclCommInitRankConfig; artune needs NCCL 2.14 or later",
                    version_string(lib.version)
                ));
            }
            let mut comm = std::ptr::null_mut();
            let mut dev: cudarc::driver::sys::CUdevice = 0;
            // SAFETY: writes the current context's device.
            unsafe { cudarc::driver::sys::cuCtxGetDevice(&mut dev) };
            // SAFETY: one communicator for one device.
            let r = unsafe { (lib.comm_init_all)(&mut comm, 1, &dev) };
            if r != SUCCESS {
                return Err(format!(
                    "ncclCommInitAll failed: {}",
                    lib.error(r, std::ptr::null_mut())
                ));
            }
            return Ok(Comms {
                lib,
                comms: vec![comm],
                nonblocking: false,
                aborted: false,
            });
        };
        let id = parse_id(id_hex).ok_or("the NCCL unique id is malformed")?;
        let mut c = Comms {
            lib,
            comms: vec![std::ptr::null_mut()],
            nonblocking: true,
            aborted: false,
        };
        let mut cfg = Config::nonblocking(lib.version);
        cfg.min_ctas = ctas.min.unwrap_or(UNDEF);
        cfg.max_ctas = ctas.max.unwrap_or(UNDEF);
        // SAFETY: out-pointer into `comms`; NCCL copies the config before returning.
        let r = unsafe {
            (nb.init_rank_config)(
                &mut c.comms[0],
                nranks as c_int,
                id,
                rank as c_int,
                &mut cfg,
            )
        };
        if r != SUCCESS && r != IN_PROGRESS {
            let e = format!(
                "ncclCommInitRankConfig failed for rank {rank}: {}",
                lib.error(r, c.comms[0])
            );
            c.abort();
            return Err(e);
        }
        match watchdog::wait_real(limit, || c.state(0)) {
            Ok(()) => Ok(c),
            Err(w) => {
                c.abort();
                Err(match w {
                    Waited::Failed(e) => format!("NCCL communicator setup failed: {e}"),
                    Waited::Expired(t) => format!(
                        "NCCL communicator setup did not finish within {:.0} s; it was aborted",
                        t.as_secs_f64()
                    ),
                })
            }
        }
    }

    /// Rank `rank`'s state as ncclCommGetAsyncError reports it (blocking communicators are
    /// always done).
    pub fn state(&self, rank: usize) -> Poll {
        let comm = self.comms[rank];
        let Some(nb) = self.lib.nonblocking.filter(|_| self.nonblocking) else {
            return Poll::Done;
        };
        if comm.is_null() || self.aborted {
            return Poll::Failed("the communicator was aborted".into());
        }
        let mut state = SUCCESS;
        // SAFETY: a live communicator and a valid out-pointer.
        let r = unsafe { (nb.get_async_error)(comm, &mut state) };
        match (r, state) {
            (SUCCESS, SUCCESS) => Poll::Done,
            (SUCCESS, IN_PROGRESS) => Poll::Pending,
            (SUCCESS, e) | (e, _) => Poll::Failed(self.lib.error(e, comm)),
        }
    }

    /// Queues an allreduce (sum) on `stream` for rank `rank`. A non-blocking communicator
    /// still busy with the call (connecting on first use) is waited for up to `limit`.
    ///
    /// # Safety
    /// The pointers are device buffers of at least `count` elements on the rank's
    /// device, and `stream` belongs to that device.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        rank: usize,
        send: u64,
        recv: u64,
        count: usize,
        dtype: Dtype,
        stream: *mut c_void,
        limit: Duration,
    ) -> Result<(), Waited> {
        let comm = self.comms[rank];
        let r = (self.lib.all_reduce)(
            send as *const c_void,
            recv as *mut c_void,
            count,
            datatype(dtype),
            ncclRedOp_t::ncclSum as c_int,
            comm,
            stream,
        );
        match r {
            SUCCESS => Ok(()),
            IN_PROGRESS => watchdog::wait_real(limit, || self.state(rank)),
            e => Err(Waited::Failed(format!(
                "ncclAllReduce failed: {}",
                self.lib.error(e, comm)
            ))),
        }
    }

    /// Aborts every communicator: NCCL's kernels stop and NCCL frees what it holds. Graphs
    /// that captured them should be destroyed first (NCCL waits for them).
    pub fn abort(&mut self) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        // NCCL needs every rank of a node aborted together: one group call.
        let group = self.lib.nonblocking.filter(|_| self.comms.len() > 1);
        if let Some(nb) = group {
            // SAFETY: plain NCCL group call, closed below.
            unsafe { (nb.group_start)() };
        }
        for &c in &self.comms {
            if c.is_null() {
                continue;
            }
            // SAFETY: a communicator created above, aborted once and never used again.
            unsafe {
                match self.lib.comm_abort {
                    Some(abort) => abort(c),
                    None => (self.lib.comm_destroy)(c),
                };
            }
        }
        if let Some(nb) = group {
            // SAFETY: closes the group opened above.
            unsafe { (nb.group_end)() };
        }
    }

    /// Whether the communicators were aborted.
    pub fn is_aborted(&self) -> bool {
        self.aborted
    }
}

impl Drop for Comms {
    /// Non-blocking communicators are finalized (polled, bounded) before they are destroyed;
    /// ones that do not finalize in time are aborted. Aborted ones are NCCL's to free.
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        if let Some(nb) = self.lib.nonblocking.filter(|_| self.nonblocking) {
            let mut ok = true;
            for &c in self.comms.iter().filter(|c| !c.is_null()) {
                // SAFETY: a live communicator, finalized once.
                let r = unsafe { (nb.finalize)(c) };
                ok &= r == SUCCESS || r == IN_PROGRESS;
            }
            let n = self.comms.len();
            ok = ok
                && watchdog::wait_real(watchdog::DRAIN_DEADLINE, || {
                    poll_all((0..n).map(|r| self.state(r)))
                })
                .is_ok();
            if !ok {
                self.abort();
                return;
            }
        }
        for c in self.comms.drain(..) {
            if !c.is_null() {
                // SAFETY: created by NCCL above and destroyed once.
                unsafe { (self.lib.comm_destroy)(c) };
            }
        }
    }
}

#[cfg(test)]
mod tests;
