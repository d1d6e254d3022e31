//! Coordinator side of contention probes and of PCIe link readings under load: every launcher
//! queues its probe, rank 0's owner releases them at once, and the links read meanwhile are kept.

use std::time::Duration;

use super::not_prepared;
use super::processes::{unexpected, Trouble};
use super::CudaFabric;
use crate::fabric::cuda::protocol::{ProbeHandles, Req, Resp};
use crate::fabric::cuda::topo;
use crate::fabric::{Direction, FabricError, ProbeSample};
use crate::topology::reading::LinkReading;

impl CudaFabric {
    pub(super) fn probe_inner(
        &mut self,
        direction: Direction,
        peers: usize,
        want: u64,
    ) -> Result<ProbeSample, Trouble> {
        let p = self.prepared.clone().ok_or_else(not_prepared)?;
        let n = p.owners.len();
        let limit = self.limit(want * peers as u64, 1) + Duration::from_secs(10);
        if self.probe_bytes < want {
            if self.probe_mapped {
                // Growing frees the old probe buffers, which launchers may map (all, or those
                // whose ProbeConnect went through before another's failed): all close them
                // and say so before any owner frees.
                let reqs = p
                    .launchers
                    .iter()
                    .map(|&(w, _)| (w, Req::ProbeDisconnect))
                    .collect();
                for r in self.exchange(0, reqs, limit)? {
                    if r != Resp::Done {
                        return Err(unexpected(r));
                    }
                }
                self.probe_mapped = false;
            }
            self.probe_bytes = 0;
            let mut owners = p.owners.clone();
            owners.sort_unstable();
            owners.dedup();
            let mut handles: Vec<ProbeHandles> = Vec::new();
            for w in owners {
                let owned = (0..n).filter(|&r| p.owners[r] == w).collect();
                match self.one(
                    0,
                    w,
                    Req::ProbeSetup {
                        bytes: want,
                        owned,
                        n,
                    },
                    limit,
                )? {
                    Resp::Probe(h) => handles.extend(h),
                    other => return Err(unexpected(other)),
                }
            }
            handles.sort_by_key(|h| h.rank);
            let reqs = p
                .launchers
                .iter()
                .map(|&(w, launch)| {
                    (
                        w,
                        Req::ProbeConnect {
                            launch,
                            n,
                            ranks: handles.clone(),
                        },
                    )
                })
                .collect();
            // Set before asking: a launcher may map them even if another fails to.
            self.probe_mapped = true;
            self.exchange(0, reqs, limit)?;
            self.probe_bytes = want;
        }
        self.epoch = self.epoch.wrapping_add(1).max(1);
        let epoch = self.epoch;
        let each = |req: &Req| p.launchers.iter().map(|&(w, _)| (w, req.clone())).collect();
        let queue = Req::ProbeQueue {
            direction,
            peers,
            bytes: want,
            epoch,
        };
        self.exchange(0, each(&queue), limit)?;
        self.one(0, p.owners[0], Req::ProbeRelease { epoch }, limit)?;
        let finish = Req::ProbeFinish { bytes: want, peers };
        let mut secs = Vec::new();
        let mut links = Vec::new();
        for r in self.exchange(0, each(&finish), limit)? {
            match r {
                Resp::Probed { secs: s, links: l } => {
                    secs.extend(s);
                    links.extend(l);
                }
                other => return Err(unexpected(other)),
            }
        }
        if self.loopback.is_some() {
            links.truncate(1);
            for l in &mut links {
                l.gpu = 0;
            }
        }
        self.links = links;
        let moved = (peers as u64 * want) as f64;
        let per_gpu = secs.iter().map(|t| moved / t / 1e9).sum::<f64>() / n as f64;
        let slowest = secs.iter().cloned().fold(0.0, f64::max);
        Ok(ProbeSample {
            peers,
            per_gpu_gbps: per_gpu,
            aggregate_gbps: moved * n as f64 / slowest / 1e9,
        })
    }

    /// PCIe generation and width of each GPU read while traffic runs: from the last probe if
    /// one ran, else under a host-to-device copy load made for the purpose.
    pub fn link_under_load(&mut self) -> Result<Vec<LinkReading>, FabricError> {
        if !self.links.is_empty() {
            return Ok(self.links.clone());
        }
        let ws: Vec<usize> = match self.loopback {
            Some(_) => vec![0],
            None => (0..self.sets.first().map_or(0, |s| s.workers.len())).collect(),
        };
        let limit = self.limit(2 << 30, 1);
        let mut out = Vec::new();
        for w in ws {
            match self
                .one(0, w, Req::LinksUnderLoad, limit)
                .map_err(|t| self.settle(t))?
            {
                Resp::Links(mut l) => {
                    for r in &mut l {
                        r.gpu = self.map.iter().position(|m| *m == Some(w)).unwrap_or(w);
                    }
                    out.extend(l)
                }
                other => return Err(self.settle(unexpected(other))),
            }
        }
        if self.loopback.is_some() {
            for r in &mut out {
                r.gpu = 0;
            }
        }
        self.links = out.clone();
        Ok(out)
    }

    /// Replaces the idle PCIe reading in the topology by one taken under load, once per run.
    /// A failed reading becomes a note, never an error: the tune does not depend on it.
    pub(super) fn record_links_under_load(&mut self) {
        if self.topo.origin.link_reading == "load" {
            return;
        }
        match self.link_under_load() {
            Ok(readings) => {
                for r in &readings {
                    for g in self.topo.gpus.iter_mut() {
                        if g.bus_id
                            .as_deref()
                            .is_some_and(|b| topo::same_bus(b, &r.bus_id))
                        {
                            let small = |v: Option<u32>| v.and_then(|x| u8::try_from(x).ok());
                            g.pcie.gen = small(r.gen).or(g.pcie.gen);
                            g.pcie.width = small(r.width).or(g.pcie.width);
                            g.pcie.max_gen = small(r.max_gen).or(g.pcie.max_gen);
                            g.pcie.max_width = small(r.max_width).or(g.pcie.max_width);
                        }
                    }
                }
                self.topo.origin.link_reading = "load".into();
            }
            Err(e) => self
                .topo
                .notes
                .push(format!("PCIe link could not be re-read under load: {e}")),
        }
    }
}
