//! What artune's engine plugins follow at one TP size: the one rule they apply, which the
//! plugins (python/artune/, through the extension module) and `artune why` both call, so the
//! answer `why` reports is the plugin's by construction.
//!
//! The rule (docs/ENGINE-PATHS.md): where the profile says NCCL at a size (TP size, size,
//! graph or eager), no peer-to-peer path of the engine takes it; where it says custom or has no
//! answer, the engine's own answer stands. Where it says an island schedule, which no engine
//! has, the engine follows the bucket's fallback (the rule among the backends engines have).
//! The sizes artune's own kernels take ([`own_kernel`]) are routed to them before the engine's
//! paths are asked. A fused allreduce+norm runs the engine's peer kernel at every size up to
//! its limit, so it fuses only inside the custom band that starts at the smallest size, in both
//! modes (the pass is built once for both).
//!
//! A setting the engine has once for both modes (the fusion's limit, a custom all-reduce's
//! `max_size` or whether it is built) follows the profile only where it answers both modes:
//! a mode it lacks has no answer, so the engine's own rule stands there, and a limit taken from
//! the other mode would steer calls the profile never measured.

use crate::allreduce::{Backend, Mode};
use crate::profile::routes::{KernelSetting, Routes};
use crate::profile::selector::GroupSelector;
use crate::profile::{answers_below, Profile, Query, Selector};

/// The kernel of artune's own that the plugins' op (artune.allreduce, built on the engine's TP
/// group at start-up) runs for `bytes` in `mode` at TP `tp` under the kernels setting, or None
/// where the engine's paths take the message. Only messages of the profile's dtype are routed.
pub fn own_kernel(
    p: &Profile,
    tp: usize,
    mode: Mode,
    bytes: u64,
    kernels: KernelSetting,
) -> Option<Backend> {
    Routes::for_engine(p, tp, kernels)
        .ok()?
        .backend(mode, bytes)
}

/// [`Follow::custom_at`] of one mode as runs of sizes (see [`Follow::steps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    /// The smallest size the profile answers (0: every size up to the first bound).
    pub from: u64,
    /// Each run's largest size, ascending.
    pub up_to: Vec<u64>,
    /// Whether the run is custom (a peer-to-peer path may take it) or NCCL.
    pub custom: Vec<bool>,
}

/// The profile's groups of one TP size (graph and eager) on one placement.
#[derive(Debug, Clone, Copy)]
pub struct Follow<'s> {
    graph: Option<&'s GroupSelector>,
    eager: Option<&'s GroupSelector>,
}

impl<'s> Follow<'s> {
    /// The groups of `tp` on `gpus` (None: the engine's default placement, as the plugins
    /// see it).
    pub fn new(sel: &'s Selector, tp: usize, gpus: Option<&[usize]>) -> Follow<'s> {
        let g = |mode| sel.group(Query { tp, mode, gpus });
        Follow {
            graph: g(Mode::Graph),
            eager: g(Mode::Eager),
        }
    }

    /// The profile has this TP size at all (else the plugins keep the engine's choice).
    pub fn covers(&self) -> bool {
        self.graph.is_some() || self.eager.is_some()
    }

    /// Some(true) where the profile chose a custom kernel for `bytes` in `mode`, Some(false)
    /// where NCCL, None where it has no answer (the engine keeps its own rule).
    pub fn custom_at(&self, bytes: u64, mode: Mode) -> Option<bool> {
        let g = match mode {
            Mode::Graph => self.graph,
            Mode::Eager => self.eager,
        }?;
        g.at(bytes).map(|(_, a)| a.fallback.is_custom())
    }

    /// [`Follow::custom_at`] in `mode` as plain data, for callers that must not call back into
    /// artune per message (SGLang's dispatch traced by torch.compile): the answer for `bytes`
    /// is `custom[i]` for the first `i` with `bytes <= up_to[i]`, for `bytes >= from`; None
    /// (no answer) below `from`, above the last bound, or where the profile lacks the mode.
    pub fn steps(&self, mode: Mode) -> Option<Steps> {
        let g = match mode {
            Mode::Graph => self.graph,
            Mode::Eager => self.eager,
        }?;
        let from = g
            .sizes()
            .first()
            .map_or(0, |&s| if answers_below(s, 0) { 0 } else { s });
        let mut steps = Steps {
            from,
            up_to: Vec::new(),
            custom: Vec::new(),
        };
        for (&s, a) in g.sizes().iter().zip(g.answers()) {
            let c = a.fallback.is_custom();
            match (steps.custom.last(), steps.up_to.last_mut()) {
                (Some(&last), Some(up_to)) if last == c => *up_to = s,
                _ => {
                    steps.up_to.push(s);
                    steps.custom.push(c);
                }
            }
        }
        Some(steps)
    }

    /// A peer-to-peer path the engine would take: whether the plugin lets it.
    pub fn allows(&self, bytes: u64, mode: Mode) -> bool {
        self.custom_at(bytes, mode) != Some(false)
    }

    /// Both modes' groups, where the profile has both: what a setting governing both modes
    /// follows (see the module's doc).
    fn both(&self) -> Option<[&'s GroupSelector; 2]> {
        Some([self.graph?, self.eager?])
    }

    /// The largest size up to which the profile chooses custom at every size from the
    /// smallest, in both modes (0: either starts with NCCL); None where it lacks a mode.
    pub fn custom_prefix(&self) -> Option<u64> {
        let prefix = |g: &GroupSelector| {
            g.sizes()
                .iter()
                .zip(g.answers())
                .take_while(|(_, a)| a.fallback.is_custom())
                .last()
                .map_or(0, |(&s, _)| s)
        };
        self.both()
            .map(|gs| gs.map(prefix).into_iter().min().unwrap_or(0))
    }

    /// The largest message the profile routes to a custom kernel in either mode (0: none),
    /// for a buffer serving both; None where it lacks a mode.
    pub fn largest_custom(&self) -> Option<u64> {
        let gs = self.both()?;
        Some(
            gs.into_iter()
                .flat_map(|g| g.sizes().iter().zip(g.answers()))
                .filter(|(_, a)| a.fallback.is_custom())
                .map(|(&s, _)| s)
                .max()
                .unwrap_or(0),
        )
    }

    /// A fused allreduce+norm whose engine fuses up to `engine` bytes (None: it does not
    /// fuse here): the size the plugin lets it fuse to, None where it fuses nothing. Where
    /// the profile lacks this TP size or a mode, the engine's own size stands.
    pub fn fused_up_to(&self, engine: Option<u64>) -> Option<u64> {
        let base = engine?;
        match self.custom_prefix() {
            None => Some(base),
            Some(0) => None,
            Some(top) => Some(base.min(top)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    /// The sample's TP2 group, with its choices replaced: custom where `custom` says.
    fn shaped(graph: &[bool], eager: &[bool]) -> crate::profile::Profile {
        let mut p = sample::profile_with("nvswitch-8x", &[2], &[4 << 10, 64 << 10, 1 << 20]);
        for g in &mut p.groups {
            let want = if g.mode == Mode::Graph { graph } else { eager };
            for (b, &c) in g.buckets.iter_mut().zip(want) {
                b.choice = if c {
                    *b.results.keys().find(|k| k.is_custom()).unwrap()
                } else {
                    Backend::Nccl
                };
            }
        }
        p
    }

    #[test]
    fn an_island_choice_is_followed_as_its_fallback() {
        // Graph: an island schedule at 64K whose fallback is NCCL, then one whose fallback is
        // a flat kernel at 1M. The engine's peer paths are turned down at 64K (NCCL is what it
        // runs without artune's kernels there) and allowed at 1M.
        let mut p = shaped(&[true, true, true], &[true, true, true]);
        for g in p.groups.iter_mut().filter(|g| g.mode == Mode::Graph) {
            let flat = g.buckets[2].choice;
            g.buckets[1].choice = Backend::IslandTwoShot;
            g.buckets[1].fallback = Some(Backend::Nccl);
            g.buckets[2].choice = Backend::IslandOneShot;
            g.buckets[2].fallback = Some(flat);
        }
        let sel = p.selector();
        let f = Follow::new(&sel, 2, None);
        assert_eq!(f.custom_at(64 << 10, Mode::Graph), Some(false));
        assert_eq!(f.custom_at(1 << 20, Mode::Graph), Some(true));
        assert_eq!(f.custom_prefix(), Some(4 << 10));
        assert_eq!(f.largest_custom(), Some(1 << 20));
    }

    #[test]
    fn the_prefix_is_the_smaller_over_modes_and_the_largest_the_larger() {
        let p = shaped(&[true, true, false], &[true, false, true]);
        let sel = p.selector();
        let f = Follow::new(&sel, 2, None);
        assert!(f.covers());
        // Graph custom to 64K, eager only to 4K: fusion (built once for both) stops at 4K.
        assert_eq!(f.custom_prefix(), Some(4 << 10));
        assert_eq!(f.largest_custom(), Some(1 << 20));
        assert_eq!(f.fused_up_to(Some(32 << 20)), Some(4 << 10));
        assert_eq!(f.fused_up_to(Some(2 << 10)), Some(2 << 10));
        assert_eq!(f.fused_up_to(None), None);
        assert_eq!(f.custom_at(64 << 10, Mode::Graph), Some(true));
        assert_eq!(f.custom_at(64 << 10, Mode::Eager), Some(false));
        assert!(!f.allows(64 << 10, Mode::Eager) && f.allows(64 << 10, Mode::Graph));
        assert_eq!(f.custom_at(1 << 30, Mode::Graph), None);
        assert!(f.allows(1 << 30, Mode::Graph));
    }

    /// The plain-data form answers as the rule does at, between and around every bound.
    #[test]
    fn the_steps_answer_as_custom_at_does() {
        for (graph, eager) in [
            ([true, false, true], [false, false, true]),
            ([true, true, true], [false, true, false]),
        ] {
            let mut p = shaped(&graph, &eager);
            for small in [4 << 10, 8 << 10] {
                for g in &mut p.groups {
                    g.buckets[0].bytes = small;
                }
                let sel = p.selector();
                let f = Follow::new(&sel, 2, None);
                for mode in [Mode::Graph, Mode::Eager] {
                    let s = f.steps(mode).unwrap();
                    assert_eq!(s.from, if small > 4 << 10 { small } else { 0 });
                    let probes = [
                        0, 1, 4095, 4096, 4097, 8191, 8192, 8193, 65535, 65536, 65537,
                    ]
                    .into_iter()
                    .chain([(1 << 20) - 1, 1 << 20, (1 << 20) + 1, 1 << 30]);
                    for n in probes {
                        let i = s.up_to.iter().position(|&u| n <= u);
                        let got = i.filter(|_| n >= s.from).map(|i| s.custom[i]);
                        assert_eq!(got, f.custom_at(n, mode), "{mode:?} {n}");
                    }
                }
            }
        }
        let p = shaped(&[true, true, true], &[true, true, true]);
        let sel = p.selector();
        assert_eq!(Follow::new(&sel, 8, None).steps(Mode::Graph), None);
    }

    #[test]
    fn a_profile_that_starts_with_nccl_fuses_nothing_and_an_absent_tp_keeps_the_engines() {
        let p = shaped(&[false, true, true], &[true, true, true]);
        let sel = p.selector();
        let f = Follow::new(&sel, 2, None);
        assert_eq!(f.custom_prefix(), Some(0));
        assert_eq!(f.fused_up_to(Some(1 << 20)), None);
        let none = Follow::new(&sel, 8, None);
        assert!(!none.covers());
        assert_eq!(none.fused_up_to(Some(1 << 20)), Some(1 << 20));
        assert_eq!(none.largest_custom(), None);
    }

    /// A graph-only profile answers nothing about eager calls: the settings that serve both
    /// modes keep the engine's own, and graph's answers stay graph's.
    #[test]
    fn a_mode_the_profile_lacks_keeps_the_engines_settings() {
        let mut p = shaped(&[false, true, false], &[true, true, true]);
        p.groups.retain(|g| g.mode == Mode::Graph);
        let sel = p.selector();
        let f = Follow::new(&sel, 2, None);
        assert!(f.covers());
        assert_eq!(f.custom_prefix(), None);
        assert_eq!(f.largest_custom(), None);
        assert_eq!(f.fused_up_to(Some(1 << 20)), Some(1 << 20));
        assert_eq!(f.custom_at(4 << 10, Mode::Graph), Some(false));
        assert_eq!(f.custom_at(4 << 10, Mode::Eager), None);
        assert!(f.allows(4 << 10, Mode::Eager));
        assert_eq!(f.steps(Mode::Eager), None);
    }
}
