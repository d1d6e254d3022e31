//! Contention probes, worker side: every launched rank moves bytes with `peers` peers at once.
//! Each rank's source and receive buffers are owned by its worker and opened by the others
//! through IPC handles; all ranks wait on one start latch (a device word owned by rank 0's
//! worker) that the coordinator releases once every worker has queued its probe, and NVML
//! reads the links while the traffic runs.

use std::ffi::c_void;
use std::time::Duration;

use super::driver::{self, dev, DevBuf, Event, Imported, Span, Stream};
use super::kernels;
use super::layout::{ProbeArgs, MAX_RANKS, THREADS};
use super::protocol::{Launch, ProbeHandles};
use super::topo;
use super::watchdog;
use super::Gpu;
use crate::fabric::{DeviceError, Direction, FabricError};
use crate::topology::reading::LinkReading;

/// Probe buffers of the ranks a worker owns, and the latch if it owns rank 0.
pub struct ProbeOwned {
    /// Per owned rank: (rank, source, receive area).
    ranks: Vec<(usize, DevBuf, DevBuf)>,
    latch: Option<DevBuf>,
    /// Where a release is written from, beside the probe streams. Made before them with no
    /// stream made in between (ProbeSetup, then ProbeConnect), so CUDA, handing streams its
    /// hardware queues in turn, gives the k + 1 streams k + 1 queues where the worker has as
    /// many (coordinator::processes::queues).
    side: Stream,
}

impl ProbeOwned {
    pub fn new(
        gpu: &Gpu,
        bytes: u64,
        owned: &[usize],
        n: usize,
    ) -> Result<(ProbeOwned, Vec<ProbeHandles>), FabricError> {
        let ctx = &gpu.ctx;
        let mut p = ProbeOwned {
            ranks: Vec::new(),
            latch: None,
            side: dev(Stream::new(ctx), "creating a stream")?,
        };
        let ex = |b: &DevBuf| dev(b.export(), "exporting an IPC handle (cuIpcGetMemHandle)");
        let mut out = Vec::new();
        for &r in owned {
            let src = dev(
                DevBuf::alloc(ctx, bytes as usize),
                "allocating probe buffers",
            )?;
            dev(src.fill(0x5a), "filling probe buffers")?;
            let dst = dev(
                DevBuf::alloc(ctx, (bytes * (n as u64 - 1).max(1)) as usize),
                "allocating probe buffers",
            )?;
            let latch = if r == 0 {
                let l = dev(DevBuf::alloc(ctx, 16), "allocating the probe latch")?;
                dev(l.fill(0), "clearing the probe latch")?;
                let h = ex(&l)?;
                p.latch = Some(l);
                Some(h)
            } else {
                None
            };
            out.push(ProbeHandles {
                rank: r,
                src: ex(&src)?,
                dst: ex(&dst)?,
                latch,
            });
            p.ranks.push((r, src, dst));
        }
        driver::sync_ctx(ctx, "synchronizing the GPU")?;
        Ok((p, out))
    }

    /// Releases every queued probe of round `epoch`.
    pub fn release(&self, epoch: u32) -> Result<(), FabricError> {
        let Some(l) = &self.latch else {
            return Err(FabricError::BadRequest(
                "this worker does not own the probe latch".into(),
            ));
        };
        dev(
            self.side.set_u32(&l.span(), epoch),
            "releasing the probe latch",
        )?;
        self.side
            .finish(watchdog::OP_DEADLINE, "releasing the probe latch")
    }
}

/// One launched rank's stream, timing events and status words.
struct Lane {
    rank: usize,
    stream: Stream,
    events: (Event, Event),
    /// [status word, sink word].
    words: DevBuf,
}

/// What a launching worker needs to run probes: every rank's buffers as it sees them.
pub struct ProbeLauncher {
    launch: Launch,
    n: usize,
    src: Vec<Span>,
    dst: Vec<Span>,
    latch: Span,
    lanes: Vec<Lane>,
    _imported: Vec<Imported>,
}

impl ProbeLauncher {
    pub fn connect(
        gpu: &Gpu,
        owned: Option<&ProbeOwned>,
        launch: Launch,
        n: usize,
        handles: &[ProbeHandles],
    ) -> Result<ProbeLauncher, FabricError> {
        let ctx = &gpu.ctx;
        let mut imported = Vec::new();
        let mut open =
            |own: Option<Span>, h: &super::driver::IpcHandle| -> Result<Span, FabricError> {
                if let Some(s) = own {
                    return Ok(s);
                }
                let i = Imported::open(ctx, h).map_err(|e| DeviceError::Ipc {
                    gpu: gpu.facts.ordinal,
                    what: "a peer's probe buffer".into(),
                    detail: e.to_string(),
                })?;
                let s = i.span();
                imported.push(i);
                Ok(s)
            };
        let mine = |r: usize| {
            owned.and_then(|o| {
                o.ranks
                    .iter()
                    .find(|x| x.0 == r)
                    .map(|(_, s, d)| (s.span(), d.span()))
            })
        };
        let mut src = Vec::new();
        let mut dst = Vec::new();
        let mut latch = None;
        for h in handles {
            let own = mine(h.rank);
            let (own_src, own_dst) = own.unzip();
            src.push(open(own_src, &h.src)?);
            dst.push(open(own_dst, &h.dst)?);
            if let Some(l) = &h.latch {
                let own_latch = owned.and_then(|o| o.latch.as_ref()).map(|b| b.span());
                latch = Some(open(own_latch, l)?);
            }
        }
        let latch = latch.ok_or_else(|| {
            FabricError::BadRequest("no probe handles carry the start latch".into())
        })?;
        let mut lanes = Vec::new();
        for r in launch.base..launch.base + launch.count {
            let words = dev(DevBuf::alloc(ctx, 16), "allocating probe status")?;
            dev(words.fill(0), "clearing probe status")?;
            lanes.push(Lane {
                rank: r,
                stream: dev(Stream::new(ctx), "creating a stream")?,
                events: (
                    dev(Event::new(ctx), "creating an event")?,
                    dev(Event::new(ctx), "creating an event")?,
                ),
                words,
            });
        }
        driver::sync_ctx(ctx, "synchronizing the GPU")?;
        Ok(ProbeLauncher {
            launch,
            n,
            src,
            dst,
            latch,
            lanes,
            _imported: imported,
        })
    }

    /// Queues, on each launched rank's stream, the latch wait for `epoch` and the probe.
    pub fn queue(
        &self,
        gpu: &Gpu,
        direction: Direction,
        peers: usize,
        bytes: u64,
        epoch: u32,
    ) -> Result<(), FabricError> {
        let k = gpu.kernels()?;
        let n = self.n;
        let bytes = bytes / 16 * 16;
        if bytes == 0 || self.src.iter().any(|s| (s.bytes() as u64) < bytes) || peers >= n {
            return Err(FabricError::BadRequest(format!(
                "a probe of {bytes} bytes with {peers} peers does not fit the probe buffers"
            )));
        }
        let mut args = ProbeArgs {
            src: [0; MAX_RANKS],
            dst: [0; MAX_RANKS],
            bytes,
            sink: 0,
            nranks: n as i32,
            rank: 0,
            peers: peers as i32,
            pad: 0,
        };
        for r in 0..n {
            args.src[r] = self.src[r].ptr();
            args.dst[r] = self.dst[r].ptr();
        }
        dev(gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        for lane in &self.lanes {
            let s = &lane.stream;
            let (mut latch_ptr, mut go, mut status) = (self.latch.ptr(), epoch, lane.words.ptr());
            let mut params = [
                &mut latch_ptr as *mut u64 as *mut c_void,
                &mut go as *mut u32 as *mut c_void,
                &mut status as *mut u64 as *mut c_void,
            ];
            // SAFETY: latch_wait(const u32*, u32, u32*): the latch and status words are live
            // 16-byte device allocations.
            dev(
                unsafe { k.latch_wait.launch_raw((1, 1), 32, s, &mut params) },
                "launching the probe latch",
            )?;
            dev(lane.events.0.record(s), "recording an event")?;
            let f = match direction {
                Direction::Read => &k.probe_read,
                Direction::Write => &k.probe_write,
            };
            let blocks = kernels::block_cap(gpu.facts.sms, 1, self.launch.count as u32)
                .min((bytes / 16).div_ceil(THREADS as u64).max(1) as u32);
            let mut a = args;
            a.rank = lane.rank as i32;
            a.sink = lane.words.ptr() + 4;
            // SAFETY: every rank's source holds `bytes` and its receive area `bytes` per
            // distance (checked above); the kernel takes one ProbeArgs.
            dev(
                unsafe { f.launch((blocks, 1), THREADS, s, &a) },
                "launching the probe",
            )?;
            dev(lane.events.1.record(s), "recording an event")?;
        }
        Ok(())
    }

    /// Reads this GPU's link while the released probe runs, then waits for it: seconds per
    /// launched rank.
    pub fn finish(
        &self,
        gpu: &Gpu,
        bytes: u64,
        peers: usize,
    ) -> Result<(Vec<f64>, Vec<LinkReading>), FabricError> {
        let links = topo::read_links(&[(gpu.facts.ordinal, &gpu.facts)]);
        let mut secs = Vec::new();
        dev(gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        for lane in &self.lanes {
            // The latch kernel gives up by itself after 10 s; the watchdog waits beyond that.
            let limit = watchdog::Deadline::from_env().for_work(bytes * peers as u64, 1)
                + Duration::from_secs(10);
            lane.stream.finish(limit, "a contention probe")?;
            let ms = dev(
                lane.events.0.elapsed_ms(&lane.events.1),
                "reading the timing events",
            )?;
            let mut w = [0u8; 4];
            dev(lane.words.download(0, &mut w), "reading probe status")?;
            if u32::from_le_bytes(w) != 0 {
                return Err(DeviceError::LatchNeverReleased.into());
            }
            secs.push((ms as f64 / 1000.0).max(1e-9));
        }
        Ok((secs, links))
    }
}
