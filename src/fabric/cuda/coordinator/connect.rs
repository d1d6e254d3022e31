//! Coordinator side of connecting a worker set: each owner's buffers set up and their IPC
//! handles handed to every launcher (whose real transfer checks P2P), and NCCL ranks created.

use std::collections::BTreeMap;

use super::processes::{unexpected, Trouble};
use super::CudaFabric;
use super::PreparedGroup;
use crate::fabric::cuda::protocol::{Launch, Req, Resp, Shape};
use crate::fabric::cuda::watchdog;
use crate::fabric::Backend;
use crate::topology::Topology;

impl CudaFabric {
    /// Setup on every owner, side by side where each measures only its own memory
    /// ([`setup_batches`]), then Connect on every launcher; waives what failed.
    pub(super) fn connect_set(
        &mut self,
        set: usize,
        plan: &mut PreparedGroup,
        shape: Shape,
        custom: &[Backend],
        waived: &mut BTreeMap<Backend, String>,
        memory: &mut BTreeMap<Backend, u64>,
    ) -> Result<(), Trouble> {
        let mut owners: Vec<usize> = plan.owners.clone();
        owners.sort_unstable();
        owners.dedup();
        let mut handles = Vec::new();
        let limit = self.limit(shape.max_bytes, 64);
        let reqs: Vec<(usize, Req)> = (owners.iter())
            .map(|&w| {
                let owned: Vec<usize> = (0..shape.n).filter(|&r| plan.owners[r] == w).collect();
                let custom = custom.to_vec();
                (
                    w,
                    Req::Setup {
                        shape,
                        owned,
                        custom,
                    },
                )
            })
            .collect();
        for (batch, measured) in setup_batches(reqs, self.loopback.is_some()) {
            for r in self.exchange(set, batch, limit)? {
                let Resp::Setup { ranks, memory: m } = r else {
                    return Err(unexpected(r));
                };
                handles.extend(ranks);
                for (b, r) in m {
                    match r {
                        Ok(bytes) if measured => {
                            let e = memory.entry(b).or_insert(0);
                            *e = (*e).max(bytes);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            waived.entry(b).or_insert(e);
                        }
                    }
                }
            }
        }
        handles.sort_by_key(|h| h.rank);
        // A backend waived on one owner is dropped from every rank's handles.
        for h in &mut handles {
            h.custom.retain(|(b, _)| !waived.contains_key(b));
        }
        let mut launchers: Vec<(usize, Launch)> = plan.launchers.clone();
        for &(_, r) in &plan.nccl {
            let w = plan.owners[r];
            if !launchers.iter().any(|(x, _)| *x == w) {
                launchers.push((w, Launch { base: r, count: 1 }));
            }
        }
        // Each launcher opens its peers' buffers on its own: all are asked at once.
        let reqs: Vec<(usize, Req)> = (launchers.iter())
            .map(|&(w, launch)| {
                let ranks = handles.clone();
                (
                    w,
                    Req::Connect {
                        shape,
                        launch,
                        ranks,
                    },
                )
            })
            .collect();
        let answers = self.exchange(set, reqs, limit)?;
        for ((w, launch), answer) in launchers.into_iter().zip(answers) {
            match answer {
                // A broken rank outside the group is no answer to this request: out of turn.
                Resp::Connected {
                    kernels,
                    broken,
                    unready,
                } if broken.iter().all(|(r, _)| *r < shape.n) => {
                    if let Err(e) = &kernels {
                        for &b in custom {
                            waived.entry(b).or_insert_with(|| e.clone());
                        }
                    }
                    for (b, why) in unready {
                        waived.entry(b).or_insert(why);
                    }
                    if let Ok(k) = &kernels {
                        if !self.images.contains(k) {
                            self.images.push(k.clone());
                        }
                    }
                    self.kernels =
                        Some(kernels.map(|k| format!("--gpu-architecture={}", k.target)));
                    let opened: Vec<usize> =
                        (0..shape.n).filter(|&r| plan.owners[r] != w).collect();
                    record_p2p(
                        &mut self.topo,
                        &plan.group.gpus,
                        launch.base,
                        &opened,
                        &broken,
                    );
                    if let Some((r, why)) = broken.first() {
                        let (a, b) = (plan.group.gpus[launch.base], plan.group.gpus[*r]);
                        let reason = format!(
                            "P2P between GPU {a} and GPU {b} does not work ({why}); custom kernels and contention probes need it, NCCL is still measured"
                        );
                        for &c in custom {
                            waived.entry(c).or_insert_with(|| reason.clone());
                        }
                        plan.no_p2p.get_or_insert(reason);
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(())
    }

    /// Creates `b`'s NCCL ranks (one group of init calls across the workers) and warms them.
    pub(super) fn nccl_init(
        &mut self,
        set: usize,
        plan: &PreparedGroup,
        b: Backend,
    ) -> Result<Result<u64, String>, Trouble> {
        let limit = watchdog::INIT_DEADLINE + self.limit(plan.group.max_bytes, 16);
        let (w0, _) = plan.nccl[0];
        let id = match self.one(set, w0, Req::NcclId, limit)? {
            Resp::NcclId(id) => id,
            other => return Err(unexpected(other)),
        };
        let nranks = plan.nccl.len();
        let reqs = plan
            .nccl
            .iter()
            .map(|&(w, rank)| {
                (
                    w,
                    Req::NcclInit {
                        backend: b,
                        id: id.clone(),
                        rank,
                        nranks,
                    },
                )
            })
            .collect();
        let mut most = 0;
        for r in self.exchange(set, reqs, limit)? {
            match r {
                Resp::Memory(Ok(bytes)) => most = most.max(bytes),
                Resp::Memory(Err(e)) => return Ok(Err(e)),
                other => return Err(unexpected(other)),
            }
        }
        Ok(Ok(most))
    }
}

/// Keeps the real-transfer P2P check of the launcher of `rank` in the topology (and so the
/// profile): it opened the buffers of `opened` ranks; a pair that failed is marked without
/// P2P, and one note per launcher and group says what was checked and what failed.
fn record_p2p(
    t: &mut Topology,
    gpus: &[usize],
    rank: usize,
    opened: &[usize],
    broken: &[(usize, String)],
) {
    let from = gpus[rank];
    let checked: Vec<usize> = opened.iter().map(|&r| gpus[r]).collect();
    if checked.is_empty() {
        return;
    }
    for (r, _) in broken {
        let to = gpus[*r];
        for p in t.pairs.iter_mut() {
            if (p.from, p.to) == (from, to) || (p.from, p.to) == (to, from) {
                p.p2p.read = crate::topology::Status::No;
                p.p2p.write = crate::topology::Status::No;
            }
        }
    }
    let outcome = match broken {
        [] => "every one matched".to_string(),
        _ => broken
            .iter()
            .map(|(r, why)| format!("GPU {}: {why}", gpus[*r]))
            .collect::<Vec<_>>()
            .join("; "),
    };
    let note = format!(
            "P2P checked by a real transfer: the worker of GPU {from} read GPUs {checked:?} through their IPC handles and compared with what their owners wrote: {outcome}"
        );
    if !t.notes.contains(&note) {
        t.notes.push(note);
    }
}

/// The owners' `Setup` requests in batches, each sent at once (the buffers of a TP8 group
/// took 0.94 s on the H200, one owner after another), and whether the memory each answer
/// measured counts. Each owner measures its buffers as the change in its GPU's free memory:
/// on GPUs of their own, side by side, every figure counts. In loopback the owners share one
/// GPU, so the first sets up alone and its figure stands for every rank (a rank's buffers
/// do not depend on which rank it is); the rest, measured beside each other, are dropped.
pub(super) fn setup_batches(
    mut reqs: Vec<(usize, Req)>,
    loopback: bool,
) -> Vec<(Vec<(usize, Req)>, bool)> {
    if !loopback || reqs.len() < 2 {
        return vec![(reqs, true)];
    }
    let rest = reqs.split_off(1);
    vec![(reqs, true), (rest, false)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p2p_check_is_kept_in_the_topology() {
        use crate::topology::Status;
        let mut t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        record_p2p(&mut t, &[2, 5, 6], 0, &[1, 2], &[(1, "differs".into())]);
        assert_eq!(t.pair(2, 5).unwrap().p2p.read, Status::No);
        assert_eq!(t.pair(5, 2).unwrap().p2p.write, Status::No);
        assert_ne!(t.pair(2, 6).unwrap().p2p.read, Status::No);
        let n = t.notes.last().unwrap().clone();
        assert!(
            n.contains("the worker of GPU 2 read GPUs [5, 6]") && n.ends_with("GPU 5: differs"),
            "{n}"
        );
        // The same check again (a restart) adds no second note; one that opened nothing, none.
        let count = t.notes.len();
        record_p2p(&mut t, &[2, 5, 6], 0, &[1, 2], &[(1, "differs".into())]);
        record_p2p(&mut t, &[2, 5, 6], 0, &[], &[]);
        assert_eq!(t.notes.len(), count);
        record_p2p(&mut t, &[0, 1], 0, &[1], &[]);
        assert!(t.notes.last().unwrap().ends_with("every one matched"));
    }
}
