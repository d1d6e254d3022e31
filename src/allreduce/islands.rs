//! Islands: how a group's GPUs split for the hierarchical backends, and which way each phase
//! moves data. The partition itself is derived from the topology (`plan::islands`); this is the
//! vocabulary every layer shares, and the rule that orients the phases from the contention
//! probe.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Direction, Peers, ProbeSample};

/// What separates a group's islands: the slowest crossing between two of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Separation {
    /// GPUs under one PCIe switch (tree) talk inside it; islands meet at a host bridge.
    Switch,
    /// GPUs under one root complex; islands meet across root complexes of a socket.
    RootComplex,
    /// GPUs of one socket; islands meet across the socket interconnect.
    Socket,
    /// GPUs joined by NVLink (bridged pairs); islands meet over PCIe.
    Nvlink,
    /// Given with `--islands` (an experiment, or virtual islands on one GPU).
    Given,
}

impl Separation {
    /// What one island is, for sentences: "switch", "root complex", "socket", "given island".
    pub fn noun(self) -> &'static str {
        match self {
            Separation::Switch => "switch",
            Separation::RootComplex => "root complex",
            Separation::Socket => "socket",
            Separation::Nvlink => "NVLink set",
            Separation::Given => "given island",
        }
    }

    /// The plural of [`Separation::noun`].
    pub fn nouns(self) -> &'static str {
        match self {
            Separation::Switch => "switches",
            Separation::RootComplex => "root complexes",
            Separation::Socket => "sockets",
            Separation::Nvlink => "NVLink sets",
            Separation::Given => "given islands",
        }
    }
}

/// Which way the hierarchical backends move data inside islands and across them, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Directions {
    pub inside: Direction,
    pub across: Direction,
    /// The probe figures that decided, in a sentence.
    pub because: String,
}

impl Directions {
    /// The direction of a phase exchanging with `peers`.
    pub fn of(&self, peers: Peers) -> Direction {
        match peers {
            Peers::Island => self.inside,
            Peers::Counterparts | Peers::All => self.across,
        }
    }
}

/// A group's islands, as tuned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Islands {
    /// Topology GPU indices, island by island, each island in the group's rank order.
    pub gpus: Vec<Vec<usize>>,
    pub by: Separation,
    /// Set once the group's contention probe ran (reads where there was none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directions: Option<Directions>,
}

impl Islands {
    /// GPUs per island (islands are of equal size).
    pub fn size(&self) -> usize {
        self.gpus.first().map_or(0, Vec::len)
    }

    pub fn count(&self) -> usize {
        self.gpus.len()
    }

    /// The group's ranks (indices into `group`) island by island: rank `order[k * m + j]` is
    /// place j of island k. None when a GPU of an island is not in the group.
    pub fn order(&self, group: &[usize]) -> Option<Vec<usize>> {
        self.gpus
            .iter()
            .flatten()
            .map(|g| group.iter().position(|x| x == g))
            .collect()
    }

    /// "2 switches of 4 GPUs: [0, 1, 2, 3] [4, 5, 6, 7]".
    pub fn describe(&self) -> String {
        let list: Vec<String> = self.gpus.iter().map(|i| format!("{i:?}")).collect();
        let noun = if self.count() == 1 {
            self.by.noun()
        } else {
            self.by.nouns()
        };
        format!(
            "{} {noun} of {} GPUs: {}",
            self.count(),
            self.size(),
            list.join(" ")
        )
    }

    /// The direction of each phase: whichever of reading and writing the probe measured
    /// faster per GPU with as many peers at once as the phase has (island peers inside; every
    /// other GPU across, since the probe's widest point is the one that crosses most). A
    /// direction no probe measured reads, as the flat pull kernels do.
    pub fn orient(&self, read: &[ProbeSample], write: &[ProbeSample]) -> Directions {
        let at = |curve: &[ProbeSample], peers: usize| {
            curve
                .iter()
                .filter(|p| p.peers <= peers)
                .max_by_key(|p| p.peers)
                .map(|p| (p.peers, p.per_gpu_gbps))
        };
        let n = self.size() * self.count();
        let pick = |peers: usize| -> (Direction, String) {
            match (at(read, peers), at(write, peers)) {
                (Some((k, r)), Some((_, w))) => {
                    let d = if w > r * 1.10 {
                        Direction::Write
                    } else {
                        Direction::Read
                    };
                    let s = if k == 1 { "" } else { "s" };
                    (
                        d,
                        format!("{k} peer{s} at once read {r:.1} and write {w:.1} GB/s per GPU"),
                    )
                }
                _ => (Direction::Read, "no contention probe ran".into()),
            }
        };
        let (inside, why_in) = pick(self.size().saturating_sub(1).max(1));
        let (across, why_across) = pick(n.saturating_sub(1).max(1));
        Directions {
            inside,
            across,
            because: format!("inside islands, {why_in}; across, {why_across}"),
        }
    }
}

/// A backend's phases in words for a group of `ranks`, each with its peers, its part of the
/// message and which way it moves data: "inside each island with 3 peers, 1/4 of the message,
/// pull (reduce); ...".
pub fn phases_in_words(b: super::Backend, ranks: Ranks, d: Option<&Directions>) -> String {
    use super::{Part, Plane};
    b.phases()
        .iter()
        .map(|p| {
            let (where_, k) = match p.peers {
                Peers::All => ("with every GPU", ranks.n - 1),
                Peers::Island => ("inside each island", ranks.island - 1),
                Peers::Counterparts => ("across islands", ranks.islands() - 1),
            };
            let part = match p.part {
                Part::Message => "the whole message".to_string(),
                Part::Shard => format!("1/{} of the message", ranks.n),
                Part::IslandShard => format!("1/{} of the message", ranks.island),
            };
            let dir = match (b.spec().plane, d) {
                (Plane::Push, _) => "push",
                (Plane::PerPhase, Some(d)) if d.of(p.peers) == Direction::Write => "push",
                _ => "pull",
            };
            let s = if k == 1 { "" } else { "s" };
            let what = if p.reduces { "sum" } else { "gather" };
            format!("{where_} ({k} peer{s}, {part} each, {dir}, {what})")
        })
        .collect::<Vec<_>>()
        .join(", then ")
}

/// The ranks a group's kernels see: `n` in all, in islands of `island` (n where there are none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranks {
    pub n: usize,
    pub island: usize,
}

impl Ranks {
    pub fn flat(n: usize) -> Ranks {
        Ranks { n, island: n }
    }

    pub fn of(n: usize, islands: Option<&Islands>) -> Ranks {
        match islands {
            Some(i) if i.size() >= 1 && i.size() * i.count() == n => Ranks {
                n,
                island: i.size(),
            },
            _ => Ranks::flat(n),
        }
    }

    pub fn islands(self) -> usize {
        (self.n / self.island.max(1)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn islands(gpus: Vec<Vec<usize>>) -> Islands {
        Islands {
            gpus,
            by: Separation::Switch,
            directions: None,
        }
    }

    fn curve(rates: &[f64]) -> Vec<ProbeSample> {
        rates
            .iter()
            .enumerate()
            .map(|(i, &r)| ProbeSample {
                peers: i + 1,
                per_gpu_gbps: r,
                aggregate_gbps: r * 8.0,
            })
            .collect()
    }

    #[test]
    fn order_lists_ranks_island_by_island() {
        let i = islands(vec![vec![0, 1], vec![4, 5]]);
        assert_eq!(i.order(&[0, 4, 1, 5]), Some(vec![0, 2, 1, 3]));
        assert_eq!(i.order(&[0, 1, 4]), None);
        assert_eq!(i.describe(), "2 switches of 2 GPUs: [0, 1] [4, 5]");
    }

    #[test]
    fn each_phase_takes_the_faster_direction_at_its_peer_count() {
        let i = islands(vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        // Writes faster with 3 peers (inside), reads faster with 7 (across).
        let read = curve(&[50.0, 40.0, 30.0, 25.0, 22.0, 20.0, 20.0]);
        let write = curve(&[50.0, 45.0, 40.0, 30.0, 20.0, 15.0, 10.0]);
        let d = i.orient(&read, &write);
        assert_eq!((d.inside, d.across), (Direction::Write, Direction::Read));
        assert!(
            d.because
                .contains("inside islands, 3 peers at once read 30.0 and write 40.0"),
            "{}",
            d.because
        );
        // Within 5%: reads, as a tie.
        let d = i.orient(&read, &curve(&[50.0, 40.0, 31.0, 25.0, 22.0, 20.0, 20.0]));
        assert_eq!(d.inside, Direction::Read);
        let d = i.orient(&[], &[]);
        assert_eq!((d.inside, d.across), (Direction::Read, Direction::Read));
    }

    #[test]
    fn ranks_follow_the_islands_only_when_they_cover_the_group() {
        let i = islands(vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(Ranks::of(4, Some(&i)), Ranks { n: 4, island: 2 });
        assert_eq!(Ranks::of(8, Some(&i)), Ranks::flat(8));
        assert_eq!(Ranks::of(4, Some(&i)).islands(), 2);
    }
}
