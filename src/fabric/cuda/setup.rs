//! Worker side of preparing a group: the buffers a worker owns (allocated with plain cuMemAlloc
//! and exported by IPC handle, as vLLM and SGLang share theirs), the launcher that opens every
//! other rank's buffers, and NCCL ranks. The launcher is defined here, where it is built;
//! `run.rs` runs it.

use std::collections::{HashMap, HashSet};

use super::data;
use super::driver::{self, dev, DevBuf, Event, Graph, Imported, IpcHandle, Span, Stream};
use super::kernels;
use super::layout::{ArArgs, RegSlot, MAX_RANKS};
use super::nccl;
use super::protocol::{BufHandles, Launch, RankHandles, Shape};
use super::watchdog::{self, Deadline};
use super::{Gpu, WorkerFaults};
use crate::allreduce::Buffers;
use crate::fabric::{Backend, DeviceError, Dtype, FabricError};

/// The stream this worker launches on, with its timing events.
pub struct Unit {
    pub stream: Stream,
    pub start: Event,
    pub stop: Event,
}

pub enum Impl {
    Custom(Box<CustomView>),
    Nccl {
        comms: nccl::Comms,
        rank: usize,
        nranks: usize,
        /// Device bytes it holds in use (kept with it past the group, see `worker_nccl`).
        bytes: u64,
    },
}

pub struct Ready {
    pub backend: Backend,
    pub imp: Impl,
}

/// Fields are released in the order NCCL and CUDA need (see the Drop impl): graphs, which
/// hold NCCL's communicators; communicators; the stream; opened IPC buffers.
pub struct Launcher {
    pub shape: Shape,
    pub launch: Launch,
    pub graphs: HashMap<(Backend, u64, u32), Graph>,
    pub ready: Vec<Ready>,
    pub unit: Unit,
    /// Every rank's user input and output, as this process sees them.
    pub user: Vec<(Span, Span)>,
    pub warm: HashSet<(Backend, u64)>,
    /// Whether this GPU's test data was found equal to the host's (once per worker).
    pub data_checked: bool,
    /// The slots of the registered form (graph mode): every rank's user input, then output
    /// ([`registered_slot_offset`]), generation [`REGISTERED_GEN`], as an engine's op fills
    /// its slots after capture.
    pub reg: DevBuf,
    pub _imported: Vec<Imported>,
    pub deadline: Deadline,
}

impl Drop for Launcher {
    /// Drains the stream first. A stream that does not drain poisons the context (see
    /// `drain`), after which dropping the rest frees nothing: work may still run on a stuck
    /// GPU, and its memory goes with the context when the worker is replaced.
    fn drop(&mut self) {
        // A CUDA graph keeps NCCL's communicator alive (NCCL waits for it on destroy).
        let t = std::time::Instant::now();
        self.graphs.clear();
        let graphs = t.elapsed().as_secs_f64();
        if self.drain().is_ok() {
            let t = std::time::Instant::now();
            self.ready.clear();
            // With -v: what a release's fixed cost is made of.
            tracing::info!(
                "worker {}: graphs destroyed in {graphs:.2} s, backends (kernels' views; NCCL's \
                 only where not kept) in {:.2} s",
                std::process::id(),
                t.elapsed().as_secs_f64()
            );
            return;
        }
        for r in &mut self.ready {
            if let Impl::Nccl { comms, .. } = &mut r.imp {
                comms.abort();
            }
        }
    }
}

/// What a launcher could not reach: ranks whose buffers it could not open or read (the pair
/// has no working P2P), and custom backends whose shared buffers it could not open.
pub type Unreached = (Vec<(usize, String)>, Vec<(Backend, String)>);

/// The generation the launcher's registered slot holds.
pub const REGISTERED_GEN: u32 = 1;

/// The registered form's slot over every rank's user input as this process sees them: in
/// graph mode the kernels read the ranks' own tensors, as an engine's registered graph does.
fn registered_slot(gpu: &Gpu, user: &[(Span, Span)]) -> Result<DevBuf, FabricError> {
    let (mut inputs, mut outputs) = (RegSlot::default(), RegSlot::default());
    inputs.gen = REGISTERED_GEN;
    outputs.gen = REGISTERED_GEN;
    for (r, (input, output)) in user.iter().enumerate().take(MAX_RANKS) {
        inputs.peer[r] = input.ptr();
        outputs.peer[r] = output.ptr();
    }
    let buf = dev(
        DevBuf::alloc(&gpu.ctx, 2 * RegSlot::BYTES),
        "allocating the registered form's slots",
    )?;
    let bytes: Vec<u8> = [inputs, outputs]
        .iter()
        .flat_map(|s| s.to_bytes())
        .collect();
    dev(buf.upload(0, &bytes), "writing the registered form's slots")?;
    Ok(buf)
}

/// The registered form's slot in [`registered_slot`]'s buffer for `backend`: every rank's
/// user input (then its output, where the form maps both), or its user output alone.
pub fn registered_slot_offset(backend: Backend) -> u64 {
    match super::kernels::registered_tensors(backend) {
        Some(super::kernels::RegTensors::Output) => RegSlot::BYTES as u64,
        _ => 0,
    }
}

/// Bytes checked past the end of each output for stray writes during verification.
pub const GUARD: usize = 256;

/// Seed of the pattern a rank's user input holds from setup on: what the real-transfer check
/// of P2P compares with.
fn user_seed(rank: usize) -> u64 {
    0xA11 + rank as u64
}

/// One custom backend's buffers of one owned rank.
pub struct CustomOwned {
    /// Shared input (pull kernels); push kernels read the rank's own user input.
    input: Option<DevBuf>,
    /// Receive slots (push) or the reduced shard (two-stage pull).
    scratch: Option<DevBuf>,
    /// Output peers write into (two-stage push); others write the rank's own user output.
    out: Option<DevBuf>,
    signal: DevBuf,
}

pub struct OwnedRank {
    pub rank: usize,
    user_in: DevBuf,
    user_out: DevBuf,
    custom: Vec<(Backend, CustomOwned)>,
}

/// Everything a worker allocated for the ranks it owns.
pub struct Owned {
    pub ranks: Vec<OwnedRank>,
}

pub fn alloc(gpu: &Gpu, bytes: u64, what: &str) -> Result<DevBuf, DeviceError> {
    DevBuf::alloc(&gpu.ctx, bytes as usize).map_err(|e| {
        let mut d = driver::driver_error(&e, &format!("allocating {what}"), Some(&gpu.ctx));
        if let DeviceError::OutOfMemory { bytes: b, .. } = &mut d {
            *b = Some(bytes);
        }
        d
    })
}

/// The 1 MiB random pattern (values k/8, never zero) tiled over test buffers.
fn pattern(dtype: Dtype, seed: u64) -> Vec<u8> {
    data::encode(
        dtype,
        &data::rank_values(seed, 0, (1 << 20) / dtype.size() as usize),
    )
}

fn fill_random(buf: &DevBuf, dtype: Dtype, seed: u64) -> Result<(), DeviceError> {
    let p = pattern(dtype, seed);
    let mut off = 0;
    while off < buf.bytes() {
        let len = p.len().min(buf.bytes() - off);
        buf.upload(off, &p[..len])
            .map_err(|e| driver::driver_error(&e, "filling a buffer with test data", None))?;
        off += len;
    }
    Ok(())
}

fn export(b: &DevBuf) -> Result<IpcHandle, FabricError> {
    dev(b.export(), "exporting an IPC handle (cuIpcGetMemHandle)")
}

pub(super) fn padded(max_bytes: u64) -> u64 {
    max_bytes.max(16).div_ceil(16) * 16
}

impl Owned {
    /// Allocates user buffers for `owned` ranks, then each custom backend's buffers, measuring
    /// the device memory each backend takes per rank.
    #[allow(clippy::type_complexity)]
    pub fn new(
        gpu: &Gpu,
        shape: Shape,
        owned: &[usize],
        custom: &[Backend],
    ) -> Result<(Owned, Vec<RankHandles>, Vec<(Backend, Result<u64, String>)>), FabricError> {
        let bytes = padded(shape.max_bytes);
        let mut ranks = Vec::new();
        for &r in owned {
            let user_in = alloc(gpu, bytes + GUARD as u64, "an input buffer")?;
            let user_out = alloc(gpu, bytes + GUARD as u64, "an output buffer")?;
            fill_random(&user_in, shape.dtype, user_seed(r))?;
            ranks.push(OwnedRank {
                rank: r,
                user_in,
                user_out,
                custom: Vec::new(),
            });
        }
        driver::sync_ctx(&gpu.ctx, "synchronizing the GPU")?;
        let mut memory = Vec::new();
        for &b in custom {
            let before = dev(driver::free_bytes(&gpu.ctx), "reading free device memory")?;
            let mut got = Vec::new();
            let mut failed = None;
            for r in &ranks {
                match custom_bufs(gpu, shape, b, r.rank) {
                    Ok(c) => got.push(c),
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                }
            }
            driver::sync_ctx(&gpu.ctx, "synchronizing the GPU")?;
            let after = dev(driver::free_bytes(&gpu.ctx), "reading free device memory")?;
            match failed {
                Some(e) => memory.push((b, Err(e))),
                None => {
                    let per_rank = before.saturating_sub(after) / ranks.len().max(1) as u64;
                    memory.push((b, Ok(per_rank)));
                    for (r, c) in ranks.iter_mut().zip(got) {
                        r.custom.push((b, c));
                    }
                }
            }
        }
        let mut handles = Vec::new();
        for r in &ranks {
            let mut custom = Vec::new();
            for (b, c) in &r.custom {
                custom.push((*b, c.handles()?));
            }
            handles.push(RankHandles {
                rank: r.rank,
                user_in: export(&r.user_in)?,
                user_out: export(&r.user_out)?,
                custom,
            });
        }
        Ok((Owned { ranks }, handles, memory))
    }
}

impl CustomOwned {
    /// The IPC handles peers open these buffers by.
    pub(super) fn handles(&self) -> Result<BufHandles, FabricError> {
        let opt = |x: &Option<DevBuf>| x.as_ref().map(export).transpose();
        Ok(BufHandles {
            input: opt(&self.input)?,
            scratch: opt(&self.scratch)?,
            out: opt(&self.out)?,
            signal: export(&self.signal)?,
        })
    }

    /// The buffers as spans: shared input (pull kernels), slots or shard, shared output
    /// (two-stage push), signal. Where there is no shared input or output, the kernel uses
    /// the rank's own input or output and no peer touches it.
    pub(super) fn spans(&self) -> (Option<Span>, Option<Span>, Option<Span>, Span) {
        let s = |x: &Option<DevBuf>| x.as_ref().map(DevBuf::span);
        (
            s(&self.input),
            s(&self.scratch),
            s(&self.out),
            self.signal.span(),
        )
    }
}

/// Allocates one rank's buffers of custom backend `b` (what the profile's memory measures).
pub(super) fn custom_bufs(
    gpu: &Gpu,
    shape: Shape,
    b: Backend,
    rank: usize,
) -> Result<CustomOwned, DeviceError> {
    let max = padded(shape.max_bytes);
    let bufs = b.spec().buffers.unwrap_or(Buffers {
        input: false,
        scratch: &[],
        output: false,
    });
    let input = match bufs.input {
        true => {
            let buf = alloc(gpu, max + GUARD as u64, "a shared input buffer")?;
            fill_random(&buf, shape.dtype, 0xB22 + rank as u64)?;
            Some(buf)
        }
        false => None,
    };
    let scratch = match kernels::scratch_bytes(b, max, shape.ranks()) {
        0 => None,
        bytes => Some(alloc(gpu, bytes, "receive slots")?),
    };
    let out = match bufs.output {
        true => Some(alloc(gpu, max + GUARD as u64, "a shared output buffer")?),
        false => None,
    };
    let signal = alloc(gpu, kernels::signal_bytes(b, shape.ranks()), "signal flags")?;
    signal
        .fill(0)
        .map_err(|e| driver::driver_error(&e, "clearing signal flags", None))?;
    Ok(CustomOwned {
        input,
        scratch,
        out,
        signal,
    })
}

/// A rank's buffer in this process: owned here, or opened from its owner's handle.
fn view(
    gpu: &Gpu,
    own: Option<&DevBuf>,
    h: &IpcHandle,
    imported: &mut Vec<Imported>,
    what: &str,
    rank: usize,
) -> Result<Span, String> {
    if let Some(b) = own {
        return Ok(b.span());
    }
    let i = Imported::open(&gpu.ctx, h).map_err(|e| {
        format!(
            "GPU {} could not open rank {rank}'s {what} ({e}); custom kernels need CUDA IPC between the group's GPUs",
            gpu.facts.ordinal
        )
    })?;
    let s = i.span();
    imported.push(i);
    Ok(s)
}

/// The real-transfer check of P2P: reads the start of `rank`'s user input through the opened
/// handle and compares it with the pattern its owner wrote.
fn transfer_check(span: &Span, dtype: Dtype, rank: usize) -> Result<(), String> {
    let want = pattern(dtype, user_seed(rank));
    let len = want.len().min(4096).min(span.bytes());
    let mut got = vec![0u8; len];
    span.download(0, &mut got)
        .map_err(|e| format!("reading rank {rank}'s buffer through P2P failed: {e}"))?;
    if got != want[..len] {
        return Err(format!(
            "rank {rank}'s buffer read through P2P differs from what its owner wrote"
        ));
    }
    Ok(())
}

impl Launcher {
    /// Opens every rank's buffers (its own directly, the others by IPC handle) and readies the
    /// launches of `launch`. Returns the launcher, each rank whose buffers could not be opened
    /// or failed the transfer check, and each custom backend whose buffers could not all be
    /// opened: those are left out, never a failure of the group, since NCCL needs none of it.
    pub fn connect(
        gpu: &Gpu,
        owned: Option<&Owned>,
        shape: Shape,
        launch: Launch,
        handles: &[RankHandles],
        deadline: Deadline,
        faults: &WorkerFaults,
    ) -> Result<(Launcher, Unreached), FabricError> {
        let n = shape.n;
        if handles.len() != n || launch.base + launch.count > n || n > MAX_RANKS {
            return Err(FabricError::BadRequest(format!(
                "a group of {n} ranks cannot launch ranks {}..{} with {} ranks' handles",
                launch.base,
                launch.base + launch.count,
                handles.len()
            )));
        }
        let mine = |r: usize| owned.and_then(|o| o.ranks.iter().find(|x| x.rank == r));
        let mut imported = Vec::new();
        let mut user = Vec::new();
        let mut broken = Vec::new();
        let mut customs: HashMap<Backend, CustomView> = HashMap::new();
        let pair = |f: Option<(usize, usize)>, r: usize| {
            f.filter(|&(a, b)| (a, b) == (launch.base, r) || (b, a) == (launch.base, r))
        };
        for (r, h) in handles.iter().enumerate() {
            let own = mine(r);
            let no_ipc = pair(faults.no_ipc, r);
            let open = |b: Option<&DevBuf>, h: &IpcHandle, what: &str, im: &mut Vec<Imported>| {
                match no_ipc.filter(|_| b.is_none()) {
                    Some(_) => Err(format!(
                        "GPU {} could not open rank {r}'s {what} (switched off by ARTUNE_CUDA_FAULTS, noipc); custom kernels need CUDA IPC between the group's GPUs",
                        gpu.facts.ordinal
                    )),
                    None => view(gpu, b, h, im, what, r),
                }
            };
            // A peer this GPU cannot map (no P2P between them: cuIpcOpenMemHandle fails)
            // rules out every custom kernel, not the group: NCCL is still measured.
            let opened = open(own.map(|o| &o.user_in), &h.user_in, "input", &mut imported)
                .and_then(|ui| {
                    open(
                        own.map(|o| &o.user_out),
                        &h.user_out,
                        "output",
                        &mut imported,
                    )
                    .map(|uo| (ui, uo))
                });
            let (ui, uo) = match opened {
                Ok(io) => io,
                Err(e) => {
                    broken.push((r, e));
                    user.push((Span::NONE, Span::NONE));
                    continue;
                }
            };
            if own.is_none() {
                let faulted = pair(faults.no_p2p, r);
                let check = match faulted {
                    Some((a, b)) => Err(format!(
                        "P2P between ranks {a} and {b} was switched off by ARTUNE_CUDA_FAULTS (nop2p)"
                    )),
                    None => transfer_check(&ui, shape.dtype, r),
                };
                if let Err(e) = check {
                    broken.push((r, e));
                }
            }
            user.push((ui.clone(), uo.clone()));
            for (b, bh) in &h.custom {
                let oc = own.and_then(|o| o.custom.iter().find(|(x, _)| x == b).map(|(_, c)| c));
                let refused = (faults.no_open == Some(*b) && own.is_none()).then(|| {
                    format!("rank {r}'s buffers for {b} could not be opened (switched off by ARTUNE_CUDA_FAULTS, noopen)")
                });
                let mut one = |ob: Option<&DevBuf>, h: &Option<IpcHandle>, what: &str| {
                    if let Some(why) = &refused {
                        return Err(why.clone());
                    }
                    h.as_ref()
                        .map(|h| open(ob, h, what, &mut imported))
                        .transpose()
                };
                let input = one(oc.and_then(|c| c.input.as_ref()), &bh.input, "shared input");
                let scratch = one(oc.and_then(|c| c.scratch.as_ref()), &bh.scratch, "slots");
                let out = one(oc.and_then(|c| c.out.as_ref()), &bh.out, "shared output");
                let signal = open(oc.map(|c| &c.signal), &bh.signal, "flags", &mut imported);
                let v = customs
                    .entry(*b)
                    .or_insert_with(|| CustomView::new(*b, shape));
                match (input, scratch, out, signal) {
                    (Ok(i), Ok(s), Ok(o), Ok(g)) => v.set(
                        r,
                        i.unwrap_or_else(|| ui.clone()),
                        s,
                        o.unwrap_or_else(|| uo.clone()),
                        g,
                        (ui.clone(), uo.clone()),
                    ),
                    (Err(e), ..) | (_, Err(e), ..) | (.., Err(e), _) | (.., Err(e)) => {
                        v.broken = Some(e)
                    }
                }
            }
        }
        let ctx = &gpu.ctx;
        let reg = registered_slot(gpu, &user)?;
        let unit = Unit {
            stream: dev(Stream::new(ctx), "creating a stream")?,
            start: dev(Event::new(ctx), "creating an event")?,
            stop: dev(Event::new(ctx), "creating an event")?,
        };
        let mut ready = Vec::new();
        let mut unready = Vec::new();
        for (b, v) in customs {
            match (&v.broken, v.count == n) {
                (None, true) => ready.push(Ready {
                    backend: b,
                    imp: Impl::Custom(Box::new(v)),
                }),
                (Some(why), _) => unready.push((b, why.clone())),
                // A rank it could not reach at all is in `broken`, which says why.
                (None, false) if !broken.is_empty() => {}
                (None, false) => unready.push((
                    b,
                    format!(
                        "GPU {} could not open every rank's buffers for it",
                        gpu.facts.ordinal
                    ),
                )),
            }
        }
        Ok((
            Launcher {
                shape,
                launch,
                graphs: HashMap::new(),
                ready,
                unit,
                user,
                warm: HashSet::new(),
                data_checked: false,
                reg,
                _imported: imported,
                deadline,
            },
            (broken, unready),
        ))
    }

    /// Creates this worker's NCCL rank for `backend` from the coordinator's unique id and warms
    /// it up (`warm_nccl`). Ok(Err) waives the backend.
    pub fn nccl_init(
        &mut self,
        gpu: &Gpu,
        backend: Backend,
        id: &str,
        rank: usize,
        nranks: usize,
    ) -> Result<Result<u64, String>, FabricError> {
        let lib = match nccl::library() {
            Ok(l) => l,
            Err(e) => return Ok(Err(e)),
        };
        dev(gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        let before = dev(driver::free_bytes(&gpu.ctx), "reading free device memory")?;
        let comms = match nccl::Comms::init_rank(lib, id, rank, nranks, watchdog::INIT_DEADLINE) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        self.warm_nccl(gpu, backend, comms, (rank, nranks), before, 0)
    }
}

impl Launcher {
    /// Sets which phases the island kernels push; graphs captured with the old arguments go.
    pub fn orient(&mut self, dirs: u32) {
        for r in &mut self.ready {
            if let (true, Impl::Custom(c)) = (r.backend.is_hierarchical(), &mut r.imp) {
                c.args.dirs = dirs;
            }
        }
        self.graphs.retain(|(b, _, _), _| !b.is_hierarchical());
    }
}

/// One custom backend's view of every rank's buffers, and the kernel arguments made of them.
pub struct CustomView {
    /// Every pointer in `args` names memory one of these spans keeps (input, out and scratch
    /// have no other use; the ranks' own tensors, `src` and `dst`, are the launcher's `user`).
    input: Vec<Span>,
    out: Vec<Span>,
    pub signal: Vec<Span>,
    scratch: Vec<Span>,
    pub args: ArArgs,
    count: usize,
    broken: Option<String>,
}

impl CustomView {
    pub(super) fn new(b: Backend, shape: Shape) -> CustomView {
        CustomView {
            input: vec![Span::NONE; shape.n],
            out: vec![Span::NONE; shape.n],
            signal: vec![Span::NONE; shape.n],
            scratch: Vec::new(),
            args: ArArgs {
                slot_bytes: kernels::slot_bytes(b, padded(shape.max_bytes), shape.ranks()),
                nranks: shape.n as i32,
                island: shape.island as i32,
                dirs: shape.dirs,
                order: shape.order.map(i32::from),
                ..ArArgs::default()
            },
            count: 0,
            broken: None,
        }
    }

    /// Rank `r`'s buffers: `input` and `out` where peers read or write them (the shared
    /// buffers, or the rank's own where no peer touches them), `user` its own input and output.
    pub(super) fn set(
        &mut self,
        r: usize,
        input: Span,
        scratch: Option<Span>,
        out: Span,
        sig: Span,
        user: (Span, Span),
    ) {
        self.args.input[r] = input.ptr();
        self.args.out[r] = out.ptr();
        self.args.src[r] = user.0.ptr();
        self.args.dst[r] = user.1.ptr();
        self.args.scratch[r] = scratch.as_ref().map_or(0, |s| s.ptr());
        self.args.sig[r] = sig.ptr();
        self.input[r] = input;
        self.out[r] = out;
        self.signal[r] = sig;
        // The kernel arguments name the scratch memory: keep it mapped as long as they live.
        self.scratch.extend(scratch);
        self.count += 1;
    }
}
