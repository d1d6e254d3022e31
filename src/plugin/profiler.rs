//! NCCL profiler plugin: the same library, loaded through `NCCL_PROFILER_PLUGIN`, watches
//! which algorithm, protocol and channel count NCCL ran for each allreduce and tallies it
//! against what the tuner pins for that size and group ([`super::audit`]).
//!
//! NCCL looks `ncclProfiler_v6` up (2.29 onwards; NVIDIA/nccl `src/include/plugin/profiler/
//! profiler_v6.h`), or `ncclProfiler_v5` (2.28, `profiler_v5.h`). Both tables have the same
//! functions; their event descriptors share the layout up to and including the `coll` member
//! of the union, the only one read here. Later NCCLs try their newer symbols first and fall
//! back to v6.
//!
//! `init` asks for collective events only (`ncclProfileColl`); `startEvent` judges the call
//! then and there (the descriptor holds all it needs) and hands NCCL no handle, so NCCL sends
//! no stop or state events for it; `finalize` writes the communicator's [`Summary`] into the
//! directory `ARTUNE_NCCL_AUDIT` names. Every entry point returns ncclSuccess and catches panics.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Mutex;

use super::audit::{self, Expected, Ran, Summary};
use super::{log, Context, Logger, UserPins, LOG_INFO, LOG_WARN};
use crate::profile::Profile;

type NcclResult = c_int;
const NCCL_SUCCESS: NcclResult = 0;

/// `ncclProfileColl` in nccl_profiler.h's event types.
pub const PROFILE_COLL: u64 = 1 << 1;

/// The `coll` member of the descriptor's union (v5 and v6 alike).
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

/// `ncclProfilerEventDescr_v5_t`/`_v6_t` up to the end of `coll`; NCCL owns the whole (larger)
/// union, which is only ever read through this prefix.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventDescr {
    pub kind: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub coll: CollDescr,
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
pub type StartEvent = unsafe extern "C" fn(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescr,
) -> NcclResult;
pub type StopEvent = unsafe extern "C" fn(handle: *mut c_void) -> NcclResult;
pub type RecordEventState =
    unsafe extern "C" fn(handle: *mut c_void, state: c_int, args: *mut c_void) -> NcclResult;
pub type Finalize = unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult;

/// `ncclProfiler_v5_t` and `ncclProfiler_v6_t` (the same functions).
#[repr(C)]
pub struct ProfilerV5 {
    pub name: *const c_char,
    pub init: Init,
    pub start_event: StartEvent,
    pub stop_event: StopEvent,
    pub record_event_state: RecordEventState,
    pub finalize: Finalize,
}

// SAFETY: a pointer to a static string and function pointers, all immutable.
unsafe impl Sync for ProfilerV5 {}

const TABLE: ProfilerV5 = ProfilerV5 {
    name: c"artune".as_ptr(),
    init,
    start_event,
    stop_event,
    record_event_state,
    finalize,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclProfiler_v5: ProfilerV5 = TABLE;

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclProfiler_v6: ProfilerV5 = TABLE;

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
}

impl Audit {
    /// The audit of rank `rank` of `n_ranks`: the tuner's decision for the same group, read
    /// from the same environment by the same code, and the profile's pins.
    pub fn from_env(
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
            profiler: "v5/v6".into(),
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
    pub unsafe fn event(&self, d: &EventDescr) {
        if d.kind != PROFILE_COLL {
            return;
        }
        let c = d.coll;
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
            Ok(mut t) => t.count(bytes, self.expected(bytes), ran),
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

unsafe extern "C" fn init(
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

unsafe extern "C" fn start_event(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescr,
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
mod tests {
    use super::*;
    use crate::allreduce::Mode;
    use crate::export::sample;

    /// Offsets of NCCL's profiler_v5.h/v6.h descriptor (LP64): type, parentObj, rank, then the
    /// union (8-aligned); in `coll`: seqNumber, func, sendBuff, recvBuff, count, root,
    /// datatype, nChannels, nWarps, algo, proto, parentGroup.
    #[test]
    fn descriptor_layout_matches_the_headers() {
        use std::mem::offset_of;
        assert_eq!(
            (
                offset_of!(EventDescr, kind),
                offset_of!(EventDescr, parent_obj),
                offset_of!(EventDescr, rank),
                offset_of!(EventDescr, coll)
            ),
            (0, 8, 16, 24)
        );
        let c = [
            offset_of!(CollDescr, seq_number),
            offset_of!(CollDescr, func),
            offset_of!(CollDescr, send_buff),
            offset_of!(CollDescr, recv_buff),
            offset_of!(CollDescr, count),
            offset_of!(CollDescr, root),
            offset_of!(CollDescr, datatype),
            offset_of!(CollDescr, n_channels),
            offset_of!(CollDescr, n_warps),
            offset_of!(CollDescr, algo),
            offset_of!(CollDescr, proto),
            offset_of!(CollDescr, parent_group),
        ];
        assert_eq!(c, [0, 8, 16, 24, 32, 40, 48, 56, 57, 64, 72, 80]);
        assert_eq!(std::mem::size_of::<ProfilerV5>(), 6 * 8);
    }

    fn audit(p: &Profile) -> Audit {
        Audit {
            expect: Context::from_profile(p, 2, 1, Mode::Graph, None).ok(),
            logger: None,
            comm_id: 7,
            dir: None,
            tally: Mutex::new(Summary::default()),
        }
    }

    fn coll(func: &std::ffi::CStr, count: usize, algo: &CStr, proto: &CStr, ch: u8) -> EventDescr {
        EventDescr {
            kind: PROFILE_COLL,
            parent_obj: std::ptr::null_mut(),
            rank: 0,
            coll: CollDescr {
                seq_number: 0,
                func: func.as_ptr(),
                send_buff: std::ptr::null(),
                recv_buff: std::ptr::null_mut(),
                count,
                root: 0,
                datatype: c"ncclBfloat16".as_ptr(),
                n_channels: ch,
                n_warps: 16,
                algo: algo.as_ptr(),
                proto: proto.as_ptr(),
                parent_group: std::ptr::null_mut(),
            },
        }
    }

    #[test]
    fn events_are_judged_at_their_byte_size_and_only_allreduce() {
        let mut p = sample::profile();
        p.groups.iter_mut().for_each(|g| g.nccl_channels = Some(4));
        let a = audit(&p);
        // 1000 bytes (500 bf16): the sample pins ring LL there.
        let e = a.expected(1000);
        assert_eq!(e.pin.map(audit::pin_name).as_deref(), Some("RING/LL"));
        assert_eq!(e.channels, Some(4));
        unsafe {
            a.event(&coll(c"AllReduce", 500, c"RING", c"LL", 2));
            a.event(&coll(c"AllReduce", 500, c"TREE", c"LL", 2));
            a.event(&coll(c"AllReduce", 500, c"RING", c"LL", 8));
            a.event(&coll(c"AllGather", 500, c"TREE", c"LL", 2));
            let mut other = coll(c"AllReduce", 500, c"TREE", c"LL", 2);
            other.kind = 1; // a group event
            a.event(&other);
        }
        let s = a.summary();
        assert_eq!((s.allreduces, s.judged, s.agreed), (3, 3, 1));
        let kinds: Vec<&str> = s.classes.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["variant", "channels"]);
        assert_eq!(s.sizes[0].bytes, 1000, "count x 2 bytes of bf16");
    }

    #[test]
    fn datatype_names_as_nccl_prints_them() {
        assert_eq!(datatype_size("ncclBfloat16"), Some(2));
        assert_eq!(datatype_size("ncclFloat32"), Some(4));
        assert_eq!(datatype_size("ncclUint64"), Some(8));
        assert_eq!(datatype_size("ncclInt8"), Some(1));
        assert_eq!(datatype_size("ncclSomethingNew"), None);
    }

    #[test]
    fn entry_points_survive_null_and_hand_out_no_handle() {
        unsafe {
            let mut h: *mut c_void = std::ptr::dangling_mut::<c_void>();
            let t = &ncclProfiler_v6;
            assert_eq!(
                (t.start_event)(std::ptr::null_mut(), &mut h, std::ptr::null_mut()),
                0
            );
            assert!(h.is_null());
            assert_eq!((t.stop_event)(std::ptr::null_mut()), 0);
            assert_eq!(
                (t.record_event_state)(std::ptr::null_mut(), 0, std::ptr::null_mut()),
                0
            );
            assert_eq!((t.finalize)(std::ptr::null_mut()), 0);
            let mut mask = 0;
            let r = (t.init)(
                std::ptr::null_mut(),
                1,
                &mut mask,
                std::ptr::null(),
                1,
                2,
                0,
                None,
            );
            assert_eq!((r, mask), (0, 0));
        }
    }
}
