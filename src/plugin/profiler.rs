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
        assert_eq!(std::mem::size_of::<Profiler<EventDescr>>(), 6 * 8);
    }

    /// Offsets of NCCL's profiler_v7.h descriptor (LP64), derived from the header by hand:
    /// `coll` keeps v6's members at v6's offsets, then kernelVariant (88), isSymColl (96),
    /// userTag (104, 8-aligned); at 112 bytes it is the union's largest member (ceColl 96,
    /// p2p and collApi 56, kernelPhase 24), so the descriptor is 24 + 112 bytes.
    #[test]
    fn v7_descriptor_layout_matches_the_header() {
        use std::mem::{offset_of, size_of};
        assert_eq!(
            (
                offset_of!(EventDescrV7, kind),
                offset_of!(EventDescrV7, parent_obj),
                offset_of!(EventDescrV7, rank),
                offset_of!(EventDescrV7, coll)
            ),
            (0, 8, 16, 24)
        );
        let v6 = offset_of!(CollDescrV7, v6);
        let read = [
            v6 + offset_of!(CollDescr, func),
            v6 + offset_of!(CollDescr, count),
            v6 + offset_of!(CollDescr, datatype),
            v6 + offset_of!(CollDescr, n_channels),
            v6 + offset_of!(CollDescr, algo),
            v6 + offset_of!(CollDescr, proto),
        ];
        assert_eq!(read, [8, 32, 48, 56, 64, 72], "the members the audit reads");
        let added = [
            offset_of!(CollDescrV7, kernel_variant),
            offset_of!(CollDescrV7, is_sym_coll),
            offset_of!(CollDescrV7, user_tag),
        ];
        assert_eq!(added, [88, 96, 104]);
        assert_eq!(
            (size_of::<CollDescrV7>(), size_of::<EventDescrV7>()),
            (112, 136)
        );
        assert_eq!(size_of::<Profiler<EventDescrV7>>(), 6 * 8);
    }

    /// A collective event written byte by byte at the offsets of NCCL's headers (LP64), not
    /// through the mirrors: the union at 24; in `coll` func 8, count 32, datatype 48,
    /// nChannels 56, nWarps 57, algo 64, proto 72; v7 adds userTag at 104.
    struct Raw([u64; 17]);

    impl Raw {
        fn coll(v7: bool, func: &CStr, count: usize, algo: &CStr, proto: &CStr, ch: u8) -> Raw {
            let mut r = Raw([0; 17]);
            r.put(0, PROFILE_COLL);
            r.put(24 + 8, func.as_ptr());
            r.put(24 + 32, count);
            r.put(24 + 48, c"ncclBfloat16".as_ptr());
            r.put(24 + 56, ch);
            r.put(24 + 57, 16u8);
            r.put(24 + 64, algo.as_ptr());
            r.put(24 + 72, proto.as_ptr());
            if v7 {
                r.put(24 + 104, 0xfeed_u64);
            }
            r
        }

        fn put<T>(&mut self, at: usize, v: T) {
            assert!(at + std::mem::size_of::<T>() <= 136);
            // SAFETY: within the 136 bytes (checked); unaligned writes of plain values.
            unsafe {
                let p = self.0.as_mut_ptr().cast::<u8>().add(at);
                p.cast::<T>().write_unaligned(v);
            }
        }
    }

    /// Sends the events through table `t`'s own entry points to an audit of `p`.
    fn through<D: Descr>(t: &Profiler<D>, events: &mut [Raw], p: &Profile) -> Summary {
        let ctx = Box::into_raw(Box::new(audit(p))).cast::<c_void>();
        unsafe {
            for e in events.iter_mut() {
                let mut h: *mut c_void = std::ptr::dangling_mut::<c_void>();
                assert_eq!((t.start_event)(ctx, &mut h, e.0.as_mut_ptr().cast()), 0);
                assert!(h.is_null());
            }
            let s = (*(ctx as *const Audit)).summary();
            assert_eq!((t.finalize)(ctx), 0);
            Summary {
                tuner_calls: 0,
                ..s
            }
        }
    }

    #[test]
    fn an_event_through_v7_is_audited_as_through_v6() {
        let mut p = sample::profile();
        p.groups.iter_mut().for_each(|g| g.nccl_channels = Some(4));
        let events = |v7: bool| {
            let mut phase = Raw([u64::MAX; 17]);
            phase.put(0, 1u64 << 15); // ncclProfileKernelPhase, v7's new event
            vec![
                Raw::coll(v7, c"AllReduce", 500, c"RING", c"LL", 2),
                Raw::coll(v7, c"AllReduce", 500, c"TREE", c"LL", 2),
                Raw::coll(v7, c"AllReduce", 500, c"RING", c"LL", 8),
                Raw::coll(v7, c"AllGather", 500, c"RING", c"LL", 2),
                phase,
            ]
        };
        let v6 = through(&ncclProfiler_v6, &mut events(false), &p);
        let v7 = through(&ncclProfiler_v7, &mut events(true), &p);
        assert_eq!(v7, v6);
        assert_eq!((v7.allreduces, v7.judged, v7.agreed), (3, 3, 1));
        let ran: Vec<_> = v7
            .sizes
            .iter()
            .map(|r| (r.bytes, r.ran.as_str(), r.channels))
            .collect();
        assert_eq!(
            ran,
            [
                (1000, "RING/LL", 2),
                (1000, "TREE/LL", 2),
                (1000, "RING/LL", 8)
            ]
        );
    }

    #[test]
    fn each_table_asks_for_collectives_and_names_itself() {
        let tables: [(Init, Finalize, &str); 3] = [
            (ncclProfiler_v5.init, ncclProfiler_v5.finalize, "v5"),
            (ncclProfiler_v6.init, ncclProfiler_v6.finalize, "v6"),
            (ncclProfiler_v7.init, ncclProfiler_v7.finalize, "v7"),
        ];
        for (init, finalize, name) in tables {
            let (mut ctx, mut mask) = (std::ptr::null_mut(), 0);
            unsafe {
                assert_eq!(
                    init(&mut ctx, 1, &mut mask, std::ptr::null(), 1, 2, 0, None),
                    0
                );
                assert!(!ctx.is_null());
                assert_eq!(mask, PROFILE_COLL as c_int);
                assert_eq!((*(ctx as *const Audit)).summary().profiler, name);
                assert_eq!(finalize(ctx), 0);
            }
        }
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
