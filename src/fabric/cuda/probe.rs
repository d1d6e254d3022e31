//! Contention probes: every rank moves bytes with `peers` peers at once, all ranks released
//! together by a host latch, each rank on its own stream; NVML reads the PCIe links while the
//! traffic runs.

use std::ffi::c_void;

use std::time::Duration;

use super::driver::{dev, sync_ctx, wait_dev, DevBuf, Event, HostWord, Stream};
use super::kernels::{self, ProbeArgs, MAX_RANKS, THREADS};
use super::topo::{self, LinkReading};
use super::watchdog;
use super::Gpu;
use crate::fabric::{Direction, FabricError, ProbeSample};

pub struct ProbeBufs {
    bytes: u64,
    src: Vec<DevBuf>,
    dst: Vec<DevBuf>,
    streams: Vec<Stream>,
    events: Vec<(Event, Event)>,
    /// Per rank: [status word, sink word].
    words: Vec<DevBuf>,
    latch: HostWord,
    epoch: u32,
}

impl ProbeBufs {
    /// Buffers for ranks on `rank_gpus` moving up to `bytes` per peer.
    pub fn new(gpus: &[Gpu], rank_gpus: &[usize], bytes: u64) -> Result<ProbeBufs, FabricError> {
        let n = rank_gpus.len() as u64;
        let mut p = ProbeBufs {
            bytes,
            src: Vec::new(),
            dst: Vec::new(),
            streams: Vec::new(),
            events: Vec::new(),
            words: Vec::new(),
            latch: dev(
                HostWord::new(&gpus[rank_gpus[0]].ctx),
                "allocating the probe latch",
            )?,
            epoch: 0,
        };
        for &g in rank_gpus {
            let ctx = &gpus[g].ctx;
            let src = dev(
                DevBuf::alloc(ctx, bytes as usize),
                "allocating probe buffers",
            )?;
            dev(src.fill(0x5a), "filling probe buffers")?;
            p.src.push(src);
            p.dst.push(dev(
                DevBuf::alloc(ctx, (bytes * (n - 1).max(1)) as usize),
                "allocating probe buffers",
            )?);
            p.streams.push(dev(Stream::new(ctx), "creating a stream")?);
            p.events.push((
                dev(Event::new(ctx), "creating an event")?,
                dev(Event::new(ctx), "creating an event")?,
            ));
            let w = dev(DevBuf::alloc(ctx, 16), "allocating probe status")?;
            dev(w.fill(0), "clearing probe status")?;
            p.words.push(w);
        }
        for &g in rank_gpus {
            sync_ctx(&gpus[g].ctx, "synchronizing the GPU")?;
        }
        Ok(p)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// One probe point; also returns the PCIe links read while it ran.
    pub fn run(
        &mut self,
        gpus: &[Gpu],
        rank_gpus: &[usize],
        loopback: bool,
        direction: Direction,
        peers: usize,
        bytes: u64,
    ) -> Result<(ProbeSample, Vec<LinkReading>), FabricError> {
        let n = rank_gpus.len();
        let bytes = (bytes / 16 * 16).clamp(16, self.bytes);
        self.epoch = self.epoch.wrapping_add(1);
        let go = self.epoch;
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
            args.src[r] = self.src[r].ptr;
            args.dst[r] = self.dst[r].ptr;
        }
        let ranks_on_gpu = if loopback { n as u32 } else { 1 };
        // Queue every rank behind the latch, then release them together.
        let queued = (|| -> Result<(), FabricError> {
            for (r, &g) in rank_gpus.iter().enumerate() {
                let k = gpus[g]
                    .kernels
                    .as_ref()
                    .map_err(|e| FabricError::Device(e.clone()))?;
                dev(gpus[g].ctx.bind_to_thread(), "binding the CUDA context")?;
                let s = &self.streams[r];
                let (mut latch_ptr, mut go_v, mut status) =
                    (self.latch.device_ptr, go, self.words[r].ptr);
                let mut params = [
                    &mut latch_ptr as *mut u64 as *mut c_void,
                    &mut go_v as *mut u32 as *mut c_void,
                    &mut status as *mut u64 as *mut c_void,
                ];
                dev(
                    k.latch_wait.launch_raw((1, 1), 32, s, &mut params),
                    "launching the probe latch",
                )?;
                dev(self.events[r].0.record(s), "recording an event")?;
                let f = match direction {
                    Direction::Read => k.probe_read,
                    Direction::Write => k.probe_write,
                };
                let blocks = kernels::block_cap(gpus[g].facts.sms, 1, ranks_on_gpu)
                    .min((bytes / 16).div_ceil(THREADS as u64).max(1) as u32);
                let mut a = args;
                a.rank = r as i32;
                a.sink = self.words[r].ptr + 4;
                dev(f.launch((blocks, 1), THREADS, s, &a), "launching the probe")?;
                dev(self.events[r].1.record(s), "recording an event")?;
            }
            Ok(())
        })();
        // Release even after a failed launch so queued latches finish.
        self.latch.set(go);
        queued?;
        let mut seen: Vec<usize> = rank_gpus.to_vec();
        seen.sort_unstable();
        seen.dedup();
        let facts: Vec<(usize, &super::driver::DeviceFacts)> =
            seen.iter().map(|&g| (g, &gpus[g].facts)).collect();
        let links = topo::read_links(&facts);
        let mut secs = Vec::with_capacity(n);
        for (r, &g) in rank_gpus.iter().enumerate() {
            dev(gpus[g].ctx.bind_to_thread(), "binding the CUDA context")?;
            // The latch kernel gives up by itself after 10 s; the watchdog waits beyond that.
            let limit = watchdog::Deadline::from_env().for_work(bytes * peers as u64, 1)
                + Duration::from_secs(10);
            wait_dev(self.streams[r].wait(limit), "a contention probe")?;
            let ms = dev(
                self.events[r].0.elapsed_ms(&self.events[r].1),
                "reading the timing events",
            )?;
            let mut w = [0u8; 4];
            dev(self.words[r].download(0, &mut w), "reading probe status")?;
            if u32::from_le_bytes(w) != 0 {
                return Err(FabricError::Device(
                    "a probe latch was never released (the host stalled for over 10 s); run again on a less loaded machine".into(),
                ));
            }
            secs.push((ms as f64 / 1000.0).max(1e-9));
        }
        let moved = (peers as u64 * bytes) as f64;
        let per_gpu = secs.iter().map(|t| moved / t / 1e9).sum::<f64>() / n as f64;
        let slowest = secs.iter().cloned().fold(0.0, f64::max);
        Ok((
            ProbeSample {
                peers,
                per_gpu_gbps: per_gpu,
                aggregate_gbps: moved * n as f64 / slowest / 1e9,
            },
            links,
        ))
    }
}
