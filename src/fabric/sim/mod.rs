//! Simulated fabric: a flow-level model of the machine, calibrated on published measurements of
//! real PCIe boxes (C1–C7, each cited with its source in tests/sim_calibration.rs), so the whole
//! tuner runs without GPUs.
//!
//! 1. [`net`] turns the topology into a link graph and routes GPU→GPU flows over it; [`flow`]
//!    shares capacity between concurrent flows by max-min fairness; [`kernel`] prices kernel
//!    loads and stores apart from copy-engine transfers.
//! 2. [`nccl`], [`custom`] and [`copy`] (copy-engine backends) schedule each backend step by
//!    step on that network; launch costs are added here per mode.
//! 3. [`noise`] turns the deterministic time into samples that look measured. Deterministic
//!    times are cached per (group, backend, bytes, mode), so a full tune costs little more than
//!    drawing random numbers.

pub mod band;
pub mod calibration;
pub mod copy;
pub mod custom;
pub mod faults;
pub mod flow;
pub mod kernel;
mod memo;
mod model;
pub mod nccl;
pub mod net;
pub mod noise;
mod probe;
mod waiver;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use self::band::Band;
pub use self::faults::Faults;
use self::model::{group_model, GroupModel, ModelKey};
use self::net::{Flow, Net, Route};
use self::noise::Noise;
use self::probe::probe_pattern;
use super::{
    memory, Backend, ChannelTime, DeviceError, Direction, Directions, Fabric, FabricError,
    FabricInfo, Group, Islands, MemoryCost, Mode, NcclAlgo, ProbeSample, Readiness, TimeBand,
    TimeModel, Verification,
};
use crate::allreduce::Executor;
use crate::topology::Topology;

/// CUDA-graph replay of one captured kernel (or NCCL's captured launch), µs.
const LAUNCH_GRAPH_US: f64 = 1.5;
/// Eager launch of one of our kernels from the host, µs.
const LAUNCH_EAGER_CUSTOM_US: f64 = 5.0;
/// How long a hung backend is waited for before it is reported, seconds: the CUDA fabric's
/// deadline for one GPU operation. Virtual time: the simulator reports it without waiting.
const HANG_DEADLINE_S: f64 = 10.0;

/// Why the simulator cannot model `t`, if it cannot: a switch of a make it has no calibration
/// data for (one sentence, for the CLI's exit 2).
pub fn check_topology(t: &Topology) -> Result<(), String> {
    for s in &t.switches {
        if kernel::NodeKind::of_switch(s.vendor.as_deref()).is_none() {
            return Err(format!(
                "switch `{}` states vendor `{}`, a make the simulator has no calibration data for; state \"Microchip\" or \"Broadcom\" if it is one, or drop `vendor` to simulate it as an unstated make (widest error band)",
                s.id,
                s.vendor.as_deref().unwrap_or("").escape_debug()
            ));
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
struct Prepared {
    group: Group,
    readiness: Vec<Readiness>,
    /// How the hierarchical backends move data, once oriented.
    directions: Option<Directions>,
    /// Where the group's model is in `SimFabric::models`.
    model: usize,
}

/// A simulated machine. See the module docs.
#[derive(Debug, Clone)]
pub struct SimFabric {
    topo: Topology,
    net: Net,
    /// What NCCL knows of the host: CPU vendor and the P2P level in force.
    host: nccl::Host,
    /// The measurement seed. Each group's noise, and each mode's within it, is drawn from it
    /// and the group's GPUs and mode alone, so a group times the same whichever groups and
    /// modes were measured before it.
    seed: u64,
    /// The prepared group's seed, and the mode its noise was last drawn for.
    group_seed: u64,
    noise_mode: Option<Mode>,
    noise: Noise,
    faults: Faults,
    /// Draws which samples an injected `spikes` fault slows, apart from the noise so the
    /// noise stays the same with and without faults.
    spike_rng: ChaCha8Rng,
    /// Where an injected `drift` stands.
    drift: faults::Drift,
    /// Fabric calls so far, for an injected lost GPU.
    calls: u64,
    models: Vec<(ModelKey, GroupModel)>,
    prepared: Option<Prepared>,
}

fn bad(msg: impl Into<String>) -> FabricError {
    FabricError::BadRequest(msg.into())
}

impl SimFabric {
    /// A simulated machine wired like `topology`; `seed` drives the measurement noise.
    pub fn new(mut topology: Topology, seed: u64) -> SimFabric {
        if topology.pairs.is_empty() {
            // A model built by hand rather than loaded: derive its pairs. A broken one keeps
            // no pairs and routes over PCIe only.
            let _ = topology.normalize();
        }
        let net = Net::build(&topology);
        let host = nccl::Host::new(&topology, nccl::Host::env_level());
        SimFabric {
            topo: topology,
            net,
            host,
            seed,
            group_seed: seed,
            noise_mode: None,
            noise: Noise::new(seed),
            faults: Faults::default(),
            spike_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5bd1_e995_0f1a_57ed),
            drift: faults::Drift::new(seed),
            calls: 0,
            models: Vec::new(),
            prepared: None,
        }
    }

    /// The same machine with NCCL's P2P level set as `NCCL_P2P_LEVEL` would (None: NCCL's
    /// default for the host), whatever the environment says.
    pub fn with_nccl_p2p_level(mut self, level: Option<nccl::Level>) -> SimFabric {
        self.host = nccl::Host::new(&self.topo, level);
        self.models.clear();
        self
    }

    /// The same machine modelled with `cal`'s fitted constants (a fit leaving a calibration
    /// source out, for docs/MODEL-ERROR.md's leave-one-source-out table).
    pub fn with_calibration(mut self, cal: &calibration::Calibration) -> SimFabric {
        self.net = Net::build_with(&self.topo, cal);
        self.models.clear();
        self
    }

    /// The same machine with `faults` injected.
    pub fn with_faults(mut self, faults: Faults) -> SimFabric {
        self.faults = faults;
        self
    }

    /// Noise for the prepared group from here on: its probes (`mode` None), then each mode.
    fn reseed(&mut self, mode: Option<Mode>) {
        let seed = self.group_seed ^ mode.map_or(0, |m| m as u64 + 1).wrapping_mul(0x9e37_79b9);
        self.noise = Noise::new(seed);
        self.spike_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5bd1_e995_0f1a_57ed);
        self.noise_mode = mode;
    }

    /// NCCL's channel count on `group` as its ring search would find it (NCCL's buffers grow
    /// with it); it runs twice as many (`nccl_runtime_channels`), the count profiles record.
    pub fn nccl_search_channels(&self, group: &Group) -> u32 {
        self.nccl_ring(group).map_or(1, |ring| {
            nccl::Model::new(&self.topo, &self.net, &self.host, &ring).channels
        })
    }

    /// The ring NCCL's search would order `group`'s GPUs of this machine in; none below two.
    fn nccl_ring(&self, group: &Group) -> Option<Vec<usize>> {
        let mut gpus: Vec<usize> = group
            .gpus
            .iter()
            .copied()
            .filter(|&g| g < self.topo.gpu_count())
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        (gpus.len() >= 2).then(|| nccl::ring_order(&self.topo, &gpus))
    }

    /// Rates (GB/s) of arbitrary transfers running together, e.g. one GPU pulling from all
    /// its peers: each (src, dst) moves bytes src → dst, driven as `direction` says.
    pub fn transfer_gbps(
        &self,
        direction: Direction,
        pairs: &[(usize, usize)],
    ) -> Result<Vec<f64>, FabricError> {
        let n = self.topo.gpu_count();
        if let Some(&(a, b)) = pairs.iter().find(|&&(a, b)| a >= n || b >= n || a == b) {
            return Err(bad(format!(
                "transfer {a}→{b} needs two different GPUs below {n}; this machine has GPUs 0..{}",
                n.saturating_sub(1)
            )));
        }
        let flows: Vec<Flow> = pairs
            .iter()
            .map(|&(src, dst)| Flow::copy(src, dst, direction))
            .collect();
        let routes: Vec<Route> = pairs.iter().map(|&(a, b)| self.net.route(a, b)).collect();
        let refs: Vec<&Route> = routes.iter().collect();
        Ok(self.net.rates(&flows, &refs))
    }

    /// The same as [`SimFabric::transfer_gbps`] for kernel loads (`Read`) or stores
    /// (`Write`) through peer mappings instead of copy engines (calibration C5).
    pub fn kernel_transfer_gbps(
        &self,
        direction: Direction,
        pairs: &[(usize, usize)],
    ) -> Result<Vec<f64>, FabricError> {
        self.transfer_gbps(direction, pairs)?;
        let flows: Vec<Flow> = pairs
            .iter()
            .map(|&(src, dst)| Flow::kernel(src, dst, direction))
            .collect();
        let routes: Vec<Route> = pairs.iter().map(|&(a, b)| self.net.route(a, b)).collect();
        let refs: Vec<&Route> = routes.iter().collect();
        Ok(self.net.rates(&flows, &refs))
    }

    /// The model of `gpus`: the prepared group's (in its islands) without a search.
    fn model(&mut self, gpus: &[usize]) -> &mut GroupModel {
        let i = match &self.prepared {
            Some(p) if p.group.gpus == gpus => p.model,
            _ => group_model(
                &mut self.models,
                &self.topo,
                &self.net,
                &self.host,
                gpus,
                None,
            ),
        };
        &mut self.models[i].1
    }

    /// What the model assumed because the topology did not state it, one sentence each.
    pub fn assumed(&self) -> Vec<String> {
        let mut out = self.net.assumed().to_vec();
        out.extend(self.unknown_p2p());
        if self.host.cpu == nccl::Cpu::Unknown {
            out.push(
                "CPU vendor not stated (sockets[].contention.cpu_vendor): NCCL's model takes no inter-socket bandwidth constant and P2P up to PXB".into(),
            );
        }
        out
    }

    /// How wrong the model's time of `backend` for `bytes` on the prepared group can be
    /// ([`band`]); None where no group is prepared.
    pub fn band(&mut self, backend: Backend, bytes: u64) -> Option<Band> {
        let (fixed, data) = self.model_split(backend, bytes)?;
        let gpus = self.prepared.as_ref()?.group.gpus.clone();
        let parts = &self.model(&gpus).parts;
        Some(match backend.executor() {
            Executor::Nccl => parts.nccl(fixed, data),
            Executor::SmKernel => parts.custom_of(backend.is_hierarchical(), fixed, data),
            Executor::CopyEngine(_) => copy::band(parts, fixed, data),
        })
    }

    /// The model's device time of `backend` for `bytes` on the prepared group in two parts,
    /// µs: what it costs with no bytes (launch excluded; a custom kernel in the form it runs at
    /// `bytes`) and what the bytes add.
    pub fn model_split(&mut self, backend: Backend, bytes: u64) -> Option<(f64, f64)> {
        let p = self.prepared.as_ref()?;
        let m = &mut self.models[p.model].1;
        if let Some(split) = m.splits.get(backend, bytes) {
            return Some(split);
        }
        // What the bytes add to the time the tune already priced (launch excluded).
        let (algo, proto) = backend.nccl_pin().unwrap_or_else(|| m.nccl.choose(bytes));
        let (fixed, total) = match backend.executor() {
            Executor::SmKernel => {
                let directions = p.directions.as_ref();
                (
                    m.custom.fixed(backend, bytes, directions),
                    m.custom.time(backend, bytes, directions),
                )
            }
            Executor::CopyEngine(_) => (m.copy.fixed(backend), m.copy.time(backend, bytes)),
            Executor::Nccl => {
                let fixed = *m
                    .fixed
                    .entry((algo, proto))
                    .or_insert_with(|| m.schedule.time(algo, proto, 0));
                (fixed, m.schedule.time(algo, proto, bytes))
            }
        };
        let split = (fixed, (total - fixed).max(0.0));
        m.splits.insert(backend, bytes, split);
        Some(split)
    }

    /// The prepared group, after checking `backend` is ready on it and `bytes` fits.
    fn ready(&self, backend: Backend, bytes: u64) -> Result<&Group, FabricError> {
        let p = self.prepared.as_ref().ok_or_else(|| {
            bad("no group is prepared; call prepare before verify, time or probe")
        })?;
        match p.readiness.iter().find(|r| r.backend() == backend) {
            None => {
                return Err(bad(format!(
                    "{backend} was not prepared for this group; pass it to prepare first"
                )))
            }
            Some(Readiness::Waived { reason, .. }) => {
                return Err(bad(format!("{backend} is waived on this group: {reason}")))
            }
            Some(Readiness::Ready { .. }) => {}
        }
        let size = p.group.dtype.size();
        if bytes == 0 || !bytes.is_multiple_of(size) {
            return Err(bad(format!(
                "{bytes} bytes is not a whole number of {} elements; use a positive multiple of {size}",
                p.group.dtype.id()
            )));
        }
        if backend.is_custom() && bytes > p.group.max_bytes {
            return Err(bad(format!(
                "{bytes} bytes is more than the {} bytes {backend}'s buffers were prepared for; prepare with a larger max_bytes",
                p.group.max_bytes
            )));
        }
        Ok(&p.group)
    }

    /// Noiseless per-call time (µs) of `backend` on the prepared group, cached.
    fn base_time(&mut self, backend: Backend, bytes: u64, mode: Mode) -> f64 {
        let Some(p) = &self.prepared else {
            return f64::NAN;
        };
        let m = &mut self.models[p.model].1;
        if let Some(t) = m.cache.get((backend, mode), bytes) {
            return t;
        }
        let (device, launch) = match backend.executor() {
            Executor::SmKernel => (
                m.custom.time(backend, bytes, p.directions.as_ref()),
                match mode {
                    Mode::Graph => LAUNCH_GRAPH_US,
                    Mode::Eager => LAUNCH_EAGER_CUSTOM_US,
                },
            ),
            Executor::CopyEngine(_) => (
                m.copy.time(backend, bytes),
                m.copy.launch(backend, mode, LAUNCH_GRAPH_US),
            ),
            Executor::Nccl => {
                let (algo, proto) = backend.nccl_pin().unwrap_or_else(|| m.nccl.choose(bytes));
                let device = m.schedule.time(algo, proto, bytes);
                let call = nccl::call::per_call_us(device, mode, LAUNCH_GRAPH_US);
                (device, call - device)
            }
        };
        m.cache.insert((backend, mode), bytes, device + launch);
        device + launch
    }

    /// NCCL's own pick on the prepared group for `bytes` (what `Backend::Nccl` runs).
    pub fn nccl_choice(&mut self, bytes: u64) -> Option<(NcclAlgo, crate::fabric::NcclProto)> {
        let gpus = self.prepared.as_ref()?.group.gpus.clone();
        Some(self.model(&gpus).nccl.choose(bytes))
    }

    fn hang(&self, backend: Backend, bytes: u64) -> Result<(), FabricError> {
        if self.faults.hang.contains(&backend) {
            return Err(FabricError::Timeout {
                backend,
                what: format!("allreduce of {bytes} bytes, simulated hang"),
                seconds: HANG_DEADLINE_S,
            });
        }
        Ok(())
    }

    /// Counts a fabric call; once an injected lost GPU is gone, every call fails as a device
    /// error, as the driver fails calls after a GPU falls off the bus.
    fn tick(&mut self) -> Result<(), FabricError> {
        self.calls += 1;
        if self.faults.panic_at_call == Some(self.calls) {
            panic!(
                "simulated bug: injected panic at fabric call {}",
                self.calls
            );
        }
        match self.faults.lost_gpu {
            Some(l) if self.calls > l.after_calls => Err(FabricError::Device(DeviceError::Lost {
                gpu: l.gpu,
                after_calls: l.after_calls,
            })),
            _ => Ok(()),
        }
    }
}

impl Fabric for SimFabric {
    fn info(&self) -> FabricInfo {
        let name = self
            .topo
            .name
            .clone()
            .or_else(|| self.topo.origin.name.clone())
            .unwrap_or_else(|| "topology".into());
        FabricInfo {
            simulated: true,
            description: if self.faults.is_empty() {
                format!("simulated {name}")
            } else {
                format!("simulated {name} with injected faults ({})", self.faults)
            },
            driver: None,
            cuda: None,
            nccl: None,
        }
    }

    fn topology(&self) -> &Topology {
        &self.topo
    }

    fn prepare(
        &mut self,
        group: &Group,
        backends: &[Backend],
    ) -> Result<Vec<Readiness>, FabricError> {
        self.prepared = None;
        self.drift.interrupt();
        self.tick()?;
        group.check(self.topo.gpu_count())?;
        let index = group_model(
            &mut self.models,
            &self.topo,
            &self.net,
            &self.host,
            &group.gpus,
            group.islands.as_ref().ok(),
        );
        self.prepared = Some(Prepared {
            group: group.clone(),
            readiness: Vec::new(),
            directions: None,
            model: index,
        });
        self.group_seed = group.gpus.iter().fold(self.seed, |h, &g| {
            (h ^ g as u64).wrapping_mul(0x0100_0000_01b3)
        });
        self.reseed(None);
        let model = self.model(&group.gpus).nccl.clone();
        let no_p2p = crate::topology::p2p::P2pGaps::of(&self.topo, &group.gpus);
        let readiness: Vec<Readiness> = backends
            .iter()
            .map(
                |&backend| match SimFabric::waiver(backend, group, &model, &no_p2p) {
                    Some(reason) => Readiness::Waived { backend, reason },
                    None => {
                        let bytes = memory::modelled(
                            backend,
                            group.ranks(),
                            group.max_bytes,
                            model.channels,
                        );
                        Readiness::Ready {
                            backend,
                            memory: MemoryCost {
                                bytes_per_gpu: bytes,
                                measured: false,
                                modelled_bytes_per_gpu: bytes,
                            },
                        }
                    }
                },
            )
            .collect();
        self.prepared = Some(Prepared {
            group: group.clone(),
            readiness: readiness.clone(),
            directions: None,
            model: index,
        });
        Ok(readiness)
    }

    /// The simulator moves no data: a backend is correct unless a fault says otherwise.
    fn verify(
        &mut self,
        backend: Backend,
        bytes: u64,
        _seed: u64,
    ) -> Result<Verification, FabricError> {
        self.drift.interrupt();
        self.tick()?;
        self.ready(backend, bytes)?;
        self.hang(backend, bytes)?;
        if self.faults.wrong.contains(&backend) {
            return Ok(Verification::Wrong {
                reason: format!(
                    "element 0 of {bytes} bytes differs from the expected sum (simulated fault)"
                ),
            });
        }
        Ok(Verification::Correct)
    }

    fn time(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        self.tick()?;
        self.ready(backend, bytes)?;
        if batch == 0 {
            return Err(bad("batch must be at least 1 call"));
        }
        self.hang(backend, bytes)?;
        if !self.faults.delay.is_zero() {
            std::thread::sleep(self.faults.delay);
        }
        let slow = self
            .faults
            .slow
            .iter()
            .filter(|(b, _)| *b == backend)
            .map(|(_, f)| *f)
            .product::<f64>();
        let drift = self.drift.factor(&self.faults.drift, backend, bytes, mode);
        let phase = self
            .faults
            .phases
            .iter()
            .filter(|(b, _, n)| *b == backend && (self.calls / n) % 2 == 1)
            .map(|(_, f, _)| *f)
            .product::<f64>();
        let base = self.base_time(backend, bytes, mode) * slow * drift * phase;
        if self.noise_mode != Some(mode) {
            self.reseed(Some(mode));
        }
        let spikes = self.faults.spikes;
        Ok((0..samples)
            .map(|_| {
                let t = self.noise.sample(base, batch);
                match spikes {
                    Some(s) if self.spike_rng.random_bool(s.fraction) => t * s.factor,
                    _ => t,
                }
            })
            .collect())
    }

    fn probe(
        &mut self,
        direction: Direction,
        peers: usize,
        bytes: u64,
    ) -> Result<ProbeSample, FabricError> {
        self.drift.interrupt();
        self.tick()?;
        let gpus = self
            .prepared
            .as_ref()
            .ok_or_else(|| bad("no group is prepared; call prepare before probe"))?
            .group
            .gpus
            .clone();
        let n = gpus.len();
        if peers == 0 || peers >= n {
            return Err(bad(format!(
                "a probe on {n} GPUs takes 1 to {} peers, not {peers}",
                n.saturating_sub(1)
            )));
        }
        if bytes == 0 {
            return Err(bad("a probe must move at least 1 byte"));
        }
        let i = self.prepared.as_ref().map_or(0, |p| p.model);
        let net = &self.net;
        let m = &mut self.models[i].1;
        let pattern = m
            .probes
            .entry((direction, peers))
            .or_insert_with(|| probe_pattern(net, &gpus, direction, peers));
        // Reads see their first bytes after a round trip, writes after one way.
        let trips = if direction == Direction::Read {
            2.0
        } else {
            1.0
        };
        let per_gpu_us: Vec<f64> = pattern
            .iter()
            .map(|flows| {
                flows
                    .iter()
                    .map(|&(us_per_byte, lat)| us_per_byte * bytes as f64 + trips * lat)
                    .fold(0.0, f64::max)
            })
            .collect();
        // Many transfers averaged: jitter, no outliers, never past the model (the links' rates).
        // Drawn for this probe alone: it reads the same whichever peer counts came before.
        let which = (direction as u64 + 1) << 32 | peers as u64;
        let seed = self.group_seed ^ which.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let factor = 1.0 + (Noise::new(seed).jitter(10) - 1.0).abs();
        let moved = (peers as u64 * bytes) as f64;
        let per_gpu = per_gpu_us
            .iter()
            .map(|t| moved / (t * factor) / 1e3)
            .sum::<f64>()
            / n as f64;
        let slowest = per_gpu_us.iter().copied().fold(0.0, f64::max) * factor;
        Ok(ProbeSample {
            peers,
            per_gpu_gbps: per_gpu,
            aggregate_gbps: n as f64 * moved / slowest / 1e3,
        })
    }

    fn assumed(&self) -> Vec<String> {
        SimFabric::assumed(self)
    }

    fn model_band(&mut self, backend: Backend, bytes: u64) -> Option<TimeBand> {
        let (fixed, data) = self.model_split(backend, bytes)?;
        let m = &self.models[self.prepared.as_ref()?.model].1;
        let (halves, family) = match backend.executor() {
            Executor::Nccl => (m.nccl_halves, TimeModel::Nccl),
            Executor::SmKernel => {
                let own = m.island_halves.filter(|_| backend.is_hierarchical());
                (own.unwrap_or(m.custom_halves), TimeModel::Custom)
            }
            Executor::CopyEngine(_) => (m.copy_halves, TimeModel::CopyEngine),
        };
        let (low, high) = halves.ends(fixed, data);
        Some(TimeBand {
            low,
            high,
            assumed: halves.assumed,
            model: family,
        })
    }

    /// The run-time channel count the simulated NCCL runs the prepared group with.
    fn nccl_channels(&self) -> Option<u32> {
        let p = self.prepared.as_ref()?;
        Some(self.nccl_runtime_channels(&p.group))
    }

    fn nccl_times_at_channels(
        &mut self,
        backend: Backend,
        sizes: &[u64],
        channels: &[u32],
        _mode: Mode,
    ) -> Result<Vec<(u32, Vec<ChannelTime>)>, FabricError> {
        let bad = |what: &str| FabricError::BadRequest(format!("{backend}: {what}"));
        let (algo, proto) = backend.nccl_pin().ok_or_else(|| bad("not an NCCL pin"))?;
        let p = self.prepared.as_ref().ok_or_else(|| bad("no group"))?;
        let i = p.model;
        // One schedule per count and group: a tune sweeps every pin at every count.
        for &c in channels {
            if !self.models[i].1.at_channels.contains_key(&c) {
                let s = self.nccl_schedule_at(&p.group, c);
                let s = s.ok_or_else(|| bad("a group of one GPU"))?;
                self.models[i].1.at_channels.insert(c, s);
            }
        }
        let at = &self.models[i].1.at_channels;
        let us = |c: &u32, b: u64| ChannelTime::asked(at[c].time(algo, proto, b));
        let row = |c: &u32| (*c, sizes.iter().map(|&b| us(c, b)).collect());
        Ok(channels.iter().map(row).collect())
    }

    fn orient(&mut self, directions: &Directions) -> Result<(), FabricError> {
        let p = self
            .prepared
            .as_mut()
            .ok_or_else(|| bad("no group is prepared; call prepare before orient"))?;
        p.directions = Some(directions.clone());
        let gpus = p.group.gpus.clone();
        let m = self.model(&gpus);
        m.forget(Backend::is_hierarchical);
        Ok(())
    }

    fn release(&mut self) -> Result<(), FabricError> {
        self.drift.interrupt();
        self.prepared = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
