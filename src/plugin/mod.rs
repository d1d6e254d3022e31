//! NCCL tuner plugin: the same library NCCL loads through `NCCL_TUNER_PLUGIN` steers NCCL's
//! own allreduce algorithm and protocol to what the profile measured fastest.
//!
//! 1. NCCL calls `init` per communicator; [`Context::from_env`] reads the profile named by
//!    `ARTUNE_PROFILE` and keeps, per bucket of the group with `nRanks` GPUs, the NCCL
//!    algorithm × protocol to favour (or none).
//! 2. NCCL calls `getCollInfo` per collective with its cost table; [`Context::apply`] lowers one
//!    entry for allreduce and touches nothing else: never a -1 (disabled) entry, never another
//!    collective; it sets the channel count only where it lowered an entry and the profile states
//!    the count its NCCL measurements ran with ([`Context::channels_at`]).
//! 3. Anything wrong (no profile, unreadable, not valid for this machine by the rule every
//!    consumer applies (`profile::validity`), no matching group, a size beyond the profile, a
//!    panic) is logged through NCCL's logger and leaves NCCL's choice as it was;
//!    every entry point returns ncclSuccess, because from NCCL 2.30 an error fails the collective.
//!
//! The symbols and struct layouts are in [`abi`]. [`force`] is a measurement hook ahead of the
//! profile: artune's K-rank timings switch NCCL's variant per call with it.

pub mod abi;
pub mod audit;
pub mod force;
pub mod library;
pub mod profiler;

use std::ffi::{c_char, c_int, CString};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::allreduce::{Backend, Mode, NcclAlgo, NcclProto};
use crate::profile::selector::GroupSelector;
use crate::profile::validity::{self, Allow, Validity};
use crate::profile::{Profile, Query};

/// `ncclFuncAllReduce` in NCCL's `ncclFunc_t`.
pub const NCCL_FUNC_ALLREDUCE: c_int = 4;
/// Largest table dimensions we believe (NCCL has 7 algorithms and 3 protocols).
const MAX_ALGO: c_int = 64;
const MAX_PROTO: c_int = 16;

/// allreduce getCollInfo calls the tuner answered in this process: NCCL opens one library for
/// its tuner and its profiler, so the audit reads here whether the tuner was asked at all.
pub static TUNER_ALLREDUCE_CALLS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Environment variable naming the profile.
pub const ENV_PROFILE: &str = "ARTUNE_PROFILE";
/// `graph` (default) or `eager`: which of the profile's launch modes to follow. NCCL does not
/// tell a tuner whether it is being captured.
pub const ENV_MODE: &str = "ARTUNE_MODE";

/// NCCL's index of an algorithm in the cost table.
pub fn algo_index(a: NcclAlgo) -> u8 {
    match a {
        NcclAlgo::Tree => 0,
        NcclAlgo::Ring => 1,
    }
}

/// NCCL's index of a protocol in the cost table.
pub fn proto_index(p: NcclProto) -> u8 {
    match p {
        NcclProto::LL => 0,
        NcclProto::LL128 => 1,
        NcclProto::Simple => 2,
    }
}

/// The cost-table entry for the NCCL variant a bucket names, or None where that is NCCL's
/// own choice. Which variant is decided once, by the steering rule (`decide::rule`), and read
/// from the profile through the [`Selector`](crate::profile::Selector).
pub fn pin_of(variant: Backend) -> Option<Pin> {
    let (a, p) = variant.nccl_pin()?;
    Some(Pin {
        backend: variant,
        algo: algo_index(a),
        proto: proto_index(p),
    })
}

/// Where the profile chooses a backend NCCL's tuner cannot make NCCL run (an island schedule,
/// run only by artune's own kernels), one line saying so: NCCL keeps the profile's best NCCL
/// variant there, as at every size the profile gives a kernel.
pub fn inexpressible(g: &GroupSelector) -> Option<String> {
    let sizes: Vec<(u64, Backend)> = g
        .sizes()
        .iter()
        .zip(g.answers())
        .filter(|(_, a)| !a.backend.nccl_expressible() && !a.backend.engines_have())
        .map(|(&s, a)| (s, a.backend))
        .collect();
    let (first, last) = (sizes.first()?, sizes.last()?);
    let mut names: Vec<&str> = sizes.iter().map(|(_, b)| b.id()).collect();
    names.dedup();
    Some(format!(
        "the profile chooses {} at {} of the sizes {}..{} bytes: NCCL's tuner cannot express an island schedule, so NCCL runs the profile's best NCCL variant there (artune's own kernels run it where the engine routes to them)",
        names.join(", "),
        sizes.len(),
        first.0,
        last.0
    ))
}

/// An entry of the cost table to favour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    pub backend: Backend,
    pub algo: u8,
    pub proto: u8,
}

/// What [`Context::apply`] did with one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Lowered(Pin),
    /// The measurement override ([`force`]) chose the entry, ahead of the profile.
    Forced(force::Forced),
    /// Not an allreduce.
    OtherCollective,
    /// The plugin follows no profile (see the init log).
    NoProfile,
    /// The size is above the largest the profile measured.
    BeyondProfile,
    /// The profile leaves NCCL its own choice at this size (no pin beats it).
    NcclOwnChoice,
    /// NCCL disabled the entry (-1) or passed a table too small for it.
    EntryUnavailable,
    /// Every entry is NCCL_ALGO_PROTO_IGNORE: from 2.31 NCCL asks so on its symmetric-kernel
    /// path, where the table has nothing to steer. Left alone, without a warning.
    AllIgnored,
    /// `NCCL_ALGO` or `NCCL_PROTO` is set in the engine's environment: the user pinned NCCL's
    /// choice, and the plugin does not override it (logged once at init).
    PinnedByUser,
}

/// NCCL's `NCCL_ALGO_PROTO_IGNORE`: a cost meaning "not possible here".
pub const ALGO_PROTO_IGNORE: f32 = -1.0;

/// Variables with which a user pins NCCL's algorithm or protocol; the plugin leaves them be.
pub const ALGO_VARS: &[&str] = &["NCCL_ALGO", "NCCL_PROTO"];
/// Variables with which a user pins NCCL's channel count; the plugin then sets none.
pub const CHANNEL_VARS: &[&str] = &[
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
];

/// What the engine's environment pins: `NAME=value` for algorithm or protocol, and for channels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserPins {
    pub algo: Vec<String>,
    pub channels: Vec<String>,
}

impl UserPins {
    pub fn from_vars(vars: &std::collections::BTreeMap<String, String>) -> UserPins {
        let set = |names: &[&str]| -> Vec<String> {
            names
                .iter()
                .filter_map(|n| vars.get(*n).map(|v| format!("{n}={v}")))
                .collect()
        };
        UserPins {
            algo: set(ALGO_VARS),
            channels: set(CHANNEL_VARS),
        }
    }
}

/// NCCL's logger: `void (*)(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...)`.
pub type Logger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: std::ffi::c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

const LOG_WARN: c_int = 2;
const LOG_INFO: c_int = 3;
const SUBSYS_INIT: std::ffi::c_ulong = 0x1;
const SUBSYS_TUNING: std::ffi::c_ulong = 0x40;

/// Logs one line through NCCL's logger, if NCCL gave one.
fn log(logger: Logger, level: c_int, msg: &str) {
    let Some(f) = logger else { return };
    let text = CString::new(format!("artune: {}", msg.replace('\0', " "))).unwrap_or_default();
    // SAFETY: NCCL's logger takes a printf format; "%s" with one NUL-terminated string.
    unsafe {
        f(
            level,
            SUBSYS_INIT | SUBSYS_TUNING,
            c"artune/plugin".as_ptr(),
            line!() as c_int,
            c"%s".as_ptr(),
            text.as_ptr(),
        )
    };
}

/// What the plugin follows for one communicator.
pub struct Context {
    /// The profile's group for this communicator; None follows nothing.
    group: Option<GroupSelector>,
    logger: Logger,
    /// The user pinned a channel count: set none.
    channels_pinned: bool,
    /// One warning per bucket when NCCL disabled the entry we wanted.
    warned: Vec<AtomicBool>,
    /// The user pinned NCCL's algorithm or protocol: lower nothing.
    algo_pinned: bool,
    /// The measurement override read on every call ([`force::GLOBAL`] outside tests).
    force: &'static force::Force,
}

impl Context {
    /// A context that never changes anything.
    pub fn passthrough(logger: Logger) -> Context {
        Context {
            group: None,
            logger,
            channels_pinned: false,
            warned: Vec::new(),
            algo_pinned: false,
            force: &force::GLOBAL,
        }
    }

    /// The context reading its override from `f` instead of the process's.
    pub fn forced_by(mut self, f: &'static force::Force) -> Context {
        self.force = f;
        self
    }

    /// Leaves what the engine's environment pins to the user: no entry lowered where
    /// `NCCL_ALGO`/`NCCL_PROTO` are set, no channel count where a channel variable is.
    pub fn respecting(mut self, pins: &UserPins) -> Context {
        self.algo_pinned = !pins.algo.is_empty();
        self.channels_pinned = !pins.channels.is_empty();
        self
    }

    /// The pins of the profile's group for a communicator of `n_ranks` ranks on `n_nodes` nodes.
    /// The error is a phrase saying why the plugin leaves NCCL alone.
    pub fn from_profile(
        p: &Profile,
        n_ranks: usize,
        n_nodes: usize,
        mode: Mode,
        logger: Logger,
    ) -> Result<Context, String> {
        if n_nodes != 1 {
            return Err(format!(
                "the communicator spans {n_nodes} nodes and artune profiles describe one node"
            ));
        }
        let q = Query {
            tp: n_ranks,
            mode,
            gpus: None,
        };
        let missing = || {
            format!(
                "the profile has no TP{n_ranks} group in {} mode (it has {})",
                mode.id(),
                p.group_names()
            )
        };
        let group = p.selector().group(q).ok_or_else(missing)?.clone();
        Ok(Context {
            warned: group
                .sizes()
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            group: Some(group),
            logger,
            channels_pinned: false,
            algo_pinned: false,
            force: &force::GLOBAL,
        })
    }

    /// Reads `ARTUNE_PROFILE` (and `ARTUNE_MODE`), logging what it follows or why it follows
    /// nothing. Never fails: the worst case is a passthrough context.
    pub fn from_env(n_ranks: usize, n_nodes: usize, logger: Logger) -> Context {
        Context::from_env_or_why(n_ranks, n_nodes, logger).0
    }

    /// [`Context::from_env`], with the phrase saying why it follows nothing where it does not
    /// (the profiler's audit reports the tuner's decision in the same words).
    pub fn from_env_or_why(
        n_ranks: usize,
        n_nodes: usize,
        logger: Logger,
    ) -> (Context, Option<String>) {
        let quiet = |level, msg: String| {
            log(
                logger,
                level,
                &format!("{msg}; NCCL keeps its own algorithm and protocol choice"),
            );
            (Context::passthrough(logger), Some(msg))
        };
        let Some(path) = std::env::var_os(ENV_PROFILE) else {
            return quiet(LOG_INFO, format!("{ENV_PROFILE} is not set"));
        };
        let mode = mode_from_env(logger);
        let p = match Profile::load(std::path::Path::new(&path)) {
            Ok(p) => p,
            Err(e) => return quiet(LOG_WARN, e.to_string()),
        };
        let (allow, bad) = Allow::from_env();
        if let Some(bad) = bad {
            log(logger, LOG_WARN, &bad);
        }
        let v = validity::here(&p, loading_nccl_version());
        let vars = crate::profile::environment::current();
        let pins = UserPins::from_vars(&vars);
        let path = path.to_string_lossy();
        match Context::following(&p, &path, &v, allow, n_ranks, n_nodes, mode, logger) {
            Ok((c, lines)) => {
                if logger.is_some() {
                    log_environment_once(logger, &p, &vars, &pins);
                }
                for (level, line) in lines {
                    log(logger, level, &line);
                }
                (c.respecting(&pins), None)
            }
            Err(why) => quiet(LOG_WARN, why),
        }
    }

    /// The context for `p` (read from `path`) given the validity rule's verdict on it for this
    /// machine, and the start-up lines to log: what it follows, whether the profile is valid
    /// here and why. Err: why NCCL keeps its own choice.
    #[allow(clippy::too_many_arguments)]
    pub fn following(
        p: &Profile,
        path: &str,
        v: &Validity,
        allow: Allow,
        n_ranks: usize,
        n_nodes: usize,
        mode: Mode,
        logger: Logger,
    ) -> Result<(Context, Vec<(c_int, String)>), String> {
        if !v.followed(allow) {
            return Err(format!("{path} is {}", v.verdict(allow)));
        }
        let c = Context::from_profile(p, n_ranks, n_nodes, mode, logger)?;
        let (steered, sizes, largest) = c.group.as_ref().map_or((0, 0, 0), |g| {
            let steered = g.answers().iter().filter(|a| pin_of(a.nccl).is_some());
            (
                steered.count(),
                g.sizes().len(),
                g.sizes().last().copied().unwrap_or(0),
            )
        });
        let level = if v.valid() { LOG_INFO } else { LOG_WARN };
        let mut lines = vec![(
            level,
            format!(
                "following {path} for TP{n_ranks} {} allreduce: {steered} of {sizes} sizes steered, up to {}{}; {}",
                mode.id(),
                crate::units::fmt_size(largest),
                if p.simulated { " (SIMULATED profile)" } else { "" },
                v.verdict(allow)
            ),
        )];
        if let Some(line) = c.group.as_ref().and_then(inexpressible) {
            lines.push((LOG_INFO, line));
        }
        Ok((c, lines))
    }

    /// The pin for a message of `bytes` bytes, if any. O(log buckets), no allocation.
    pub fn pin(&self, bytes: u64) -> Result<Option<Pin>, Outcome> {
        let g = self.group.as_ref().ok_or(Outcome::NoProfile)?;
        let (_, answer) = g.at(bytes).ok_or(Outcome::BeyondProfile)?;
        Ok(pin_of(answer.nccl))
    }

    /// Lowers the favoured entry of NCCL's cost table, a contiguous `float[num_algo][num_proto]`:
    /// the measurement override's where one is set ([`force`]), else the profile's pin.
    ///
    /// # Safety
    /// `table` is null or points to `num_algo * num_proto` writable floats.
    pub unsafe fn apply(
        &self,
        coll: c_int,
        n_bytes: u64,
        table: *mut f32,
        num_algo: c_int,
        num_proto: c_int,
    ) -> Outcome {
        if coll != NCCL_FUNC_ALLREDUCE {
            return Outcome::OtherCollective;
        }
        if self.algo_pinned {
            return Outcome::PinnedByUser;
        }
        if let Some(f) = self.force.get() {
            // SAFETY: the caller's table, as this function's contract says.
            return match unsafe { lower(table, num_algo, num_proto, f.algo, f.proto) } {
                Ok(()) => Outcome::Forced(f),
                Err(Unlowered::AllIgnored) => Outcome::AllIgnored,
                Err(_) => Outcome::EntryUnavailable,
            };
        }
        let pin = match self.pin(n_bytes) {
            Ok(Some(p)) => p,
            Ok(None) => return Outcome::NcclOwnChoice,
            Err(o) => return o,
        };
        // SAFETY: the caller's table, as this function's contract says.
        match unsafe { lower(table, num_algo, num_proto, pin.algo, pin.proto) } {
            Ok(()) => Outcome::Lowered(pin),
            Err(Unlowered::AllIgnored) => Outcome::AllIgnored,
            Err(Unlowered::Unfit) => Outcome::EntryUnavailable,
            Err(Unlowered::Disabled) => {
                self.warn_disabled(n_bytes, pin);
                Outcome::EntryUnavailable
            }
        }
    }

    /// The channel count to set with what [`Context::apply`] did at `bytes`: the override's
    /// or the profile's, never where nothing was lowered or the user pinned a count.
    pub fn channels_after(&self, outcome: Outcome, bytes: u64) -> Option<c_int> {
        match outcome {
            Outcome::Lowered(_) => self.channels_at(bytes),
            Outcome::Forced(f) if !self.channels_pinned => {
                f.channels.and_then(|c| c_int::try_from(c).ok())
            }
            _ => None,
        }
    }

    fn warn_disabled(&self, n_bytes: u64, pin: Pin) {
        let Some(g) = &self.group else { return };
        let i = g.sizes().partition_point(|&s| s < n_bytes);
        if let Some(w) = self.warned.get(i) {
            if !w.swap(true, Ordering::Relaxed) {
                log(
                    self.logger,
                    LOG_INFO,
                    &format!(
                        "NCCL disabled {} at {n_bytes} bytes (cost -1); leaving its choice",
                        pin.backend
                    ),
                );
            }
        }
    }

    /// The channel count to set alongside the pin at `bytes` (the tuner sets it, the audit
    /// expects it): the one measured for that size's pin, if the profile states one and the
    /// user pinned none.
    pub fn channels_at(&self, bytes: u64) -> Option<c_int> {
        if self.channels_pinned {
            return None;
        }
        let (_, answer) = self.group.as_ref()?.at(bytes)?;
        answer
            .nccl_channels
            .and_then(|c| c_int::try_from(c).ok())
            .filter(|&c| c > 0)
    }

    /// Logs a message through this communicator's logger.
    pub fn log_warn(&self, msg: &str) {
        log(self.logger, LOG_WARN, msg);
    }
}

/// Why an entry was not lowered.
enum Unlowered {
    /// No table, or one too small for the entry.
    Unfit,
    /// Every entry is NCCL_ALGO_PROTO_IGNORE.
    AllIgnored,
    /// NCCL disabled the entry (-1), or its cost is not a finite, non-negative number.
    Disabled,
}

/// Writes 0.0 over entry `[algo][proto]` of NCCL's `float[num_algo][num_proto]` table.
///
/// # Safety
/// `table` is null or points to `num_algo * num_proto` writable floats.
unsafe fn lower(
    table: *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    algo: u8,
    proto: u8,
) -> Result<(), Unlowered> {
    let fits = !table.is_null()
        && (1..=MAX_ALGO).contains(&num_algo)
        && (1..=MAX_PROTO).contains(&num_proto)
        && c_int::from(algo) < num_algo
        && c_int::from(proto) < num_proto;
    if !fits {
        return Err(Unlowered::Unfit);
    }
    let n = num_algo as usize * num_proto as usize;
    // SAFETY: the caller's table holds num_algo × num_proto floats (bounds checked above).
    let all = unsafe { std::slice::from_raw_parts(table.cast_const(), n) };
    if all.iter().all(|&x| x == ALGO_PROTO_IGNORE) {
        return Err(Unlowered::AllIgnored);
    }
    // SAFETY: in bounds of the caller's num_algo × num_proto table, checked above.
    let cell = unsafe { table.add(usize::from(algo) * num_proto as usize + usize::from(proto)) };
    // -1.0 is NCCL's "not allowed"; NaN, infinite or negative is not ours to turn into a
    // choice. From 2.31 NCCL takes the smallest time with no sign check, so a negative
    // written here would win; only ever 0.0 over a finite, non-negative cost.
    let current = unsafe { *cell };
    if !current.is_finite() || current < 0.0 {
        return Err(Unlowered::Disabled);
    }
    unsafe { *cell = 0.0 };
    Ok(())
}

/// The launch mode `ARTUNE_MODE` names (graph unless it says eager; anything else is logged).
pub fn mode_from_env(logger: Logger) -> Mode {
    match std::env::var(ENV_MODE).as_deref() {
        Err(_) | Ok("graph") => Mode::Graph,
        Ok("eager") => Mode::Eager,
        Ok(other) => {
            log(
                logger,
                LOG_WARN,
                &format!("{ENV_MODE}={other} is neither graph nor eager; following graph"),
            );
            Mode::Graph
        }
    }
}

/// Logs, once per process: the NCCL version that loaded the plugin, the variables the engine
/// pins (left alone), and where the engine's NCCL environment differs from the profile's.
fn log_environment_once(
    logger: Logger,
    p: &Profile,
    vars: &std::collections::BTreeMap<String, String>,
    pins: &UserPins,
) {
    static ONCE: AtomicBool = AtomicBool::new(false);
    if ONCE.swap(true, Ordering::Relaxed) {
        return;
    }
    for line in environment_lines(p, vars, pins, loading_nccl_version()) {
        log(logger, line.0, &line.1);
    }
}

/// The init log lines of [`log_environment_once`], each with its level.
pub fn environment_lines(
    p: &Profile,
    vars: &std::collections::BTreeMap<String, String>,
    pins: &UserPins,
    nccl: Option<String>,
) -> Vec<(c_int, String)> {
    let mut lines = vec![(
        LOG_INFO,
        format!(
            "loaded by NCCL {} (read against NCCL 2.22 to 2.32 sources: tuner v3 to v7)",
            nccl.as_deref().unwrap_or("of unknown version")
        ),
    )];
    if !pins.algo.is_empty() {
        lines.push((
            LOG_INFO,
            format!(
                "{} set in this process: NCCL's algorithm and protocol are the user's, the plugin steers nothing",
                pins.algo.join(", ")
            ),
        ));
    }
    if !pins.channels.is_empty() {
        lines.push((
            LOG_INFO,
            format!(
                "{} set in this process: the plugin leaves NCCL's channel count alone",
                pins.channels.join(", ")
            ),
        ));
    }
    if let Some(e) = &p.environment {
        let d = crate::profile::environment::engine_differences(&e.variables, vars);
        if !d.is_empty() {
            let what: Vec<String> = d.iter().map(ToString::to_string).collect();
            lines.push((
                LOG_WARN,
                format!(
                    "this process's NCCL environment differs from the profile's ({}); NCCL's times and the profile's choices may not hold here: tune with the engine's environment",
                    what.join(", ")
                ),
            ));
        }
    }
    lines
}

/// The version of the NCCL library in this process, asked through its `ncclGetVersion`
/// (e.g. "2.28.3"); None when no NCCL is loaded.
pub fn loading_nccl_version() -> Option<String> {
    type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a symbol up.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ncclGetVersion".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: ncclGetVersion has this signature in every NCCL release.
    let f: GetVersion = unsafe { std::mem::transmute::<*mut std::ffi::c_void, GetVersion>(sym) };
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer.
    if unsafe { f(&mut v) } != 0 || v <= 0 {
        return None;
    }
    // From 2.9 NCCL encodes major*10000 + minor*100 + patch.
    Some(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

#[cfg(test)]
mod tests;
