//! NCCL profiler plugin: the same library, loaded through `NCCL_PROFILER_PLUGIN`, watches
//! which algorithm, protocol and channel count NCCL ran for each allreduce and tallies it
//! against what the tuner pins for that size and group ([`super::audit`]).
//!
//! NCCL takes the first of its profiler symbols the library has, newest first (NVIDIA/nccl
//! `src/plugin/profiler.cc`): 2.28 looks up `ncclProfiler_v5`; 2.29 and 2.30 `ncclProfiler_v6`,
//! then v5; 2.31 `ncclProfiler_v7`, then v6 and v5 (headers in `src/include/plugin/profiler/`;
//! 2.32's sources were not read).
//! All three tables have the same functions, and the event descriptors of all three share
//! their layout up to the end of v5/v6's `coll`, the only member read here; v7's `coll` adds
//! the symmetric kernel's name, whether it ran one, and the caller's tag after it. For a
//! symmetric kernel 2.31 reports the variant's suffix as `algo` and an empty `proto` through
//! either table, so the audit counts it as another variant than any pin.
//!
//! `init` asks for collective events only (`ncclProfileColl`, the same bit in all three);
//! `startEvent` judges the call then and there (the descriptor holds all it needs) and hands
//! NCCL no handle, so NCCL sends no stop or state events for it; `finalize` writes the
//! communicator's [`Summary`], which names the table NCCL took, into the directory
//! `ARTUNE_NCCL_AUDIT` names. Every entry point returns ncclSuccess and catches panics.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Mutex;

use super::audit::{self, Expected, Ran, Summary};
use super::{log, Context, Logger, UserPins, LOG_INFO, LOG_WARN};
use crate::profile::Profile;

type NcclResult = c_int;
const NCCL_SUCCESS: NcclResult = 0;

/// `ncclProfileColl` in nccl_profiler.h's event types (the same bit from v5 to v7).
pub const PROFILE_COLL: u64 = 1 << 1;

/// The `coll` member of the v5 and v6 descriptors' union, and the start of v7's.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: *mut c_void,
}

/// `ncclProfilerEventDescr_v5_t`/`_v6_t` up to the end of `coll`; NCCL owns the whole union,
/// which is only ever read through this prefix.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventDescr {
    pub kind: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub coll: CollDescr,
}

/// The `coll` member of v7's union: v6's, then what v7 added.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollDescrV7 {
    pub v6: CollDescr,
    pub kernel_variant: *const c_char,
    /// C's `bool`, read as a byte: in other events these bytes belong to another member.
    pub is_sym_coll: u8,
    pub user_tag: u64,
}

/// `ncclProfilerEventDescr_v7_t` up to the end of `coll`, its union's largest member, so the
/// whole descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventDescrV7 {
    pub kind: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub coll: CollDescrV7,
}

/// What the audit reads of an event descriptor, whichever version NCCL sends.
pub trait Descr {
    fn kind(&self) -> u64;
    fn coll(&self) -> &CollDescr;
}

impl Descr for EventDescr {
    fn kind(&self) -> u64 {
        self.kind
    }
    fn coll(&self) -> &CollDescr {
        &self.coll
    }
}

impl Descr for EventDescrV7 {
    fn kind(&self) -> u64 {
        self.kind
    }
    fn coll(&self) -> &CollDescr {
        &self.coll.v6
    }
}

pub type Init = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    activation_mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    n_ranks: c_int,
    rank: c_int,
    log: Logger,
) -> NcclResult;
pub type StartEvent<D> =
    unsafe extern "C" fn(ctx: *mut c_void, handle: *mut *mut c_void, descr: *mut D) -> NcclResult;
pub type StopEvent = unsafe extern "C" fn(handle: *mut c_void) -> NcclResult;
/// The state arguments' union (`ncclProfilerEventStateArgs_vN_t`) is never read.
pub type RecordEventState =
    unsafe extern "C" fn(handle: *mut c_void, state: c_int, args: *mut c_void) -> NcclResult;
pub type Finalize = unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult;

/// `ncclProfiler_v5_t`, `_v6_t` and `_v7_t`: the same functions; `D` is the version's
/// event descriptor.
#[repr(C)]
pub struct Profiler<D> {
    pub name: *const c_char,
    pub init: Init,
    pub start_event: StartEvent<D>,
    pub stop_event: StopEvent,
    pub record_event_state: RecordEventState,
    pub finalize: Finalize,
}

// SAFETY: a pointer to a static string and function pointers, all immutable.
unsafe impl<D> Sync for Profiler<D> {}

const fn table<D: Descr, const V: u8>() -> Profiler<D> {
    Profiler {
        name: c"artune".as_ptr(),
        init: init::<V>,
        start_event: start_event::<D>,
        stop_event,
        record_event_state,
        finalize,
    }
}

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclProfiler_v5: Profiler<EventDescr> = table::<EventDescr, 5>();

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclProfiler_v6: Profiler<EventDescr> = table::<EventDescr, 6>();

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclProfiler_v7: Profiler<EventDescrV7> = table::<EventDescrV7, 7>();

/// Bytes per element of NCCL's datatype, by `ncclDatatypeToString`'s name.
pub fn datatype_size(name: &str) -> Option<u64> {
    Some(match name.trim_start_matches("nccl") {
        "Int8" | "Uint8" | "Char" | "Float8e4m3" | "Float8e5m2" => 1,
        "Float16" | "Half" | "Bfloat16" => 2,
        "Int32" | "Int" | "Uint32" | "Float32" | "Float" => 4,
        "Int64" | "Uint64" | "Float64" | "Double" => 8,
        _ => return None,
    })
}

/// One communicator's audit.
pub struct Audit {
    /// The profile's pins for this group (no validity applied: the audit says what the profile
    /// asks for even where the tuner refuses to follow it), or None.
    expect: Option<Context>,
    logger: Logger,
    comm_id: u64,
    dir: Option<PathBuf>,
    tally: Mutex<Summary>,
    /// The tuner's measurement override, whose value tags each call's record.
    force: &'static super::force::Force,
}

impl Audit {
    /// The audit of rank `rank` of `n_ranks` through profiler table `version` ("v7"): the
    /// tuner's decision for the same group, read from the same environment by the same code,
    /// and the profile's pins.
    pub fn from_env(
        version: &str,
        comm_id: u64,
        n_ranks: usize,
        n_nodes: usize,
        rank: i32,
        logger: Logger,
    ) -> Audit {
        let (_, why_not) = Context::from_env_or_why(n_ranks, n_nodes, None);
        let pins = UserPins::from_vars(&crate::profile::environment::current());
        let expect = std::env::var_os(super::ENV_PROFILE)
            .and_then(|p| Profile::load(std::path::Path::new(&p)).ok())
            .and_then(|p| {
                let mode = super::mode_from_env(None);
                Context::from_profile(&p, n_ranks, n_nodes, mode, None).ok()
            })
            .map(|c| c.respecting(&pins));
        let summary = Summary {
            nccl: super::loading_nccl_version(),
            profiler: version.into(),
            rank,
            nranks: n_ranks as i32,
            following: why_not.is_none(),
            why_not,
            user_pins: pins.algo,
            ..Summary::default()
        };
        Audit {
            expect,
            logger,
            comm_id,
            dir: std::env::var_os(audit::ENV_DIR).map(PathBuf::from),
            tally: Mutex::new(summary),
            force: &super::force::GLOBAL,
        }
    }

    /// What the profile asks for at `bytes`.
    pub fn expected(&self, bytes: u64) -> Expected {
        let Some(c) = &self.expect else {
            return Expected {
                pin: None,
                channels: None,
            };
        };
        let pin = c.pin(bytes).ok().flatten();
        Expected {
            pin,
            channels: pin
                .and(c.channels_at(bytes))
                .and_then(|ch| u32::try_from(ch).ok()),
        }
    }

    /// Counts one event, if it is an allreduce NCCL describes fully.
    ///
    /// # Safety
    /// `d` is NCCL's descriptor: its strings are null or NUL-terminated.
    pub unsafe fn event(&self, d: &impl Descr) {
        if d.kind() != PROFILE_COLL {
            return;
        }
        let c = d.coll();
        let text = |p: *const c_char| -> Option<&str> {
            // SAFETY: NCCL's static names, NUL-terminated, or null.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().ok())?
        };
        if text(c.func) != Some("AllReduce") {
            return;
        }
        let (Some(algo), Some(proto), Some(size)) = (
            text(c.algo),
            text(c.proto),
            text(c.datatype).and_then(datatype_size),
        ) else {
            return;
        };
        let bytes = c.count as u64 * size;
        let ran = Ran {
            algo,
            proto,
            channels: u32::from(c.n_channels),
        };
        let line = match self.tally.lock() {
            Ok(mut t) => {
                let forced = self.force.get().map(super::force::Forced::name);
                t.count_forced(bytes, self.expected(bytes), ran, forced)
            }
            Err(_) => return,
        };
        if let Some(line) = line {
            log(self.logger, LOG_WARN, &format!("audit: {line}"));
        }
    }

    /// The tally so far, with this process's tuner calls.
    pub fn summary(&self) -> Summary {
        let mut s = self.tally.lock().map(|t| t.clone()).unwrap_or_default();
        s.tuner_calls = super::TUNER_ALLREDUCE_CALLS.load(std::sync::atomic::Ordering::Relaxed);
        s
    }

    /// Logs the tally and writes it (atomically) into the audit directory, if one is named.
    pub fn finish(&self) {
        let s = self.summary();
        log(
            self.logger,
            LOG_INFO,
            &format!(
                "audit: rank {} of {}: {} of {} allreduces at pinned sizes ran as the profile pins ({} left to NCCL)",
                s.rank,
                s.nranks,
                s.agreed,
                s.judged,
                s.allreduces - s.judged
            ),
        );
        let Some(dir) = &self.dir else { return };
        let name = format!(
            "audit-{}-{:016x}-r{}.json",
            std::process::id(),
            self.comm_id,
            s.rank
        );
        let tmp = dir.join(format!(".{name}.tmp"));
        let written = serde_json::to_vec_pretty(&s)
            .map_err(|e| e.to_string())
            .and_then(|b| std::fs::write(&tmp, b).map_err(|e| e.to_string()))
            .and_then(|()| std::fs::rename(&tmp, dir.join(&name)).map_err(|e| e.to_string()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            log(
                self.logger,
                LOG_WARN,
                &format!("audit: cannot write {}: {e}", dir.join(name).display()),
            );
        }
    }
}

/// `init` of table `V`: the same for every version but for the name the summary gives it.
unsafe extern "C" fn init<const V: u8>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    activation_mask: *mut c_int,
    _comm_name: *const c_char,
    n_nodes: c_int,
    n_ranks: c_int,
    rank: c_int,
    logger: Logger,
) -> NcclResult {
    if ctx.is_null() {
        return NCCL_SUCCESS;
    }
    // SAFETY: NCCL passes a valid out-pointer; cleared first so a panic leaves it NULL.
    unsafe { *ctx = std::ptr::null_mut() };
    let built = catch_unwind(AssertUnwindSafe(|| {
        Audit::from_env(
            &format!("v{V}"),
            comm_id,
            usize::try_from(n_ranks).unwrap_or(0),
            usize::try_from(n_nodes).unwrap_or(0),
            rank,
            logger,
        )
    }));
    if let Ok(a) = built {
        if !activation_mask.is_null() {
            // SAFETY: NCCL's int* for the events it should send (null checked).
            unsafe { *activation_mask = PROFILE_COLL as c_int };
        }
        unsafe { *ctx = Box::into_raw(Box::new(a)).cast() };
    }
    NCCL_SUCCESS
}

unsafe extern "C" fn start_event<D: Descr>(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut D,
) -> NcclResult {
    if !handle.is_null() {
        // SAFETY: NCCL's out-pointer (null checked): no handle, so no stop or state events.
        unsafe { *handle = std::ptr::null_mut() };
    }
    if ctx.is_null() || descr.is_null() {
        return NCCL_SUCCESS;
    }
    // SAFETY: a context from init, not yet finalized; NCCL's descriptor for this call.
    let (a, d) = unsafe { (&*(ctx as *const Audit), &*descr) };
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe { a.event(d) }));
    NCCL_SUCCESS
}

unsafe extern "C" fn stop_event(_handle: *mut c_void) -> NcclResult {
    NCCL_SUCCESS
}

unsafe extern "C" fn record_event_state(
    _handle: *mut c_void,
    _state: c_int,
    _args: *mut c_void,
) -> NcclResult {
    NCCL_SUCCESS
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    if !ctx.is_null() {
        // SAFETY: ctx came from Box::into_raw in init and is freed once, here.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let a = unsafe { Box::from_raw(ctx as *mut Audit) };
            a.finish();
        }));
    }
    NCCL_SUCCESS
}

#[cfg(test)]
mod tests;
