//! Channels as a tuned dimension (issue 48): for every pinned NCCL variant and measured size,
//! the channel count that runs fastest among NCCL's own and powers of two, which the profile
//! records per bucket for the tuner plugin to set with that size's pin. Each choice is logged
//! beside NCCL's own choice at its own count, timed the same way where the fabric can
//! ([`table`]): what the chosen count gains or loses against NCCL left alone.

use std::collections::{BTreeMap, BTreeSet};

use crate::allreduce::{Backend, Mode};
use crate::fabric::{ChannelTime, Fabric};

/// The counts tried besides NCCL's own: NCCL's per-call maximum is 32 for a ring on one node
/// (MAXCHANNELS 64, half of them for the other direction).
pub const TRIED: [u32; 5] = [2, 4, 8, 16, 32];

/// A larger count must beat a smaller one by this fraction to be kept: more channels cost
/// NCCL buffers and SMs, and on a tie (the links full) the smaller count is as fast.
pub const MIN_GAIN: f64 = 0.01;

/// Per pinned variant in `ready`, per size, the count measured fastest (the smallest within
/// [`MIN_GAIN`]), every call run as `mode` runs it: a count that wins in host launches need
/// not win in graph replays, where a call's launch no longer hides what the channels cost.
/// Where the fabric cannot time a forced count (or a timing fails), the reason the profile
/// records instead: its pins then keep NCCL's own count.
pub fn sweep(
    fabric: &mut dyn Fabric,
    ready: &[Backend],
    sizes: &BTreeSet<u64>,
    mode: Mode,
) -> Result<BTreeMap<Backend, BTreeMap<u64, u32>>, String> {
    let own = fabric.nccl_channels();
    let mut counts: Vec<u32> = TRIED.iter().copied().chain(own).collect();
    counts.sort_unstable();
    counts.dedup();
    let sizes: Vec<u64> = sizes.iter().copied().collect();
    let mut best = BTreeMap::new();
    let pins: Vec<Backend> = ready
        .iter()
        .copied()
        .filter(|b| b.nccl_pin().is_some())
        .collect();
    if pins.is_empty() {
        return Ok(best);
    }
    // NCCL's own choice at its own count (0), timed as the pins are: the table's reference.
    let reference = match fabric.nccl_times_at_channels(Backend::Nccl, &sizes, &[0], mode) {
        Ok(mut t) => t.pop().map(|(_, t)| t),
        Err(e) => {
            tracing::info!("channel table: NCCL's own choice not timed at its own count ({e})");
            None
        }
    };
    tracing::info!("channel table: {HEADER}");
    // Every pin and count in one call: a real fabric starts its NCCL ranks once for them all.
    let clock = std::time::Instant::now();
    let all = fabric.nccl_pins_at_channels(&pins, &sizes, &counts, mode);
    // The counts timed, which a fabric may cut (ranks sharing a GPU cap their CTAs).
    let timed: BTreeSet<u32> = (all.iter())
        .filter_map(|(_, r)| r.as_ref().ok())
        .flat_map(|t| t.iter().map(|(c, _)| *c))
        .collect();
    tracing::info!(
        "channel sweep ({}): {} pins x {} counts x {} sizes in {:.2} s",
        mode.id(),
        pins.len(),
        timed.len(),
        sizes.len(),
        clock.elapsed().as_secs_f64()
    );
    for (pin, timed) in all {
        let mut timed = timed.map_err(|e| e.to_string())?;
        timed.sort_by_key(|(c, _)| *c);
        for line in table(&sizes, pin, &timed, reference.as_deref()) {
            tracing::info!("channel table: {line}");
        }
        // What the plugin must set to run what was timed: the count set where it was set per
        // call as the plugin sets it, else the count NCCL ran where the fabric reads it back
        // (forced on the communicator, which the plugin cannot do), else the count forced.
        let at = (sizes.iter().enumerate())
            .filter_map(|(i, &b)| {
                let (c, t) = fastest(&timed, i)?;
                Some((
                    b,
                    if t.per_call {
                        c
                    } else {
                        t.ran_channels.unwrap_or(c)
                    },
                ))
            })
            .collect();
        best.insert(pin, at);
    }
    Ok(best)
}

/// The count that ran size `i` fastest in `timed` (counts ascending): a larger one is kept
/// only where it beats the smaller by [`MIN_GAIN`], so a tie keeps the smaller.
fn fastest(timed: &[(u32, Vec<ChannelTime>)], i: usize) -> Option<(u32, &ChannelTime)> {
    let mut best: Option<(u32, &ChannelTime)> = None;
    for (c, t) in timed {
        let Some(t) = t.get(i) else { continue };
        if best.is_none_or(|(_, f)| t.us < f.us * (1.0 - MIN_GAIN)) {
            best = Some((*c, t));
        }
    }
    best
}

/// What each line of [`table`] holds.
pub const HEADER: &str = "size pin | fastest count (NCCL ran) time | each count forced: time | \
                          NCCL's own choice: channels it ran, time, fastest pin's time over it";

/// One line per size of `pin`'s times at each forced count (`timed`, counts ascending), the
/// one [`sweep`] keeps, and NCCL's own choice at its own count (`own`, the same sizes) beside
/// it where it was timed.
pub fn table(
    sizes: &[u64],
    pin: Backend,
    timed: &[(u32, Vec<ChannelTime>)],
    own: Option<&[ChannelTime]>,
) -> Vec<String> {
    let ran = |t: &ChannelTime| t.ran_channels.map_or("?".into(), |c| c.to_string());
    sizes
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let best = fastest(timed, i);
            let each: Vec<String> = (timed.iter())
                .filter_map(|(c, t)| Some(format!("{c}:{:.1}", t.get(i)?.us)))
                .collect();
            let best_us = best.map(|(_, t)| t.us);
            let chosen = match best {
                Some((c, t)) => format!("{c} ({}) {:.1} us", ran(t), t.us),
                None => "no count ran".into(),
            };
            let reference = match (own.and_then(|o| o.get(i)), best_us) {
                (Some(o), Some(us)) => {
                    format!("{} ch {:.1} us, x{:.3}", ran(o), o.us, us / o.us)
                }
                (Some(o), None) => format!("{} ch {:.1} us", ran(o), o.us),
                (None, _) => "not timed".into(),
            };
            format!("{b} {pin} | {chosen} | {} | {reference}", each.join(" "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allreduce::Dtype;
    use crate::fabric::sim::SimFabric;
    use crate::fabric::Group;
    use crate::topology::presets;

    #[test]
    fn the_sweep_keeps_the_count_that_ran_fastest_per_pin_and_size() {
        let mut f = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let ready = [Backend::Nccl, Backend::NcclRingSimple];
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        f.prepare(&g, &ready).unwrap();
        let sizes: BTreeSet<u64> = [1 << 28].into();
        let best = sweep(&mut f, &ready, &sizes, Mode::Graph).unwrap();
        assert!(
            !best.contains_key(&Backend::Nccl),
            "NCCL's own choice is no pin"
        );
        // Two channels are held to C6's 22.2 GB/s; from four the links are full.
        let c = best[&Backend::NcclRingSimple][&(1 << 28)];
        assert_eq!(
            c, 4,
            "past four the links are full: no more channels than that"
        );
        let t = f
            .nccl_times_at_channels(Backend::NcclRingSimple, &[1 << 28], &[c, 2], Mode::Graph)
            .unwrap();
        assert!(t[0].1[0].us < 0.6 * t[1].1[0].us);
    }

    /// The count the fabric reports (the profile's `nccl_channels`, what the plugin sets) is
    /// the run-time count NCCL runs unforced: forcing it changes no time.
    #[test]
    fn the_reported_count_is_the_one_nccl_runs_unforced() {
        let mut f = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        f.prepare(&g, &[Backend::NcclRingSimple]).unwrap();
        let own = f.nccl_channels().unwrap();
        assert_eq!(own, 4, "the search's two channels run as four");
        for bytes in [1 << 16, 1 << 28] {
            let (fixed, added) = f.model_split(Backend::NcclRingSimple, bytes).unwrap();
            let forced = f
                .nccl_times_at_channels(Backend::NcclRingSimple, &[bytes], &[own], Mode::Graph)
                .unwrap()[0]
                .1[0]
                .us;
            assert!(
                (forced - (fixed + added)).abs() < 1e-9,
                "{forced} {fixed}+{added}"
            );
        }
    }

    /// The simulator as a fabric that reads back the channels NCCL ran (never more than two),
    /// answers only the counts it can run (`room`: none over it, as ranks sharing a GPU), and
    /// keeps the counts of each call, the pins of each call for several and the mode of each.
    /// A fabric that reads back NCCL running at most 2 channels of each count (within room
    /// for `.1`), the counts set per call where `.5`, as the tuner's switch sets them.
    struct ReadBack(
        SimFabric,
        u32,
        Vec<Vec<u32>>,
        Vec<Vec<Backend>>,
        Vec<Mode>,
        bool,
    );

    impl Fabric for ReadBack {
        fn info(&self) -> crate::fabric::FabricInfo {
            self.0.info()
        }
        fn topology(&self) -> &crate::topology::Topology {
            self.0.topology()
        }
        fn prepare(
            &mut self,
            g: &Group,
            b: &[Backend],
        ) -> Result<Vec<crate::fabric::Readiness>, crate::fabric::FabricError> {
            self.0.prepare(g, b)
        }
        fn verify(
            &mut self,
            b: Backend,
            n: u64,
            s: u64,
        ) -> Result<crate::fabric::Verification, crate::fabric::FabricError> {
            self.0.verify(b, n, s)
        }
        fn time(
            &mut self,
            b: Backend,
            n: u64,
            m: crate::fabric::Mode,
            batch: u32,
            samples: u32,
        ) -> Result<Vec<f64>, crate::fabric::FabricError> {
            self.0.time(b, n, m, batch, samples)
        }
        fn probe(
            &mut self,
            d: crate::fabric::Direction,
            p: usize,
            n: u64,
        ) -> Result<crate::fabric::ProbeSample, crate::fabric::FabricError> {
            self.0.probe(d, p, n)
        }
        fn orient(
            &mut self,
            d: &crate::fabric::Directions,
        ) -> Result<(), crate::fabric::FabricError> {
            self.0.orient(d)
        }
        fn release(&mut self) -> Result<(), crate::fabric::FabricError> {
            self.0.release()
        }
        fn nccl_times_at_channels(
            &mut self,
            b: Backend,
            sizes: &[u64],
            c: &[u32],
            mode: Mode,
        ) -> Result<Vec<(u32, Vec<crate::fabric::ChannelTime>)>, crate::fabric::FabricError>
        {
            self.2.push(c.to_vec());
            self.4.push(mode);
            let room: Vec<u32> = c.iter().copied().filter(|&c| c <= self.1).collect();
            let mut t = self.0.nccl_times_at_channels(b, sizes, &room, mode)?;
            for (c, t) in t.iter_mut() {
                for t in t.iter_mut() {
                    t.ran_channels = Some((*c).min(2));
                    t.per_call = self.5;
                }
            }
            Ok(t)
        }
        fn nccl_pins_at_channels(
            &mut self,
            pins: &[Backend],
            sizes: &[u64],
            c: &[u32],
            mode: Mode,
        ) -> Vec<crate::fabric::PinChannelTimes> {
            self.3.push(pins.to_vec());
            (pins.iter())
                .map(|&p| (p, self.nccl_times_at_channels(p, sizes, c, mode)))
                .collect()
        }
    }

    /// Where the fabric reads back what NCCL ran, the profile records that, not the count
    /// forced: four were fastest at 256 MiB, and NCCL ran two of them.
    #[test]
    fn the_count_recorded_is_the_one_nccl_ran_where_the_fabric_reads_it_back() {
        let sim = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let mut f = ReadBack(sim, 32, Vec::new(), Vec::new(), Vec::new(), false);
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        f.prepare(&g, &[Backend::NcclRingSimple]).unwrap();
        let sizes: BTreeSet<u64> = [1 << 28].into();
        let best = sweep(&mut f, &[Backend::NcclRingSimple], &sizes, Mode::Graph).unwrap();
        assert_eq!(best[&Backend::NcclRingSimple][&(1 << 28)], 2);
    }

    /// Where the count was set per call, as the plugin sets it, the profile records the count
    /// set: setting the count NCCL ran (two of the four) per call could run fewer still
    /// (NCCL 2.32.6 ran Tree/Simple 32K at 1 channel under a pin of 2, read back 2 with 16
    /// forced on the communicator; profiles/hardware/h100/2026-12-05-krank3).
    #[test]
    fn the_count_recorded_is_the_one_set_where_it_was_set_per_call() {
        let sim = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let mut f = ReadBack(sim, 32, Vec::new(), Vec::new(), Vec::new(), true);
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        f.prepare(&g, &[Backend::NcclRingSimple]).unwrap();
        let sizes: BTreeSet<u64> = [1 << 28].into();
        let best = sweep(&mut f, &[Backend::NcclRingSimple], &sizes, Mode::Graph).unwrap();
        assert_eq!(best[&Backend::NcclRingSimple][&(1 << 28)], 4);
    }

    /// One call for every pin and count (NCCL's own among them), and a count the fabric
    /// leaves out is not chosen: a 256 MiB ring was fastest at four channels, and where the
    /// fabric has room for two only, two it is.
    #[test]
    fn the_sweep_asks_once_per_pin_for_every_count_and_keeps_what_ran() {
        let sim = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let mut f = ReadBack(sim, 2, Vec::new(), Vec::new(), Vec::new(), false);
        let ready = [Backend::Nccl, Backend::NcclRingSimple, Backend::NcclRingLl];
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        f.prepare(&g, &ready).unwrap();
        let sizes: BTreeSet<u64> = [1 << 16, 1 << 28].into();
        let best = sweep(&mut f, &ready, &sizes, Mode::Graph).unwrap();
        // NCCL's own choice once at its own count (the table's reference), then one call per
        // pin with every count.
        let mut asked = vec![vec![0]];
        asked.extend(vec![vec![2, 4, 8, 16, 32]; 2]);
        assert_eq!(f.2, asked, "every pin at every count");
        let pins = vec![Backend::NcclRingSimple, Backend::NcclRingLl];
        assert_eq!(
            f.3,
            [pins],
            "one call for every pin: one start of a fabric's ranks"
        );
        assert_eq!(best[&Backend::NcclRingSimple][&(1 << 28)], 2);
        assert_eq!(best.len(), 2);
    }

    /// Every timing of a sweep runs in the mode it was asked for: the reference and each pin.
    #[test]
    fn the_sweep_times_every_count_in_the_mode_it_is_asked_for() {
        for mode in [Mode::Graph, Mode::Eager] {
            let sim = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
            let mut f = ReadBack(sim, 32, Vec::new(), Vec::new(), Vec::new(), false);
            let ready = [Backend::Nccl, Backend::NcclRingSimple, Backend::NcclRingLl];
            let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
            f.prepare(&g, &ready).unwrap();
            sweep(&mut f, &ready, &[1 << 16].into(), mode).unwrap();
            assert_eq!(f.4, vec![mode; 3], "the reference and both pins");
        }
    }

    /// Per size: the count kept (a larger one only where it gains more than 1%), what NCCL
    /// ran with it, every count's time, and NCCL's own choice beside it with the ratio.
    #[test]
    fn the_table_sets_each_pin_s_fastest_count_beside_nccl_s_own() {
        let t = |us, ran| ChannelTime {
            us,
            ran_channels: Some(ran),
            per_call: false,
        };
        let timed = [
            (2, vec![t(100.0, 2), t(50.0, 2)]),
            (4, vec![t(99.5, 4), t(40.0, 3)]),
            (8, vec![t(99.2, 8), t(45.0, 8)]),
        ];
        let own = [t(90.0, 1), t(60.0, 16)];
        let pin = Backend::NcclRingSimple;
        let lines = table(&[1024, 1 << 20], pin, &timed, Some(&own));
        assert_eq!(
            lines,
            [
                "1024 nccl_ring_simple | 2 (2) 100.0 us | 2:100.0 4:99.5 8:99.2 | 1 ch 90.0 us, \
                 x1.111",
                "1048576 nccl_ring_simple | 4 (3) 40.0 us | 2:50.0 4:40.0 8:45.0 | 16 ch 60.0 \
                 us, x0.667"
            ]
        );
        let alone = table(&[1024], pin, &timed[..1], None);
        assert_eq!(
            alone,
            ["1024 nccl_ring_simple | 2 (2) 100.0 us | 2:100.0 | not timed"]
        );
    }
}
