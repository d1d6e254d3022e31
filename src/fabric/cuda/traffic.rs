//! How many bytes a kernel moves in one call: what it actually reads and writes (the staged
//! form, [`traffic_bytes`]), and what any allreduce of its schedule must move ([`must_bytes`]),
//! the numerator of the loopback floor that `bench kernels` compares each kernel with.

use crate::allreduce::{Part, Peers, Phase, Plane, Ranks};
use crate::fabric::Backend;

/// What `bench kernels` writes beside its figures, so a reader of the JSON has the rule.
pub const FLOOR_DEFINITION: &str = "must_bytes = per rank, its input read once and its output \
written once (2 x bytes per rank) plus what the schedule sends between ranks (each phase: the \
part it exchanges x the peers it exchanges with, counted once whether pulled or pushed), summed \
over the ranks; the same for every form of a backend (staged or registered) and never counting \
staging or re-reads. floor_us = must_bytes / the largest copy bandwidth of the run (cuMemcpyDtoD, \
2 x bytes copied / time). floor_fraction = floor_us / us_per_call: 1.0 is a kernel at the \
loopback floor, and it falls when the kernel gets slower";

/// Bytes one rank of `backend` must move in one call of `bytes` per rank with `ranks`: its
/// input read once, its output written once, plus, per phase, the part it exchanges times the
/// peers it exchanges with (sent once, whoever moves it). It depends on the schedule alone, so
/// a kernel that copies more (staging, slots read back) shows as slower against it, never as
/// more work done. NCCL (no phases): input read and output written.
pub fn must_bytes(backend: Backend, bytes: u64, ranks: Ranks) -> u64 {
    let sent: u64 = backend
        .phases()
        .iter()
        .map(|p| {
            let (part, peers) = part_and_peers(p, bytes, ranks);
            part * peers
        })
        .sum();
    2 * bytes + sent
}

/// A phase's part of a `bytes` message and how many peers it meets, with `ranks`.
fn part_and_peers(p: &Phase, bytes: u64, ranks: Ranks) -> (u64, u64) {
    let part = match p.part {
        Part::Message => bytes,
        Part::Shard => bytes / ranks.n.max(1) as u64,
        Part::IslandShard => bytes / ranks.island.max(1) as u64,
    };
    let peers = match p.peers {
        Peers::All => ranks.n.saturating_sub(1),
        Peers::Island => ranks.island.saturating_sub(1),
        Peers::Counterparts => ranks.islands().saturating_sub(1),
    } as u64;
    (part, peers)
}

/// Microseconds the copy engine's bandwidth (`copy_gbps`, read plus write) needs to move
/// `must` bytes: no kernel of that schedule runs faster in loopback.
pub fn floor_us(must: u64, copy_gbps: f64) -> f64 {
    must as f64 / (copy_gbps * 1e3)
}

/// The floor over the time a kernel took: 1.0 at the floor, smaller the slower the kernel.
pub fn floor_fraction(must: u64, copy_gbps: f64, us_per_call: f64) -> f64 {
    floor_us(must, copy_gbps) / us_per_call
}

/// Bytes one rank's kernel reads plus writes in one call of `bytes` with `ranks`, counting
/// every peer access: what `bench kernels` reports beside the floor. Per phase of a
/// part with k peers: pulling and reducing, k + 1 parts read and one written; pulling a
/// gather, k + 1 read and written; pushing, the input read once and written k times (a
/// message) or k shards read and sent, then k + 1 read by the reduce and its result written
/// (by the gather that follows, where one does). Island phases count as pulled. Then what the
/// kernel stages between the caller's tensors and its shared buffers (kernels/common.cuh,
/// ArArgs): a pulled input copied in (read and written), a pushed-into output copied out, and
/// a pulled gather's own shard written to the shared output as well. NCCL: the algorithmic
/// minimum, input read and output written.
/// `registered`: the call runs the registered form (Backend::has_registered_form),
/// which stages nothing.
pub fn traffic_bytes(backend: Backend, bytes: u64, ranks: Ranks, registered: bool) -> u64 {
    let phases = backend.phases();
    if phases.is_empty() {
        return 2 * bytes;
    }
    let push = backend.spec().plane == Plane::Push;
    let shared = backend.spec().buffers;
    let input = match shared {
        Some(b) if b.input && !push => 2 * bytes,
        _ => 0,
    };
    let output = match shared {
        Some(b) if b.output && push => 2 * (bytes - bytes / ranks.n.max(1) as u64),
        Some(b) if b.output => bytes / ranks.island.max(1) as u64,
        _ => 0,
    };
    let staged = if registered { 0 } else { input + output };
    staged
        + phases
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (part, k) = part_and_peers(p, bytes, ranks);
                let gather_next = phases.get(i + 1).is_some_and(|q| !q.reduces);
                let parts = match (push, p.reduces) {
                    (false, true) => k + 2,
                    (false, false) => 2 * (k + 1),
                    (true, true) => {
                        let send = if p.part == Part::Message {
                            1 + k
                        } else {
                            2 * k
                        };
                        send + (k + 1) + u64::from(!gather_next)
                    }
                    (true, false) => k + 1,
                };
                parts * part
            })
            .sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_counts() {
        assert_eq!(
            traffic_bytes(Backend::OneStagePull, 100, Ranks::flat(8), false),
            900 + 200
        );
        assert_eq!(
            traffic_bytes(Backend::OneStagePush, 100, Ranks::flat(8), false),
            1700
        );
        assert_eq!(
            traffic_bytes(Backend::TwoStagePull, 800, Ranks::flat(8), false),
            2500 + 1600
        );
        // The copy out: the 7 shards peers wrote, read and written.
        assert_eq!(
            traffic_bytes(Backend::TwoStagePush, 800, Ranks::flat(8), false),
            1400 + 1600 + 1400
        );
    }

    #[test]
    fn must_bytes_are_the_schedules_not_the_forms() {
        let flat = Ranks::flat(8);
        // One stage: 2 x 100 plus 7 peers x the message.
        assert_eq!(must_bytes(Backend::OneStagePull, 100, flat), 900);
        // Pull and push of one schedule must move the same bytes.
        assert_eq!(
            must_bytes(Backend::OneStagePush, 100, flat),
            must_bytes(Backend::OneStagePull, 100, flat)
        );
        // Two stages: 2 x 800 plus 2 phases x 7 shards of 100.
        assert_eq!(must_bytes(Backend::TwoStagePull, 800, flat), 1600 + 1400);
        assert_eq!(must_bytes(Backend::TwoStagePush, 800, flat), 3000);
        // Staging adds traffic but never work.
        for b in [
            Backend::OneStagePull,
            Backend::TwoStagePull,
            Backend::TwoStagePush,
        ] {
            assert!(
                traffic_bytes(b, 800, flat, false) > must_bytes(b, 800, flat),
                "{b}"
            );
        }
        // The registered form stages nothing: one-stage pull then moves what it must.
        assert_eq!(
            traffic_bytes(Backend::OneStagePull, 100, flat, true),
            must_bytes(Backend::OneStagePull, 100, flat)
        );
        assert_eq!(must_bytes(Backend::Nccl, 800, Ranks::flat(1)), 1600);
        // The island kernels' registered form stages neither the input nor the output.
        let islands = Ranks { n: 8, island: 4 };
        for b in [Backend::IslandTwoShot, Backend::IslandOneShot] {
            let staged = traffic_bytes(b, 800, islands, false);
            let registered = traffic_bytes(b, 800, islands, true);
            assert!(registered < staged, "{b}");
        }
        assert_eq!(
            traffic_bytes(Backend::IslandTwoShot, 800, islands, false)
                - traffic_bytes(Backend::IslandTwoShot, 800, islands, true),
            2 * 800 + 800 / 4
        );
    }

    #[test]
    fn the_floor_fraction_falls_when_a_kernel_is_slowed() {
        let must = must_bytes(Backend::TwoStagePull, 16 << 20, Ranks::flat(8));
        let fast = floor_fraction(must, 4000.0, 100.0);
        let slowed = floor_fraction(must, 4000.0, 180.0);
        assert!(slowed < fast, "{slowed} >= {fast}");
        assert!((fast / slowed - 1.8).abs() < 1e-9);
        // At the floor, 1.
        let at = floor_us(must, 4000.0);
        assert!((floor_fraction(must, 4000.0, at) - 1.0).abs() < 1e-12);
    }
}
