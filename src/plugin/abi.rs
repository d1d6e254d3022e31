//! The exported tuner structs, laid out exactly as NVIDIA/nccl `src/include/plugin/tuner/
//! tuner_v3.h` .. `tuner_v7.h` declare them. NCCL looks the newest symbol it knows up first:
//! `ncclTunerPlugin_v7` (the header after 2.30), `_v6` (2.30), `_v5` (2.28–2.29), `_v4`
//! (2.24–2.27), `_v3` (2.22–2.23).
//!
//! Every function catches panics and returns ncclSuccess; a null context means "no opinion".

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{Context, Logger};

type NcclResult = c_int;
const NCCL_SUCCESS: NcclResult = 0;

type GetCollInfoV3 = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult;

/// v4 and later: v3 plus `regBuff` before `nChannels`.
pub type GetCollInfo = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult;

type InitV3 = unsafe extern "C" fn(
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    ctx: *mut *mut c_void,
) -> NcclResult;

/// v5 and later: context first, communicator id, NVLink domain info and tuner constants (which
/// this plugin neither reads nor writes, so their differing v7 layout does not matter).
pub type Init = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    nvl_domain_info: *mut c_void,
    constants: *mut c_void,
) -> NcclResult;

pub type Finalize = unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult;

type GetChunkSize = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    chunk_size: *mut usize,
) -> NcclResult;

#[repr(C)]
pub struct TunerV3 {
    pub name: *const c_char,
    pub init: InitV3,
    pub get_coll_info: GetCollInfoV3,
    pub destroy: Finalize,
}

#[repr(C)]
pub struct TunerV4 {
    pub name: *const c_char,
    pub init: InitV3,
    pub get_coll_info: GetCollInfo,
    pub destroy: Finalize,
}

#[repr(C)]
pub struct TunerV5 {
    pub name: *const c_char,
    pub init: Init,
    pub get_coll_info: GetCollInfo,
    pub finalize: Finalize,
}

/// v6 and v7 share this layout; `getChunkSize` is optional and left NULL (NCCL keeps its own).
#[repr(C)]
pub struct TunerV6 {
    pub name: *const c_char,
    pub init: Init,
    pub get_coll_info: GetCollInfo,
    pub finalize: Finalize,
    pub get_chunk_size: Option<GetChunkSize>,
}

// SAFETY: the structs hold a pointer to a static string and function pointers, all immutable.
unsafe impl Sync for TunerV3 {}
unsafe impl Sync for TunerV4 {}
unsafe impl Sync for TunerV5 {}
unsafe impl Sync for TunerV6 {}

const NAME: *const c_char = c"artune".as_ptr();

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclTunerPlugin_v3: TunerV3 = TunerV3 {
    name: NAME,
    init: init_v3,
    get_coll_info: get_coll_info_v3,
    destroy: finalize,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclTunerPlugin_v4: TunerV4 = TunerV4 {
    name: NAME,
    init: init_v3,
    get_coll_info,
    destroy: finalize,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclTunerPlugin_v5: TunerV5 = TunerV5 {
    name: NAME,
    init,
    get_coll_info,
    finalize,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclTunerPlugin_v6: TunerV6 = TunerV6 {
    name: NAME,
    init,
    get_coll_info,
    finalize,
    get_chunk_size: None,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclTunerPlugin_v7: TunerV6 = TunerV6 {
    name: NAME,
    init,
    get_coll_info,
    finalize,
    get_chunk_size: None,
};

/// Builds the context for one communicator; a panic leaves `*ctx` NULL (no opinion).
fn init_common(
    n_ranks: usize,
    n_nodes: usize,
    logger: Logger,
    ctx: *mut *mut c_void,
) -> NcclResult {
    if ctx.is_null() {
        return NCCL_SUCCESS;
    }
    // SAFETY: NCCL passes a valid out-pointer; cleared first so a panic leaves it NULL.
    unsafe { *ctx = std::ptr::null_mut() };
    if let Ok(c) = catch_unwind(AssertUnwindSafe(|| {
        Context::from_env(n_ranks, n_nodes, logger)
    })) {
        unsafe { *ctx = Box::into_raw(Box::new(c)).cast() };
    }
    NCCL_SUCCESS
}

unsafe extern "C" fn init_v3(
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    ctx: *mut *mut c_void,
) -> NcclResult {
    init_common(n_ranks, n_nodes, log, ctx)
}

/// The v5+ `init`.
///
/// # Safety
/// `ctx` is null or writable; NCCL owns the other pointers, which are not read.
pub unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    _comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    _nvl_domain_info: *mut c_void,
    _constants: *mut c_void,
) -> NcclResult {
    init_common(n_ranks, n_nodes, log, ctx)
}

/// The v4+ `getCollInfo`. Sets `n_channels` only after lowering an entry, and only to the
/// measurement override's count or the one the profile states it measured with.
///
/// # Safety
/// `ctx` is null or a context from `init` not yet finalized; `cost_table` is null or a
/// contiguous `float[num_algo][num_proto]`.
pub unsafe extern "C" fn get_coll_info(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    _num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    _reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    if ctx.is_null() {
        return NCCL_SUCCESS;
    }
    // SAFETY: a non-null ctx is one init handed out and finalize has not freed.
    let c = unsafe { &*(ctx as *const Context) };
    if coll == super::NCCL_FUNC_ALLREDUCE {
        super::TUNER_ALLREDUCE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // The table is float[num_algo][num_proto] cast to float**: index it flat.
    let table = cost_table.cast::<f32>();
    let r = catch_unwind(AssertUnwindSafe(|| unsafe {
        let outcome = c.apply(coll, n_bytes as u64, table, num_algo, num_proto);
        if let Some(ch) = c.channels_after(outcome, n_bytes as u64) {
            if !n_channels.is_null() {
                // SAFETY: NCCL passes a valid int* for the channel count (null checked).
                *n_channels = ch;
            }
        }
    }));
    if r.is_err() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            c.log_warn("internal error in getCollInfo; NCCL keeps its choice")
        }));
    }
    NCCL_SUCCESS
}

unsafe extern "C" fn get_coll_info_v3(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    unsafe {
        get_coll_info(
            ctx,
            coll,
            n_bytes,
            num_pipe_ops,
            cost_table,
            num_algo,
            num_proto,
            0,
            n_channels,
        )
    }
}

/// `finalize` (v5+) and `destroy` (v3, v4).
///
/// # Safety
/// `ctx` is null or a context from `init`, finalized once.
pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    if !ctx.is_null() {
        // SAFETY: ctx came from Box::into_raw in init and is freed once, here.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            drop(unsafe { Box::from_raw(ctx as *mut Context) })
        }));
    }
    NCCL_SUCCESS
}
