//! Worker side of running a prepared group: launching a backend's calls for the ranks this
//! worker launches, capturing them into CUDA graphs, timing batches, and recovering from a
//! backend that hung or failed (abort, drain, forget it).

use std::time::Duration;

use super::copy;
use super::driver::{dev, Event, Graph};
use super::kernels;
use super::layout::SIGNAL_STATUS_OFFSET;
use super::setup::{padded, registered_slot_offset, Impl, Launcher, Ready, REGISTERED_GEN};
use super::watchdog::{self, Poll, Waited};
use super::{Gpu, WorkerFaults};
use crate::allreduce::Executor;
use crate::fabric::{Backend, DeviceError, FabricError, Mode};

/// Maps the end of a wait on `backend`'s work to the error the harness acts on.
pub fn waited(backend: Backend, nccl: bool, what: &str, w: Waited) -> FabricError {
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
        Waited::Failed(code) => FabricError::Device(DeviceError::Driver {
            what: what.into(),
            code,
        }),
    }
}

impl Launcher {
    pub fn find(&self, b: Backend) -> Result<&Ready, FabricError> {
        self.ready.iter().find(|r| r.backend == b).ok_or_else(|| {
            FabricError::BadRequest(format!(
                "backend {b} was not prepared (or was waived) for this group"
            ))
        })
    }

    pub fn elems(&self, bytes: u64) -> Result<u64, FabricError> {
        let size = self.shape.dtype.size();
        if bytes == 0 || !bytes.is_multiple_of(size) {
            return Err(FabricError::BadRequest(format!(
                "{bytes} bytes is not a whole number of {} elements",
                self.shape.dtype.id()
            )));
        }
        if bytes > self.shape.max_bytes {
            return Err(FabricError::BadRequest(format!(
                "{bytes} bytes is more than the {} bytes the group was prepared for",
                self.shape.max_bytes
            )));
        }
        Ok(bytes / size)
    }

    /// Fails at once on a poisoned context: nothing more is launched there.
    pub fn check_stuck(&self) -> Result<(), FabricError> {
        match self.unit.stream.ctx().poisoned() {
            Some(why) => Err(why.clone().into()),
            None => Ok(()),
        }
    }

    /// Queues one call of `backend` for this worker's ranks.
    ///
    /// # Safety
    /// `elems` is at most the group's largest message, so every buffer the kernel or NCCL
    /// touches (each sized for that message at setup) holds it; the buffers stay alive until
    /// the stream has drained (Drop and `recover` drain before freeing).
    unsafe fn launch(
        &self,
        gpu: &Gpu,
        faults: &WorkerFaults,
        backend: Backend,
        elems: u64,
        mode: Mode,
    ) -> Result<(), FabricError> {
        let unit = &self.unit;
        let dtype = self.shape.dtype;
        if faults.hang == Some(backend) {
            return faults.launch_hang(gpu, &unit.stream);
        }
        match &self.find(backend)?.imp {
            Impl::Custom(c) if self.runs_copies(backend) => {
                let call = copy::Call {
                    backend,
                    dtype,
                    elems,
                    ranks: self.shape.ranks(),
                    local: self.launch.base..self.launch.base + self.launch.count,
                    max_bytes: padded(self.shape.max_bytes),
                    absent: faults.absent.filter(|a| a.0 == backend).map(|a| a.1),
                    watch: None,
                };
                // SAFETY: `c.args` holds every rank's buffers of the backend, allocated for
                // the group's largest message (the function's contract); the stream is this
                // worker's.
                unsafe {
                    copy::launch(
                        &call,
                        &c.args,
                        gpu.kernels()?,
                        gpu.facts.sms,
                        unit.stream.raw,
                    )
                }
            }
            Impl::Custom(c) => {
                let count = self.launch.count as u32;
                let work = kernels::Work {
                    backend,
                    dtype,
                    elems,
                    ranks: self.shape.ranks(),
                    base: self.launch.base,
                    count,
                    on_gpu: count,
                    // Graph mode runs the registered form where the backend has one, as an
                    // engine's registered graph does; the fault knob's `unregistered` gives it
                    // a generation its slot never holds (a replay before registration).
                    registered: (mode == Mode::Graph).then(|| kernels::Registered {
                        slot: self.reg.ptr() + registered_slot_offset(backend),
                        gen: match faults.unregistered == Some(backend) {
                            true => REGISTERED_GEN + 1,
                            false => REGISTERED_GEN,
                        },
                        missed: 0,
                    }),
                };
                // SAFETY: `c.args` holds every rank's buffers, sized for the group's largest
                // message (see the function's contract); the stream is this worker's.
                unsafe {
                    gpu.kernels()?
                        .launch(work, &c.args, &gpu.facts, unit.stream.raw)
                }
            }
            Impl::Nccl { comms, rank, .. } => {
                let (send, recv) = &self.user[*rank.min(&(self.user.len() - 1))];
                let limit = self.deadline.for_work(elems * dtype.size(), 1);
                // SAFETY: the rank's user buffers hold the largest message; elems fits it.
                unsafe {
                    comms.all_reduce(
                        0,
                        send.ptr(),
                        recv.ptr(),
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

    /// Whether `backend`'s calls are copies rather than one kernel.
    fn runs_copies(&self, backend: Backend) -> bool {
        match backend.executor() {
            Executor::CopyEngine(_) => true,
            Executor::Nccl | Executor::SmKernel => false,
        }
    }

    /// Queues `calls` calls; see [`Launcher::launch`] for the contract, met by `elems` coming
    /// from [`Launcher::elems`].
    pub fn launch_calls(
        &self,
        gpu: &Gpu,
        faults: &WorkerFaults,
        backend: Backend,
        elems: u64,
        calls: u32,
        mode: Mode,
    ) -> Result<(), FabricError> {
        if elems * self.shape.dtype.size() > self.shape.max_bytes {
            return Err(FabricError::BadRequest(format!(
                "{elems} elements are more than the group was prepared for"
            )));
        }
        let repeats = match faults.slow {
            Some((b, k)) if b == backend => k,
            _ => 1,
        };
        for _ in 0..calls * repeats {
            // SAFETY: elems fits the group's buffers (checked above).
            unsafe { self.launch(gpu, faults, backend, elems, mode) }?;
        }
        Ok(())
    }

    /// Waits for this worker's work (up to `event`, or all of its stream) within `limit`,
    /// watching the backend's NCCL communicator for asynchronous errors meanwhile.
    pub fn finish(
        &self,
        backend: Backend,
        event: Option<&Event>,
        limit: Duration,
        what: &str,
    ) -> Result<(), FabricError> {
        let unit = &self.unit;
        dev(
            unit.stream.ctx().bind_to_thread(),
            "binding the CUDA context",
        )?;
        let comms = match self.find(backend).map(|r| &r.imp) {
            Ok(Impl::Nccl { comms, .. }) => Some(comms),
            _ => None,
        };
        let mut nccl_failed = false;
        let r = watchdog::wait_real(limit, || {
            let gpu = match event {
                Some(e) => e.query(),
                None => unit.stream.query(),
            };
            match (gpu, comms) {
                (Poll::Pending, Some(c)) => match c.state(0) {
                    Poll::Failed(e) => {
                        nccl_failed = true;
                        Poll::Failed(format!("NCCL reported: {e}"))
                    }
                    _ => Poll::Pending,
                },
                (g, _) => g,
            }
        });
        r.map_err(|w| waited(backend, nccl_failed, what, w))
    }

    /// After work finished: a custom backend whose barrier timed out on one of this worker's
    /// ranks gets its flags cleared (so it is usable again) and the call reports a timeout.
    pub fn check_status(&self, backend: Backend) -> Result<(), FabricError> {
        let Ok(Impl::Custom(c)) = self.find(backend).map(|r| &r.imp) else {
            return Ok(());
        };
        let mine = self.launch.base..self.launch.base + self.launch.count;
        let mut failed = false;
        for s in &c.signal[mine.clone()] {
            let mut w = [0u8; 4];
            dev(
                s.download(SIGNAL_STATUS_OFFSET, &mut w),
                "reading barrier status",
            )?;
            failed |= u32::from_le_bytes(w) != 0;
        }
        if failed {
            for s in &c.signal[mine] {
                dev(s.fill_range(0, s.bytes(), 0), "clearing signal flags")?;
            }
            return Err(FabricError::Timeout {
                backend,
                what: "a cross-rank barrier waited for a peer that never arrived".into(),
                seconds: 5.0,
            });
        }
        Ok(())
    }

    /// Runs a few calls at `elems` and waits for them.
    pub fn warm_up(&self, gpu: &Gpu, backend: Backend, elems: u64) -> Result<(), FabricError> {
        let bytes = elems * self.shape.dtype.size();
        let limit = self.deadline.for_work(bytes, 1);
        self.launch_calls(
            gpu,
            &WorkerFaults::default(),
            backend,
            elems,
            1,
            Mode::Eager,
        )?;
        self.finish(backend, None, limit, "NCCL warm-up")
    }

    /// Captures `calls` calls into one graph and replays it once (loads it, warms the kernels).
    pub fn capture(
        &self,
        gpu: &Gpu,
        faults: &WorkerFaults,
        backend: Backend,
        elems: u64,
        calls: u32,
    ) -> Result<Graph, FabricError> {
        let u = &self.unit;
        let bytes = elems * self.shape.dtype.size();
        let limit = self.deadline.for_work(bytes, calls);
        let what = format!("first replay of a CUDA graph of {calls} {backend} calls");
        dev(u.stream.begin_capture(), "starting a graph capture")?;
        if let Err(e) = self.launch_calls(gpu, faults, backend, elems, calls, Mode::Graph) {
            u.stream.abort_capture();
            return Err(e);
        }
        let g = dev(u.stream.end_capture(), "instantiating a CUDA graph")?;
        dev(g.launch(&u.stream), "launching a CUDA graph")?;
        self.finish(backend, None, limit, &what)?;
        Ok(g)
    }

    /// Microseconds per call for each of `samples` batches of `batch` calls. With
    /// `rendezvous`, each sample starts after one untimed call: it ends on every rank only once
    /// all ranks reached it, so the timed batches start together on the device and a sample
    /// holds no host wake-up skew.
    #[allow(clippy::too_many_arguments)]
    pub fn time(
        &mut self,
        gpu: &Gpu,
        faults: &WorkerFaults,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
        rendezvous: bool,
    ) -> Result<Vec<f64>, FabricError> {
        self.check_stuck()?;
        self.time_inner(
            gpu, faults, backend, bytes, mode, batch, samples, rendezvous,
        )
        .map_err(|e| self.recover(backend, e))
    }

    #[allow(clippy::too_many_arguments)]
    fn time_inner(
        &mut self,
        gpu: &Gpu,
        faults: &WorkerFaults,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
        rendezvous: bool,
    ) -> Result<Vec<f64>, FabricError> {
        let elems = self.elems(bytes)?;
        let batch = batch.max(1);
        let key = (backend, bytes, batch);
        let entered = std::time::Instant::now();
        if mode == Mode::Graph && !self.graphs.contains_key(&key) {
            if self.graphs.len() >= 32 {
                self.graphs.clear();
            }
            let g = self.capture(gpu, faults, backend, elems, batch)?;
            self.check_status(backend)?;
            self.graphs.insert(key, g);
        }
        let what = format!("{backend} allreduce of {}", crate::units::fmt_size(bytes));
        if mode == Mode::Eager && !self.warm.contains(&(backend, bytes)) {
            let limit = self.deadline.for_work(bytes, 3);
            self.launch_calls(gpu, faults, backend, elems, 3, Mode::Eager)?;
            self.finish(backend, None, limit, &what)?;
            self.check_status(backend)?;
            self.warm.insert((backend, bytes));
        }
        let u = &self.unit;
        let graph = self.graphs.get(&key).filter(|_| mode == Mode::Graph);
        let limit = self.deadline.for_work(bytes, batch + 1);
        let mut out = Vec::with_capacity(samples as usize);
        let sampling = std::time::Instant::now();
        for _ in 0..samples {
            if rendezvous {
                self.launch_calls(gpu, faults, backend, elems, 1, Mode::Eager)?;
            }
            dev(u.start.record(&u.stream), "recording an event")?;
            match graph {
                Some(g) => dev(g.launch(&u.stream), "launching a CUDA graph")?,
                None => self.launch_calls(gpu, faults, backend, elems, batch, Mode::Eager)?,
            }
            dev(u.stop.record(&u.stream), "recording an event")?;
            self.finish(backend, Some(&u.stop), limit, &what)?;
            let ms = dev(u.start.elapsed_ms(&u.stop), "reading the timing events")?;
            out.push(ms as f64 * 1000.0 / batch as f64);
        }
        self.finish(backend, None, limit, &what)?;
        self.check_status(backend)?;
        // Where a request's time goes, for the tool's own speed: set-up (capture, warm-up),
        // the samples' wall time, and the part of it the GPU's events timed.
        tracing::debug!(
            target: "artune::timing",
            "worker {backend} {bytes} {mode:?} {batch}x{samples}: set-up {:.3} ms, samples {:.3} ms wall, {:.3} ms timed",
            (sampling - entered).as_secs_f64() * 1e3,
            sampling.elapsed().as_secs_f64() * 1e3,
            out.iter().sum::<f64>() * batch as f64 / 1e3
        );
        Ok(out)
    }

    /// Waits (bounded) until the stream is idle; a stream that stays busy poisons the
    /// context (the GPU is stuck, and nothing its work may touch is freed).
    pub fn drain(&mut self) -> Result<(), FabricError> {
        self.drain_after("a backend was aborted")
    }

    /// [`Launcher::drain`] after `after` went wrong (named in the error).
    fn drain_after(&mut self, after: &str) -> Result<(), FabricError> {
        self.check_stuck()?;
        if let Err(w) = self.unit.stream.wait(watchdog::DRAIN_DEADLINE) {
            let why = match w {
                Waited::Expired(t) => DeviceError::Undrained {
                    after: after.into(),
                    seconds: t.as_secs_f64(),
                },
                Waited::Failed(code) => DeviceError::Driver {
                    what: format!("draining the GPU's work after {after}"),
                    code,
                },
            };
            self.unit.stream.ctx().poison(why.clone());
            return Err(why.into());
        }
        Ok(())
    }

    /// Drops `backend`: its graphs, then its NCCL communicator (aborted).
    pub fn forget(&mut self, backend: Backend) {
        self.graphs.retain(|k, _| k.0 != backend);
        self.warm.retain(|k| k.0 != backend);
        if let Some(pos) = self.ready.iter().position(|r| r.backend == backend) {
            let mut r = self.ready.remove(pos);
            if let Impl::Nccl { comms, .. } = &mut r.imp {
                comms.abort();
            }
            // Its memory is freed only if the context is not poisoned (see driver::Ctx).
            drop(r);
        }
    }

    /// Lets a copy-engine backend's stream past waits for a peer that never arrives: every
    /// inbox word of this worker's ranks is set from the host (a synchronous copy, which does
    /// not queue behind the worker's non-blocking stream), so the stream drains and the
    /// backend can be forgotten without marking the GPU stuck. Best effort: a stream that
    /// still does not drain is found by the drain after it.
    fn release_copies(&self, backend: Backend) {
        let Ok(Impl::Custom(c)) = self.find(backend).map(|r| &r.imp) else {
            return;
        };
        if !self.runs_copies(backend) {
            return;
        }
        let words = copy::steps::released();
        let mine = self.launch.base..self.launch.base + self.launch.count;
        for s in c.signal.get(mine).unwrap_or_default() {
            let _ = s.upload(0, &words);
        }
    }

    /// After `e` on `backend`: a timeout or backend failure aborts and forgets the backend
    /// and drains the stream, so the group goes on with the others. A stream that does not
    /// drain marks the GPU stuck: the coordinator then replaces this worker.
    pub fn recover(&mut self, backend: Backend, e: FabricError) -> FabricError {
        if !e.backend_local() {
            return e;
        }
        self.release_copies(backend);
        self.forget(backend);
        match self.drain_after(&e.to_string()) {
            Ok(()) => e,
            Err(stuck) => stuck,
        }
    }
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
