//! A prepared tensor-parallel group: per-rank buffers, one stream per launch unit, each
//! backend's buffers or communicators, and the launch, verify and timing loops.
//!
//! A launch unit is one stream that launches for some ranks: one per GPU on a real machine
//! (its own worker thread), or one for all K virtual ranks in loopback, where a single grid
//! covers every rank (blockIdx.y is the rank) so their spinning blocks are always resident
//! together and one call costs one launch, as on a real GPU.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use super::data;
use super::driver::{self, dev, is_oom, DevBuf, Event, Graph, Stream, DEVICE_HINT};
use super::kernels::{self, ArArgs, MAX_RANKS, SIGNAL_STATUS_OFFSET};
use super::nccl;
use super::watchdog::{self, Deadline, Poll, Waited};
use super::Gpu;
use crate::fabric::{
    memory, Backend, FabricError, Group, MemoryCost, Mode, Readiness, Verification,
};

/// Bytes checked past the end of each output for stray writes during verification.
const GUARD: usize = 256;
/// NCCL channels assumed for the memory model (NCCL does not report its channel count).
const MODEL_NCCL_CHANNELS: u32 = 2;

pub struct Rank {
    pub gpu: usize,
    pub user_in: DevBuf,
    pub user_out: DevBuf,
}

pub struct Unit {
    pub gpu: usize,
    pub stream: Stream,
    pub start: Event,
    pub stop: Event,
    pub rank_base: usize,
    pub ranks: usize,
}

struct CustomBufs {
    /// Shared input (pull kernels); push kernels read the rank's own user input.
    input: Vec<Option<DevBuf>>,
    /// Receive slots (push) or the reduced shard (two-stage pull).
    scratch: Vec<Option<DevBuf>>,
    /// Output peers write into (two-stage push); others write the rank's own user output.
    out: Vec<Option<DevBuf>>,
    signal: Vec<DevBuf>,
    args: ArArgs,
}

enum Impl {
    Custom(Box<CustomBufs>),
    Nccl(nccl::Comms),
}

struct Ready {
    backend: Backend,
    imp: Impl,
}

/// Fields are released in the order NCCL and CUDA need (see the Drop impl): graphs, which
/// hold NCCL's communicators; communicators and kernel buffers; streams; rank buffers.
pub struct Prepared {
    pub group: Group,
    pub n: usize,
    pub loopback: bool,
    graphs: HashMap<(Backend, u64, u32), Vec<Graph>>,
    ready: Vec<Ready>,
    pub units: Vec<Unit>,
    pub ranks: Vec<Rank>,
    warm: HashSet<(Backend, u64)>,
    /// Deadline of one GPU operation.
    pub deadline: Deadline,
    /// Why a GPU of this group no longer finishes its work, once that happened: nothing more
    /// is launched, and memory a stuck kernel may still touch is never freed.
    pub stuck: Option<String>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // A CUDA graph keeps NCCL's communicator alive (NCCL waits for it on destroy), and a
        // graph exec may be destroyed while in flight: graphs go first.
        self.graphs.clear();
        if self.stuck.is_none() && self.drain().is_ok() {
            // Communicators and kernel buffers, then streams and rank buffers (field order).
            self.ready.clear();
            return;
        }
        // Work may still run on a stuck GPU: stop NCCL's, and leak what a running kernel may
        // touch rather than free it under it. The process is about to report the GPU stuck.
        for r in &mut self.ready {
            if let Impl::Nccl(c) = &mut r.imp {
                c.abort();
            }
        }
        std::mem::forget(std::mem::take(&mut self.ready));
        std::mem::forget(std::mem::take(&mut self.units));
        std::mem::forget(std::mem::take(&mut self.ranks));
    }
}

/// Maps the end of a wait on `backend`'s work to the error the harness acts on: a deadline
/// is a timeout (the backend is aborted and disqualified), an NCCL error fails the backend,
/// and a CUDA error is the device's.
fn waited(backend: Backend, nccl: bool, what: &str, w: Waited) -> FabricError {
    match w {
        Waited::Expired(t) => FabricError::Timeout {
            backend,
            what: what.into(),
            seconds: t.as_secs_f64(),
        },
        Waited::Failed(reason) if nccl => FabricError::Backend {
            backend,
            reason: format!("{what}: {reason}"),
        },
        Waited::Failed(e) => FabricError::Device(format!("{what} failed: {e}; {DEVICE_HINT}")),
    }
}

fn alloc(gpus: &[Gpu], gpu: usize, bytes: u64, what: &str) -> Result<DevBuf, String> {
    DevBuf::alloc(&gpus[gpu].ctx, bytes as usize).map_err(|e| {
        if is_oom(&e) {
            format!(
                "out of device memory allocating {what} ({bytes} bytes) on GPU {}; free device memory (other processes on the GPU) or tune smaller sizes with --sizes",
                gpus[gpu].facts.ordinal
            )
        } else {
            format!("allocating {what} failed: {e}")
        }
    })
}

/// Tiles a 1 MiB random pattern (values k/8, never zero) over `buf`.
fn fill_random(buf: &DevBuf, dtype: crate::fabric::Dtype, seed: u64) -> Result<(), FabricError> {
    let pattern = data::encode(
        dtype,
        &data::rank_values(seed, 0, (1 << 20) / dtype.size() as usize),
    );
    let mut off = 0;
    while off < buf.bytes {
        let len = pattern.len().min(buf.bytes - off);
        dev(
            buf.upload(off, &pattern[..len]),
            "filling a buffer with test data",
        )?;
        off += len;
    }
    Ok(())
}

/// Waits for the legacy-stream work of synchronous fills and copies (cuMemsetD8 returns
/// before it finishes). Only called when none of our streams has work queued: the watchdog
/// covers those.
fn sync_gpus(gpus: &[Gpu], which: &[usize]) -> Result<(), FabricError> {
    for &g in which {
        driver::sync_ctx(&gpus[g].ctx, "synchronizing the GPU")?;
    }
    Ok(())
}

/// Runs `f` for every unit: inline for one, on one thread per unit otherwise (each thread
/// with its GPU's context bound).
fn across<T: Send>(
    gpus: &[Gpu],
    units: &[Unit],
    f: impl Fn(usize, &Unit) -> Result<T, FabricError> + Sync,
) -> Result<Vec<T>, FabricError> {
    if units.len() == 1 {
        dev(
            gpus[units[0].gpu].ctx.bind_to_thread(),
            "binding the CUDA context",
        )?;
        return Ok(vec![f(0, &units[0])?]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = units
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let f = &f;
                s.spawn(move || {
                    dev(gpus[u.gpu].ctx.bind_to_thread(), "binding the CUDA context")?;
                    f(i, u)
                })
            })
            .collect();
        let mut out = Vec::new();
        let mut err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(v)) => out.push(v),
                Ok(Err(e)) => err = err.or(Some(e)),
                Err(_) => {
                    err = err.or(Some(FabricError::Device(
                        "a GPU worker thread panicked; please report this bug".into(),
                    )))
                }
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    })
}

impl Prepared {
    /// Allocates per-rank buffers and streams, then sets up each backend, measuring its
    /// device memory. `rank_gpus` maps each rank to an index of `gpus`.
    pub fn new(
        gpus: &[Gpu],
        rank_gpus: &[usize],
        loopback: bool,
        group: &Group,
        backends: &[Backend],
        deadline: Deadline,
    ) -> Result<(Prepared, Vec<Readiness>), FabricError> {
        let n = rank_gpus.len();
        let bytes = group.max_bytes.max(16).div_ceil(16) * 16;
        let mut ranks = Vec::new();
        for (r, &g) in rank_gpus.iter().enumerate() {
            let user_in = alloc(gpus, g, bytes + GUARD as u64, "an input buffer")
                .map_err(FabricError::Device)?;
            let user_out = alloc(gpus, g, bytes + GUARD as u64, "an output buffer")
                .map_err(FabricError::Device)?;
            fill_random(&user_in, group.dtype, 0xA11 + r as u64)?;
            ranks.push(Rank {
                gpu: g,
                user_in,
                user_out,
            });
        }
        let mut units = Vec::new();
        let mk_unit = |g: usize, rank_base: usize, count: usize| -> Result<Unit, FabricError> {
            let ctx = &gpus[g].ctx;
            Ok(Unit {
                gpu: g,
                stream: dev(Stream::new(ctx), "creating a stream")?,
                start: dev(Event::new(ctx), "creating an event")?,
                stop: dev(Event::new(ctx), "creating an event")?,
                rank_base,
                ranks: count,
            })
        };
        if loopback {
            units.push(mk_unit(rank_gpus[0], 0, n)?);
        } else {
            for (r, &g) in rank_gpus.iter().enumerate() {
                units.push(mk_unit(g, r, 1)?);
            }
        }
        let mut p = Prepared {
            group: group.clone(),
            n,
            loopback,
            graphs: HashMap::new(),
            ready: Vec::new(),
            units,
            ranks,
            warm: HashSet::new(),
            deadline,
            stuck: None,
        };
        let mut gpu_set: Vec<usize> = rank_gpus.to_vec();
        gpu_set.sort_unstable();
        gpu_set.dedup();
        sync_gpus(gpus, &gpu_set)?;

        let p2p = if loopback {
            Ok(())
        } else {
            enable_peers(gpus, &gpu_set)
        };
        let mut out = Vec::new();
        for &b in backends {
            let why_not = if b.is_custom() {
                custom_waiver(gpus, &gpu_set, &p2p, n)
            } else {
                nccl_waiver(b, loopback)
            };
            if let Some(reason) = why_not {
                out.push(Readiness::Waived { backend: b, reason });
                continue;
            }
            let before = free_on(gpus, &gpu_set)?;
            let setup = if b.is_custom() {
                p.setup_custom(gpus, b)
            } else {
                p.setup_nccl(gpus, b)?
            };
            match setup {
                Ok(imp) => {
                    sync_gpus(gpus, &gpu_set)?;
                    let after = free_on(gpus, &gpu_set)?;
                    let used = before
                        .iter()
                        .zip(&after)
                        .map(|(a, b)| a.saturating_sub(*b))
                        .max()
                        .unwrap_or(0);
                    // In loopback every rank's buffers are on the one GPU (NCCL has one rank).
                    let per_gpu = if loopback && b.is_custom() {
                        used / n as u64
                    } else {
                        used
                    };
                    out.push(Readiness::Ready {
                        backend: b,
                        memory: MemoryCost {
                            bytes_per_gpu: per_gpu,
                            measured: true,
                            modelled_bytes_per_gpu: memory::modelled(
                                b,
                                n,
                                group.max_bytes,
                                MODEL_NCCL_CHANNELS,
                            ),
                        },
                    });
                    p.ready.push(Ready { backend: b, imp });
                }
                Err(reason) => out.push(Readiness::Waived { backend: b, reason }),
            }
        }
        Ok((p, out))
    }

    fn setup_custom(&self, gpus: &[Gpu], b: Backend) -> Result<Impl, String> {
        let n = self.n as u64;
        let max = self.group.max_bytes.max(16).div_ceil(16) * 16;
        let slot = kernels::slot_bytes(b, max, n);
        let mut bufs = CustomBufs {
            input: Vec::new(),
            scratch: Vec::new(),
            out: Vec::new(),
            signal: Vec::new(),
            args: ArArgs {
                input: [0; MAX_RANKS],
                out: [0; MAX_RANKS],
                scratch: [0; MAX_RANKS],
                sig: [0; MAX_RANKS],
                n: 0,
                slot_bytes: slot,
                nranks: self.n as i32,
                rank_base: 0,
            },
        };
        for (r, rank) in self.ranks.iter().enumerate() {
            let g = rank.gpu;
            let input = match b {
                Backend::OneStagePull | Backend::TwoStagePull => {
                    let buf = alloc(gpus, g, max + GUARD as u64, "a shared input buffer")?;
                    fill_random(&buf, self.group.dtype, 0xB22 + r as u64)
                        .map_err(|e| e.to_string())?;
                    Some(buf)
                }
                _ => None,
            };
            let scratch = match b {
                Backend::OneStagePush | Backend::TwoStagePush => {
                    Some(alloc(gpus, g, slot * (n - 1), "receive slots")?)
                }
                Backend::TwoStagePull => Some(alloc(
                    gpus,
                    g,
                    kernels::slot_bytes(Backend::TwoStagePush, max, n),
                    "a shard buffer",
                )?),
                _ => None,
            };
            let out = match b {
                Backend::TwoStagePush => Some(alloc(
                    gpus,
                    g,
                    max + GUARD as u64,
                    "a shared output buffer",
                )?),
                _ => None,
            };
            let signal = alloc(gpus, g, kernels::signal_bytes(b, self.n), "signal flags")?;
            signal
                .fill(0)
                .map_err(|e| format!("clearing signal flags failed: {e}"))?;
            bufs.args.input[r] = input.as_ref().map_or(rank.user_in.ptr, |x| x.ptr);
            bufs.args.out[r] = out.as_ref().map_or(rank.user_out.ptr, |x| x.ptr);
            bufs.args.scratch[r] = scratch.as_ref().map_or(0, |x| x.ptr);
            bufs.args.sig[r] = signal.ptr;
            bufs.input.push(input);
            bufs.scratch.push(scratch);
            bufs.out.push(out);
            bufs.signal.push(signal);
        }
        Ok(Impl::Custom(Box::new(bufs)))
    }

    /// Creates `b`'s communicators and warms them up. Ok(Err) waives the backend (no NCCL,
    /// out of memory, a setup or warm-up that failed or hung and was aborted); Err means a GPU
    /// is stuck and the run cannot go on.
    fn setup_nccl(
        &mut self,
        gpus: &[Gpu],
        b: Backend,
    ) -> Result<Result<Impl, String>, FabricError> {
        let lib = match nccl::library() {
            Ok(l) => l,
            Err(e) => return Ok(Err(e)),
        };
        let units = self.nccl_units();
        let devices: Vec<i32> = units
            .iter()
            .map(|u| gpus[u.gpu].facts.ordinal as i32)
            .collect();
        let pin = b.nccl_pin().map(|(a, p)| (a.name(), p.name()));
        let bind = |i: usize| {
            gpus[units[i].gpu]
                .ctx
                .bind_to_thread()
                .map_err(|e| format!("binding the CUDA context failed: {e}"))
        };
        let comms = match nccl::Comms::new(lib, &devices, pin, bind, watchdog::INIT_DEADLINE) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        // NCCL connects lazily on the first collective: run one at the largest and one at a
        // small size so the memory measured includes its buffers.
        let mut imp = Impl::Nccl(comms);
        let elems = self.group.max_bytes / self.group.dtype.size();
        let mut failed = None;
        for count in [
            elems.max(1),
            (4096 / self.group.dtype.size()).min(elems.max(1)),
        ] {
            let bytes = count * self.group.dtype.size();
            let limit = self.deadline.for_work(bytes, 1);
            let r = across(gpus, self.nccl_units(), |i, u| {
                self.launch(gpus, b, &imp, i, count)?;
                self.finish(b, &imp, i, u, None, limit, "NCCL warm-up")
            });
            if let Err(e) = r {
                failed = Some(e.to_string());
                break;
            }
        }
        let Some(reason) = failed else {
            return Ok(Ok(imp));
        };
        if let Impl::Nccl(c) = &mut imp {
            c.abort();
        }
        self.drain()?;
        Ok(Err(reason))
    }

    /// Waits (bounded) until every unit's stream is idle; a stream that stays busy marks the
    /// group stuck.
    fn drain(&mut self) -> Result<(), FabricError> {
        if let Some(why) = &self.stuck {
            return Err(FabricError::Device(why.clone()));
        }
        for u in &self.units {
            if let Err(w) = u.stream.wait(watchdog::DRAIN_DEADLINE) {
                let why = match w {
                    Waited::Expired(t) => format!(
                        "GPU {} still had work running {:.0} s after it was aborted: the GPU is stuck; reset it (`nvidia-smi -r`, or reboot) and run again",
                        u.gpu,
                        t.as_secs_f64()
                    ),
                    Waited::Failed(e) => {
                        format!("GPU {} failed while draining its work: {e}; {DEVICE_HINT}", u.gpu)
                    }
                };
                self.stuck = Some(why.clone());
                return Err(FabricError::Device(why));
            }
        }
        Ok(())
    }

    /// Waits for unit `u`'s work (up to `event`, or all of its stream) within `limit`,
    /// watching `imp`'s NCCL communicator for asynchronous errors meanwhile.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        backend: Backend,
        imp: &Impl,
        u: usize,
        unit: &Unit,
        event: Option<&Event>,
        limit: Duration,
        what: &str,
    ) -> Result<(), FabricError> {
        dev(
            unit.stream.ctx().bind_to_thread(),
            "binding the CUDA context",
        )?;
        let comms = match imp {
            Impl::Nccl(c) => Some(c),
            Impl::Custom(_) => None,
        };
        let r = watchdog::wait_real(limit, || {
            let gpu = match event {
                Some(e) => e.query(),
                None => unit.stream.query(),
            };
            match (gpu, comms) {
                (Poll::Pending, Some(c)) => match c.state(u) {
                    Poll::Failed(e) => Poll::Failed(format!("NCCL reported: {e}")),
                    _ => Poll::Pending,
                },
                (g, _) => g,
            }
        });
        r.map_err(|w| {
            let nccl = matches!(&w, Waited::Failed(e) if e.starts_with("NCCL reported"));
            waited(backend, nccl, what, w)
        })
    }

    /// After `e` on `backend`: a timeout or backend failure aborts the backend (its graphs,
    /// then its NCCL communicators), waits for the streams to drain, and drops it from the
    /// group, so the run goes on with the others. Streams that do not drain mean a stuck GPU.
    fn recover(&mut self, backend: Backend, e: FabricError) -> FabricError {
        if !e.backend_local() {
            return e;
        }
        self.graphs.retain(|k, _| k.0 != backend);
        self.warm.retain(|k| k.0 != backend);
        let Some(pos) = self.ready.iter().position(|r| r.backend == backend) else {
            return e;
        };
        let mut r = self.ready.remove(pos);
        if let Impl::Nccl(c) = &mut r.imp {
            c.abort();
        }
        if let Err(stuck) = self.drain() {
            // Its buffers may still be read or written: keep them.
            std::mem::forget(r);
            return FabricError::Device(format!("{e}; {stuck}"));
        }
        e
    }

    /// NCCL uses one rank per GPU: every unit on a real machine, only the first in loopback.
    fn nccl_units(&self) -> &[Unit] {
        if self.loopback {
            &self.units[..1]
        } else {
            &self.units
        }
    }

    fn units_for(&self, b: Backend) -> &[Unit] {
        if b.is_custom() {
            &self.units
        } else {
            self.nccl_units()
        }
    }

    fn find(&self, b: Backend) -> Result<&Ready, FabricError> {
        self.ready.iter().find(|r| r.backend == b).ok_or_else(|| {
            FabricError::BadRequest(format!(
                "backend {b} was not prepared (or was waived) for this group"
            ))
        })
    }

    /// Queues one call of `imp` on unit `u`.
    fn launch(
        &self,
        gpus: &[Gpu],
        backend: Backend,
        imp: &Impl,
        u: usize,
        elems: u64,
    ) -> Result<(), FabricError> {
        let unit = &self.units[u];
        let dtype = self.group.dtype;
        match imp {
            Impl::Custom(c) => {
                let k = gpus[unit.gpu]
                    .kernels
                    .as_ref()
                    .map_err(|e| FabricError::Device(e.clone()))?;
                let sms = gpus[unit.gpu].facts.sms;
                let (f, blocks, threads) = k
                    .plan(backend, dtype, elems, self.n, sms, unit.ranks as u32)
                    .ok_or_else(|| {
                        FabricError::Device(format!("no kernel for {backend} {}", dtype.id()))
                    })?;
                let mut a = c.args;
                a.n = elems;
                a.rank_base = unit.rank_base as i32;
                let pdl = kernels::programmatic_launch(gpus[unit.gpu].facts.cc);
                f.launch_with((blocks, unit.ranks as u32), threads, &unit.stream, &a, pdl)
                    .map_err(|e| FabricError::Backend {
                        backend,
                        reason: format!("kernel launch failed: {e}"),
                    })
            }
            Impl::Nccl(comms) => {
                let r = &self.ranks[unit.rank_base];
                let limit = self.deadline.for_work(elems * dtype.size(), 1);
                // SAFETY: buffers hold max_bytes on the rank's GPU and elems <= max elements.
                unsafe {
                    comms.all_reduce(
                        u,
                        r.user_in.ptr,
                        r.user_out.ptr,
                        elems as usize,
                        dtype,
                        unit.stream.raw as *mut _,
                        limit,
                    )
                }
                .map_err(|w| waited(backend, true, "enqueueing an NCCL allreduce", w))
            }
        }
    }

    fn elems(&self, bytes: u64) -> Result<u64, FabricError> {
        let size = self.group.dtype.size();
        if bytes == 0 || bytes % size != 0 {
            return Err(FabricError::BadRequest(format!(
                "{bytes} bytes is not a whole number of {} elements",
                self.group.dtype.id()
            )));
        }
        if bytes > self.group.max_bytes {
            return Err(FabricError::BadRequest(format!(
                "{bytes} bytes is more than the {} bytes the group was prepared for",
                self.group.max_bytes
            )));
        }
        Ok(bytes / size)
    }

    /// After work finished: a custom backend whose barrier timed out gets its flags cleared
    /// (so it is usable again) and the call reports a timeout.
    fn check_status(&self, gpus: &[Gpu], backend: Backend) -> Result<(), FabricError> {
        let Ok(Impl::Custom(c)) = self.find(backend).map(|r| &r.imp) else {
            return Ok(());
        };
        let mut failed = false;
        for s in &c.signal {
            let mut w = [0u8; 4];
            dev(
                s.download(SIGNAL_STATUS_OFFSET, &mut w),
                "reading barrier status",
            )?;
            failed |= u32::from_le_bytes(w) != 0;
        }
        if failed {
            for s in &c.signal {
                dev(s.fill(0), "clearing signal flags")?;
            }
            let gs: Vec<usize> = self.units.iter().map(|u| u.gpu).collect();
            sync_gpus(gpus, &gs)?;
            return Err(FabricError::Timeout {
                backend,
                what: "a cross-rank barrier waited for a peer that never arrived".into(),
                seconds: 5.0,
            });
        }
        Ok(())
    }

    fn input_buf(&self, b: Backend, r: usize) -> Result<&DevBuf, FabricError> {
        Ok(match &self.find(b)?.imp {
            Impl::Custom(c) => c.input[r].as_ref().unwrap_or(&self.ranks[r].user_in),
            Impl::Nccl(_) => &self.ranks[r].user_in,
        })
    }

    fn output_buf(&self, b: Backend, r: usize) -> Result<&DevBuf, FabricError> {
        Ok(match &self.find(b)?.imp {
            Impl::Custom(c) => c.out[r].as_ref().unwrap_or(&self.ranks[r].user_out),
            Impl::Nccl(_) => &self.ranks[r].user_out,
        })
    }

    /// Refuses work once a GPU of the group is stuck.
    fn check_stuck(&self) -> Result<(), FabricError> {
        match &self.stuck {
            Some(why) => Err(FabricError::Device(why.clone())),
            None => Ok(()),
        }
    }

    /// Runs `backend` on fresh data drawn from `seed` (`calls` times, eagerly or as one
    /// graph replayed twice) and compares every rank's output with the host reference. A
    /// backend that hangs or fails is aborted and dropped from the group (see `recover`).
    pub fn verify(
        &mut self,
        gpus: &[Gpu],
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Verification, FabricError> {
        self.check_stuck()?;
        self.verify_inner(gpus, backend, bytes, seed, mode, calls)
            .map_err(|e| self.recover(backend, e))
    }

    fn verify_inner(
        &mut self,
        gpus: &[Gpu],
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Verification, FabricError> {
        let elems = self.elems(bytes)?;
        let dtype = self.group.dtype;
        let units = self.units_for(backend);
        // Custom kernels run every rank; NCCL one per GPU (one in loopback).
        let nr = if backend.is_custom() {
            self.n
        } else {
            units.len()
        };
        let inputs: Vec<Vec<f32>> = (0..nr)
            .map(|r| data::rank_values(seed, r, elems as usize))
            .collect();
        for (r, v) in inputs.iter().enumerate() {
            dev(
                self.input_buf(backend, r)?
                    .upload(0, &data::encode(dtype, v)),
                "uploading test data",
            )?;
            let out = self.output_buf(backend, r)?;
            let span = (bytes as usize + GUARD).min(out.bytes);
            dev(out.fill_range(0, span, 0xff), "poisoning the output")?;
        }
        let gs: Vec<usize> = units.iter().map(|u| u.gpu).collect();
        sync_gpus(gpus, &gs)?;
        let imp = &self.find(backend)?.imp;
        let what = format!("{backend} allreduce of {bytes} bytes");
        match mode {
            Mode::Eager => {
                let limit = self.deadline.for_work(bytes, calls.max(1));
                across(gpus, units, |i, u| {
                    for _ in 0..calls.max(1) {
                        self.launch(gpus, backend, imp, i, elems)?;
                    }
                    self.finish(backend, imp, i, u, None, limit, &what)
                })?;
            }
            Mode::Graph => {
                let graphs = self.capture(gpus, backend, imp, units, elems, calls.max(1))?;
                let limit = self.deadline.for_work(bytes, 2 * calls.max(1));
                let r = across(gpus, units, |i, u| {
                    for _ in 0..2 {
                        dev(graphs[i].launch(&u.stream), "launching a CUDA graph")?;
                    }
                    self.finish(backend, imp, i, u, None, limit, &what)
                });
                // Graphs hold NCCL's communicator: the caller may abort it on an error.
                drop(graphs);
                r?;
            }
        }
        self.check_status(gpus, backend)?;
        let want = data::reference(dtype, &inputs);
        for r in 0..nr {
            let out = self.output_buf(backend, r)?;
            let span = (bytes as usize + GUARD).min(out.bytes);
            let mut got = vec![0u8; span];
            dev(out.download(0, &mut got), "reading the output")?;
            if let Some(diff) = data::compare(dtype, &got[..bytes as usize], &want) {
                return Ok(Verification::Wrong {
                    reason: format!(
                        "{backend} at {bytes} bytes ({}), rank {r}: {diff}",
                        mode.id()
                    ),
                });
            }
            if let Some(i) = got[bytes as usize..].iter().position(|&b| b != 0xff) {
                return Ok(Verification::Wrong {
                    reason: format!("{backend} at {bytes} bytes, rank {r}: wrote past the end of the output (byte {})", bytes as usize + i),
                });
            }
        }
        Ok(Verification::Correct)
    }

    /// Captures `calls` calls on every unit into one graph per unit.
    fn capture(
        &self,
        gpus: &[Gpu],
        backend: Backend,
        imp: &Impl,
        units: &[Unit],
        elems: u64,
        calls: u32,
    ) -> Result<Vec<Graph>, FabricError> {
        let bytes = elems * self.group.dtype.size();
        let limit = self.deadline.for_work(bytes, calls);
        let what = format!("first replay of a CUDA graph of {calls} {backend} calls");
        across(gpus, units, |i, u| {
            dev(u.stream.begin_capture(), "starting a graph capture")?;
            for _ in 0..calls {
                if let Err(e) = self.launch(gpus, backend, imp, i, elems) {
                    u.stream.abort_capture();
                    return Err(e);
                }
            }
            let g = dev(u.stream.end_capture(), "instantiating a CUDA graph")?;
            // First replay: loads the graph and warms the kernels.
            dev(g.launch(&u.stream), "launching a CUDA graph")?;
            self.finish(backend, imp, i, u, None, limit, &what)?;
            Ok(g)
        })
    }

    /// Microseconds per call for each of `samples` batches of `batch` calls. A backend that
    /// hangs or fails is aborted and dropped from the group (see `recover`).
    pub fn time(
        &mut self,
        gpus: &[Gpu],
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        self.check_stuck()?;
        self.time_inner(gpus, backend, bytes, mode, batch, samples)
            .map_err(|e| self.recover(backend, e))
    }

    fn time_inner(
        &mut self,
        gpus: &[Gpu],
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        let elems = self.elems(bytes)?;
        let batch = batch.max(1);
        let key = (backend, bytes, batch);
        if mode == Mode::Graph && !self.graphs.contains_key(&key) {
            if self.graphs.len() >= 32 {
                self.graphs.clear();
            }
            let imp = &self.find(backend)?.imp;
            let g = self.capture(gpus, backend, imp, self.units_for(backend), elems, batch)?;
            self.check_status(gpus, backend)?;
            self.graphs.insert(key, g);
        }
        let what = format!("{backend} allreduce of {bytes} bytes");
        if mode == Mode::Eager && !self.warm.contains(&(backend, bytes)) {
            let imp = &self.find(backend)?.imp;
            let limit = self.deadline.for_work(bytes, 3);
            across(gpus, self.units_for(backend), |i, u| {
                for _ in 0..3 {
                    self.launch(gpus, backend, imp, i, elems)?;
                }
                self.finish(backend, imp, i, u, None, limit, &what)
            })?;
            self.check_status(gpus, backend)?;
            self.warm.insert((backend, bytes));
        }
        let imp = &self.find(backend)?.imp;
        let units = self.units_for(backend);
        let graphs = self.graphs.get(&key);
        let limit = self.deadline.for_work(bytes, batch);
        let barrier = Barrier::new(units.len());
        let failed = AtomicBool::new(false);
        let first_err: Mutex<Option<FabricError>> = Mutex::new(None);
        let per_unit = across(gpus, units, |i, u| {
            let mut out = Vec::with_capacity(samples as usize);
            for _ in 0..samples {
                // Start each sample together on every GPU; after a failure keep meeting the
                // barrier so no thread waits for ever.
                barrier.wait();
                if failed.load(Ordering::Relaxed) {
                    continue;
                }
                let r = (|| -> Result<f64, FabricError> {
                    dev(u.start.record(&u.stream), "recording an event")?;
                    match (mode, graphs) {
                        (Mode::Graph, Some(g)) => {
                            dev(g[i].launch(&u.stream), "launching a CUDA graph")?
                        }
                        _ => {
                            for _ in 0..batch {
                                self.launch(gpus, backend, imp, i, elems)?;
                            }
                        }
                    }
                    dev(u.stop.record(&u.stream), "recording an event")?;
                    self.finish(backend, imp, i, u, Some(&u.stop), limit, &what)?;
                    let ms = dev(u.start.elapsed_ms(&u.stop), "reading the timing events")?;
                    Ok(ms as f64 * 1000.0 / batch as f64)
                })();
                match r {
                    Ok(us) => out.push(us),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        let mut slot = first_err.lock().unwrap_or_else(|p| p.into_inner());
                        slot.get_or_insert(e);
                    }
                }
            }
            self.finish(backend, imp, i, u, None, limit, &what)?;
            Ok(out)
        })?;
        if let Some(e) = first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        self.check_status(gpus, backend)?;
        // The collective takes as long as its slowest rank.
        Ok((0..samples as usize)
            .map(|s| {
                per_unit
                    .iter()
                    .filter_map(|v| v.get(s))
                    .fold(0.0f64, |a, &b| a.max(b))
            })
            .collect())
    }
}

fn free_on(gpus: &[Gpu], which: &[usize]) -> Result<Vec<u64>, FabricError> {
    which
        .iter()
        .map(|&g| {
            dev(
                driver::free_bytes(&gpus[g].ctx),
                "reading free device memory",
            )
        })
        .collect()
}

/// Enables peer access between every pair; Err names the first pair without P2P.
fn enable_peers(gpus: &[Gpu], which: &[usize]) -> Result<(), String> {
    for &a in which {
        for &b in which {
            if a == b {
                continue;
            }
            let (ca, cb) = (&gpus[a].ctx, &gpus[b].ctx);
            match driver::can_access_peer(ca, cb) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "P2P is not available from GPU {} to GPU {} (cuDeviceCanAccessPeer says no); custom kernels need peer access",
                        gpus[a].facts.ordinal, gpus[b].facts.ordinal
                    ))
                }
                Err(e) => return Err(format!("cuDeviceCanAccessPeer failed: {e}")),
            }
            driver::enable_peer(ca, cb).map_err(|e| {
                format!(
                    "enabling peer access from GPU {} to GPU {} failed: {e}",
                    gpus[a].facts.ordinal, gpus[b].facts.ordinal
                )
            })?;
        }
    }
    Ok(())
}

fn custom_waiver(
    gpus: &[Gpu],
    which: &[usize],
    p2p: &Result<(), String>,
    n: usize,
) -> Option<String> {
    if let Err(e) = p2p {
        return Some(e.clone());
    }
    if n > MAX_RANKS {
        return Some(format!(
            "custom kernels support at most {MAX_RANKS} ranks; this group has {n}"
        ));
    }
    which
        .iter()
        .find_map(|&g| gpus[g].kernels.as_ref().err().cloned())
}

fn nccl_waiver(b: Backend, loopback: bool) -> Option<String> {
    if let Err(e) = nccl::library() {
        return Some(e);
    }
    if loopback && b.nccl_pin().is_some() {
        return Some(
            "loopback runs NCCL with one rank, which only copies locally and uses no algorithm or \
             protocol, so pinning NCCL_ALGO/NCCL_PROTO measures nothing different from `nccl`"
                .into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_a_timeout_an_nccl_error_fails_the_backend_and_cuda_the_device() {
        let b = Backend::NcclRingLl;
        let e = waited(b, true, "x", Waited::Expired(Duration::from_secs(12)));
        assert!(e.backend_local(), "{e}");
        assert!(
            e.to_string().contains("within 12.0 s (x); it was aborted"),
            "{e}"
        );
        let e = waited(b, true, "x", Waited::Failed("remote process exited".into()));
        assert!(matches!(e, FabricError::Backend { .. }), "{e}");
        let e = waited(
            Backend::OneStagePull,
            false,
            "x",
            Waited::Failed("an illegal memory access was encountered".into()),
        );
        assert!(!e.backend_local(), "{e}");
        assert!(e.to_string().contains("nvidia-smi"), "{e}");
    }
}
