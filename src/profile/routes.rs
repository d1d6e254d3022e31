//! Which messages of one TP group artune's own kernels serve inside an engine, and the buffers
//! that takes: the profile's custom choices, answered through the same [`Selector`] every
//! consumer uses.

use super::selector::GroupSelector;
use super::{Memory, Profile, Query};
use crate::allreduce::{Backend, Dtype, Executor, Mode};

/// Why a profile routes nothing to artune's kernels for a TP size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoute {
    #[error("the profile has no TP{tp} group")]
    NoGroup { tp: usize },
    #[error("the profile chooses no custom kernel at TP{tp} (NCCL serves every size)")]
    NoCustom { tp: usize },
    /// Custom kernels are chosen, but none of the backends asked for (`only`).
    #[error("the profile chooses none of {only} at TP{tp}")]
    NoneOf { tp: usize, only: String },
}

/// Which of the profile's custom choices artune's own kernels take inside an engine: the
/// plugins' kernels setting (`ARTUNE_KERNELS`), read by the plugins (through the Python
/// extension) and by `artune why`, so both say the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSetting {
    /// Only the backends no engine has a path of (the island schedules): the default, since
    /// the engine has nothing of that shape to run there.
    Islands,
    /// Every custom choice (the opt-in): artune's kernels, as timed, instead of the engine's
    /// kernels of the same shape.
    Artune,
}

impl KernelSetting {
    pub fn id(self) -> &'static str {
        match self {
            KernelSetting::Islands => "islands",
            KernelSetting::Artune => "artune",
        }
    }

    pub fn from_id(id: &str) -> Option<KernelSetting> {
        [KernelSetting::Islands, KernelSetting::Artune]
            .into_iter()
            .find(|k| k.id() == id)
    }

    /// Whether artune's kernels take a size the profile gives `b`: the engine's op runs SM
    /// kernels, and copy-engine backends unless they are switched off
    /// ([`crate::allreduce::copy_engines_on`]); elsewhere the engine runs the bucket's
    /// fallback at their sizes.
    pub fn takes(self, b: Backend) -> bool {
        self.takes_with(b, crate::allreduce::copy_engines_on())
    }

    /// [`KernelSetting::takes`] with copy-engine backends switched on or off.
    pub fn takes_with(self, b: Backend, copies: bool) -> bool {
        let op_runs = match b.executor() {
            Executor::SmKernel => true,
            Executor::CopyEngine(_) => copies,
            Executor::Nccl => false,
        };
        op_runs
            && match self {
                KernelSetting::Islands => !b.engines_have(),
                KernelSetting::Artune => true,
            }
    }

    /// The backends it takes, in table order.
    pub fn backends(self) -> Vec<Backend> {
        Backend::ALL
            .into_iter()
            .filter(|&b| self.takes(b))
            .collect()
    }
}

/// The routed messages of one TP size: per mode, the profile's buckets; per backend, the
/// largest message it serves, which sizes its buffers.
#[derive(Debug, Clone)]
pub struct Routes {
    pub tp: usize,
    /// The element type the profile measured; other dtypes keep the engine's path.
    pub dtype: Dtype,
    graph: Option<GroupSelector>,
    eager: Option<GroupSelector>,
    /// Set by [`Routes::forced`]: this backend serves every size up to its buffers.
    forced: Option<Backend>,
    /// Each backend served and the largest message it serves, in backend order.
    pub buffers: Vec<(Backend, u64)>,
    /// What the profile says each of those backends' buffers cost (the graph group's figure,
    /// else the eager group's): the op's own measurement is compared with it.
    pub profile_memory: Vec<(Backend, Memory)>,
    /// The group's GPUs (rank r on `gpus[r]`) and islands, as tuned: the island schedules run
    /// in them, their phases oriented as the tune's probe said.
    pub islands: Option<(Vec<usize>, crate::allreduce::Islands)>,
}

impl Routes {
    /// The profile's custom choices at `tp` (both modes, the engine's default placement),
    /// limited to `only` when given (the backends an engine lacks).
    pub fn from_profile(
        p: &Profile,
        tp: usize,
        only: Option<&[Backend]>,
    ) -> Result<Routes, NoRoute> {
        let sel = p.selector();
        let q = |mode| Query {
            tp,
            mode,
            gpus: None,
        };
        let graph = sel.group(q(Mode::Graph)).cloned();
        let eager = sel.group(q(Mode::Eager)).cloned();
        let Some(group) = p.group(q(Mode::Graph)).or_else(|| p.group(q(Mode::Eager))) else {
            return Err(NoRoute::NoGroup { tp });
        };
        let mut buffers: Vec<(Backend, u64)> = Vec::new();
        let mut custom = false;
        for g in [&graph, &eager].into_iter().flatten() {
            for (&bytes, a) in g.sizes().iter().zip(g.answers()) {
                let b = a.backend;
                custom |= b.is_custom();
                if !b.is_custom() || only.is_some_and(|o| !o.contains(&b)) {
                    continue;
                }
                match buffers.iter_mut().find(|(x, _)| *x == b) {
                    Some((_, max)) => *max = (*max).max(bytes),
                    None => buffers.push((b, bytes)),
                }
            }
        }
        match (buffers.is_empty(), only) {
            (false, _) => {}
            (true, Some(o)) if custom => {
                let only = o.iter().map(|b| b.id()).collect::<Vec<_>>().join(", ");
                return Err(NoRoute::NoneOf { tp, only });
            }
            (true, _) => return Err(NoRoute::NoCustom { tp }),
        }
        buffers.sort();
        Ok(Routes {
            tp,
            dtype: group.dtype,
            graph,
            eager,
            forced: None,
            profile_memory: memory_of(group, &buffers),
            islands: group.islands.clone().map(|i| (group.gpus.clone(), i)),
            buffers,
        })
    }

    /// What artune's kernels serve inside an engine at `tp` under the plugins' setting.
    pub fn for_engine(p: &Profile, tp: usize, kernels: KernelSetting) -> Result<Routes, NoRoute> {
        Routes::from_profile(p, tp, Some(&kernels.backends()))
    }

    /// `backend` at every size up to `max_bytes`, whatever the profile chose: for proving and
    /// benchmarking a kernel against the profile's time of it. Without `max_bytes` its
    /// buffers are sized as the tune sized them (the profile's `serves_up_to_bytes`), so
    /// their memory is the profile's measured figure. A TP size the profile lacks (one rank,
    /// for the launch-overhead benchmark) takes the profile's dtype and largest size.
    pub fn forced(p: &Profile, tp: usize, backend: Backend, max_bytes: Option<u64>) -> Routes {
        let q = |mode| Query {
            tp,
            mode,
            gpus: None,
        };
        let group = p.group(q(Mode::Graph)).or_else(|| p.group(q(Mode::Eager)));
        let max = max_bytes
            .or_else(|| group?.memory.get(&backend)?.serves_up_to_bytes)
            .unwrap_or(p.settings.max_bytes)
            .max(1);
        let buffers = vec![(backend, max)];
        Routes {
            tp,
            dtype: group
                .map(|g| g.dtype)
                .or(p.settings.dtype)
                .unwrap_or(Dtype::Bf16),
            graph: None,
            eager: None,
            forced: Some(backend),
            profile_memory: group.map_or_else(Vec::new, |g| memory_of(g, &buffers)),
            islands: group.and_then(|g| Some((g.gpus.clone(), g.islands.clone()?))),
            buffers,
        }
    }

    /// The backend artune's kernels run for `bytes` in `mode`, or None: the engine's path.
    pub fn backend(&self, mode: Mode, bytes: u64) -> Option<Backend> {
        let b = match self.forced {
            Some(b) => b,
            None => {
                let g = match mode {
                    Mode::Graph => self.graph.as_ref(),
                    Mode::Eager => self.eager.as_ref(),
                }?;
                g.at(bytes)?.1.backend
            }
        };
        let max = self.buffers.iter().find(|(x, _)| *x == b)?.1;
        (bytes >= 1 && bytes <= max).then_some(b)
    }

    /// The routed sizes of `mode` as (lowest, highest, backend) runs, ascending.
    pub fn bands(&self, mode: Mode) -> Vec<(u64, u64, Backend)> {
        if let Some(b) = self.forced {
            return vec![(1, self.buffers[0].1, b)];
        }
        let g = match mode {
            Mode::Graph => self.graph.as_ref(),
            Mode::Eager => self.eager.as_ref(),
        };
        let Some(g) = g else {
            return Vec::new();
        };
        let mut out: Vec<(u64, u64, Backend)> = Vec::new();
        let mut prev = 0u64;
        for (&bytes, a) in g.sizes().iter().zip(g.answers()) {
            let lo = match prev {
                // Below the smallest bucket: what the selector answers there.
                0 if g.at(1).is_some() => 1,
                0 => bytes,
                p => p + 1,
            };
            prev = bytes;
            if self.backend(mode, bytes) != Some(a.backend) {
                continue;
            }
            match out.last_mut() {
                Some(l) if l.2 == a.backend && l.1 + 1 == lo => l.1 = bytes,
                _ => out.push((lo, bytes, a.backend)),
            }
        }
        out
    }

    /// One line for the engine's log: the sizes each mode sends to artune's kernels.
    pub fn describe(&self) -> String {
        let mode = |m: Mode| {
            let b = self.bands(m);
            if b.is_empty() {
                return format!("{}: none", m.id());
            }
            // Sizes as the bands read elsewhere ("above 112K to 1152K"): exact, in the largest
            // unit that divides them.
            let exact = |n: u64| match [(30, "G"), (20, "M"), (10, "K")]
                .into_iter()
                .find(|(s, _)| n >= 1 << s && n.is_multiple_of(1 << s))
            {
                Some((s, unit)) => format!("{}{unit}", n >> s),
                None => format!("{n}B"),
            };
            let parts: Vec<String> = b
                .iter()
                .map(|&(lo, hi, be)| match lo {
                    1 => format!("to {} {be}", exact(hi)),
                    _ => format!("above {} to {} {be}", exact(lo - 1), exact(hi)),
                })
                .collect();
            format!("{}: {}", m.id(), parts.join(", "))
        };
        format!(
            "TP{} {}: {}; {}",
            self.tp,
            self.dtype.id(),
            mode(Mode::Graph),
            mode(Mode::Eager)
        )
    }
}

/// The group's memory entries for the backends of `buffers`.
fn memory_of(g: &super::GroupProfile, buffers: &[(Backend, u64)]) -> Vec<(Backend, Memory)> {
    buffers
        .iter()
        .filter_map(|(b, _)| Some((*b, *g.memory.get(b)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::tests::fixture;
    use crate::profile::Timing;

    /// The fixture's TP2 group with custom choices at its two smallest buckets.
    fn custom_profile() -> Profile {
        let mut p = fixture();
        let g = &mut p.groups[0];
        g.buckets[0].choice = Backend::OneStagePull;
        g.buckets[0]
            .results
            .insert(Backend::OneStagePull, Timing::around(5.0, 0.1));
        g.buckets[1].choice = Backend::TwoStagePush;
        g.buckets[1]
            .results
            .insert(Backend::TwoStagePush, Timing::around(5.0, 0.1));
        p
    }

    #[test]
    fn the_profiles_custom_buckets_are_routed_and_nothing_else() {
        let p = custom_profile();
        let g = &p.groups[0];
        let (b0, b1, b2) = (g.buckets[0].bytes, g.buckets[1].bytes, g.buckets[2].bytes);
        let r = Routes::from_profile(&p, g.tp, None).unwrap();
        assert_eq!(
            r.buffers,
            vec![(Backend::OneStagePull, b0), (Backend::TwoStagePush, b1)]
        );
        assert_eq!(r.backend(g.mode, b0), Some(Backend::OneStagePull));
        assert_eq!(r.backend(g.mode, b0 + 1), Some(Backend::TwoStagePush));
        assert_eq!(r.backend(g.mode, b1), Some(Backend::TwoStagePush));
        assert_eq!(r.backend(g.mode, b1 + 1), None, "NCCL's bucket");
        assert_eq!(r.backend(g.mode, b2 + 1), None, "above the profile");
        let other = match g.mode {
            Mode::Graph => Mode::Eager,
            Mode::Eager => Mode::Graph,
        };
        assert_eq!(r.backend(other, b0), None, "the profile has no such group");
        // Only the backends asked for: the rest keep the engine's path.
        let only = Routes::from_profile(&p, g.tp, Some(&[Backend::TwoStagePush])).unwrap();
        assert_eq!(only.buffers, vec![(Backend::TwoStagePush, b1)]);
        assert_eq!(only.backend(g.mode, b0), None);
        assert_eq!(only.backend(g.mode, b1), Some(Backend::TwoStagePush));
        assert_eq!(
            only.bands(g.mode),
            vec![(b0 + 1, b1, Backend::TwoStagePush)]
        );
        // Sizes read as the bands elsewhere, exact: the fixture's buckets are 4K and 8K.
        assert_eq!((b0, b1), (4096, 8192));
        assert_eq!(
            r.describe(),
            format!(
                "TP2 bf16: {}: to 4K one_stage_pull, above 4K to 8K two_stage_push; {}: none",
                g.mode.id(),
                other.id()
            )
        );
    }

    #[test]
    fn a_profile_without_custom_choices_routes_nothing_and_says_why() {
        let mut p = fixture();
        for b in &mut p.groups[0].buckets {
            b.choice = Backend::Nccl;
        }
        let tp = p.groups[0].tp;
        assert_eq!(
            Routes::from_profile(&p, tp, None).unwrap_err(),
            NoRoute::NoCustom { tp }
        );
        assert_eq!(
            Routes::from_profile(&p, 7, None).unwrap_err().to_string(),
            "the profile has no TP7 group"
        );
        // Custom choices, none of them among the backends asked for: said as such.
        let p = custom_profile();
        let only = [Backend::IslandTwoShot, Backend::IslandOneShot];
        assert_eq!(
            Routes::from_profile(&p, tp, Some(&only))
                .unwrap_err()
                .to_string(),
            format!("the profile chooses none of island_two_shot, island_one_shot at TP{tp}")
        );
    }

    #[test]
    fn engines_get_artunes_kernels_where_they_lack_one_or_everywhere_when_asked() {
        // The default takes the backends no engine has a path of: the island schedules and,
        // unless switched off, the copy-engine backends.
        let copies = [Backend::TwoStageCopy, Backend::IslandTwoShotCopy];
        let on = crate::allreduce::copy_engines_on();
        let islands = [Backend::IslandTwoShot, Backend::IslandOneShot];
        let unpathed: Vec<Backend> = islands
            .into_iter()
            .chain(copies.into_iter().filter(|_| on))
            .collect();
        assert_eq!(KernelSetting::Islands.backends(), unpathed);
        // Everything the op runs: the SM kernels, and the copy-engine backends unless off.
        let customs: Vec<Backend> = Backend::ALL
            .into_iter()
            .filter(|b| b.is_custom() && (b.spec().kernel.is_some() || on))
            .collect();
        assert_eq!(KernelSetting::Artune.backends(), customs);
        // Switched on, the copy-engine backends go to the op in either setting (no engine has
        // them); off, to the bucket's fallback.
        for b in [Backend::TwoStageCopy, Backend::IslandTwoShotCopy] {
            for k in [KernelSetting::Islands, KernelSetting::Artune] {
                assert!(k.takes_with(b, true), "{b} {k:?}");
                assert!(!k.takes_with(b, false), "{b} {k:?}");
            }
        }
        for k in [KernelSetting::Islands, KernelSetting::Artune] {
            assert_eq!(KernelSetting::from_id(k.id()), Some(k));
        }
        assert_eq!(KernelSetting::from_id("engine"), None);
        // A flat and an island choice: the default routes the island size only.
        let mut p = custom_profile();
        let g = &mut p.groups[0];
        g.buckets[1].choice = Backend::IslandTwoShot;
        g.buckets[1].fallback = Some(Backend::Nccl);
        g.buckets[1]
            .results
            .insert(Backend::IslandTwoShot, Timing::around(4.0, 0.1));
        let (tp, mode) = (g.tp, g.mode);
        let (b0, b1) = (g.buckets[0].bytes, g.buckets[1].bytes);
        let r = Routes::for_engine(&p, tp, KernelSetting::Islands).unwrap();
        assert_eq!(r.backend(mode, b0), None);
        assert_eq!(r.backend(mode, b1), Some(Backend::IslandTwoShot));
        let r = Routes::for_engine(&p, tp, KernelSetting::Artune).unwrap();
        assert_eq!(r.backend(mode, b0), Some(Backend::OneStagePull));
        assert_eq!(r.backend(mode, b1), Some(Backend::IslandTwoShot));
    }

    #[test]
    fn a_forced_backend_serves_every_size_up_to_its_buffers() {
        let p = fixture();
        let r = Routes::forced(&p, 2, Backend::OneStagePush, Some(1 << 20));
        assert_eq!(r.dtype, Dtype::Bf16);
        assert_eq!(r.backend(Mode::Graph, 4096), Some(Backend::OneStagePush));
        assert_eq!(r.backend(Mode::Eager, 1 << 20), Some(Backend::OneStagePush));
        assert_eq!(r.backend(Mode::Eager, (1 << 20) + 2), None);
        assert_eq!(r.backend(Mode::Eager, 0), None);
        // Sized as the tune sized it by default: the profile's measured figure applies.
        let r = Routes::forced(&p, 2, Backend::OneStagePull, None);
        assert_eq!(r.buffers, vec![(Backend::OneStagePull, 16384)]);
        assert_eq!(r.profile_memory[0].1.bytes_per_gpu, 5 << 20);
        // No group of one rank: the profile's dtype and largest size, no figure to compare.
        let one = Routes::forced(&p, 1, Backend::OneStagePull, None);
        assert_eq!(
            one.buffers,
            vec![(Backend::OneStagePull, p.settings.max_bytes.max(1))]
        );
        assert!(one.profile_memory.is_empty());
    }
}
