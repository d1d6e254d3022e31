//! The custom kernels' schedules priced on the flow network: flows, phases, LL forms, staging.

use super::*;
use crate::topology::presets;

fn custom(preset: &str, gpus: &[usize]) -> Custom {
    let t = presets::get(preset).unwrap();
    Custom::new(&Net::build(&t), gpus, None)
}

#[test]
fn four_under_one_switch_load_at_c5_concurrent_rate() {
    // Each GPU loads from 3 peers at once, as kernel loads: C5's 20.6 GB/s per GPU (a
    // transaction limit, the same GB/s on the preset's 56.32 GB/s port), so 20.6 / 3.
    let c = custom("pcie-4x-1switch", &[0, 1, 2, 3]);
    let rate = 1.0 / (c.pattern(Peers::All).read_us_per_byte * 1e3);
    let want = 20.60 / 3.0;
    assert!((rate - want).abs() < 1e-6, "{rate} vs {want}");
}

#[test]
fn two_stage_phases_meet_the_same_contention_as_one_stage() {
    // The data part of a two-stage phase is exactly 1/N of a one-stage phase: the same
    // N(N−1) flows at the same per-byte cost.
    let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
    let (b, n) = (8.0 * 1024.0 * 1024.0, 8.0);
    let lat = c.pattern(Peers::All).max_latency_us;
    let one = c.transfer(Peers::All, b, Direction::Write) - lat;
    let two = c.transfer(Peers::All, b / n, Direction::Write) - lat;
    assert!((one / two - n).abs() < 1e-9, "{one} vs {two}");
}

#[test]
fn two_stage_moves_less_per_flow_than_one_stage() {
    let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
    let big = 8 << 20;
    assert!(
        c.time(Backend::TwoStagePull, big, None) < c.time(Backend::OneStagePull, big, None) / 2.0
    );
    // Tiny messages: the extra phase and barrier make two-stage's bandwidth form slower
    // (its LL form, which runs there, has no barrier between its phases).
    let bw = |b| c.price(&c.steps_as(b, None, 1024.0, None));
    assert!(bw(Backend::TwoStagePull) > bw(Backend::OneStagePull));
}

/// The 8 GPUs of pcie-8x-2switch in the two switch islands the plan derives.
fn two_switches() -> (Net, Vec<usize>, Islands) {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let gpus: Vec<usize> = (0..8).collect();
    let islands = crate::plan::islands(&t, &gpus).unwrap();
    (Net::build(&t), gpus, islands)
}

/// The links from GPU 0 to GPU 4 (the other switch) that no flow inside an island uses,
/// one direction each: what only the flows between the islands load (the root complex,
/// which carries both directions, is left to the tests that count it).
fn crossing_links(net: &Net, gpus: &[usize], islands: &Islands) -> Vec<usize> {
    let inside: std::collections::BTreeSet<usize> = pairs(gpus, Some(islands), Peers::Island)
        .into_iter()
        .flat_map(|(a, b)| net.route(a, b).resources)
        .collect();
    let across: Vec<usize> = net
        .route(0, 4)
        .resources
        .into_iter()
        .filter(|r| !inside.contains(r))
        .collect();
    assert!(!across.is_empty());
    across
}

/// The least any crossing link carries per byte of a `bytes` message in one call of `b`.
fn crossing(net: &Net, gpus: &[usize], islands: &Islands, b: Backend, bytes: u64) -> f64 {
    let load = link_bytes(net, gpus, islands, b, bytes);
    crossing_links(net, gpus, islands)
        .iter()
        .map(|&r| load[r] / bytes as f64)
        .fold(f64::INFINITY, f64::min)
}

/// Bytes each resource of the net carries in one call of `b` on `gpus` in `islands`, as
/// the model prices it.
fn link_bytes(net: &Net, gpus: &[usize], islands: &Islands, b: Backend, bytes: u64) -> Vec<f64> {
    let c = Custom::new(net, gpus, Some(islands));
    steps_load(net, gpus, islands, &c.steps(b, bytes, None))
}

/// Bytes each resource carries for `steps`: every transfer step's flows, each moving its
/// bytes on the wire, summed over the resources of its route.
fn steps_load(net: &Net, gpus: &[usize], islands: &Islands, steps: &[Step]) -> Vec<f64> {
    let mut load: Vec<f64> = Vec::new();
    for &step in steps {
        let Step::Transfer { peers, bytes, .. } = step else {
            continue;
        };
        for (src, dst) in pairs(gpus, Some(islands), peers) {
            for &r in &net.route(src, dst).resources {
                if load.len() <= r {
                    load.resize(r + 1, 0.0);
                }
                load[r] += bytes;
            }
        }
    }
    load
}

#[test]
fn the_crossing_carries_a_shard_per_gpu_not_every_pair() {
    // Two switches of four under one root complex (pcie-8x-2switch): the resources only
    // flows between the islands use are the switches' uplinks. Island two-shot sends each
    // GPU's island shard (S/4) to its one counterpart: S across in each direction, where a
    // ring sends 2(N-1)/N·S = 1.75·S through every link and the flat kernels more.
    let (net, gpus, islands) = two_switches();
    let crossing = |b: Backend| crossing(&net, &gpus, &islands, b, 8 << 20);
    assert_eq!(crossing(Backend::IslandTwoShot), 1.0);
    assert_eq!(crossing(Backend::IslandOneShot), 4.0);
    // Flat: every GPU with every GPU of the other island.
    assert_eq!(crossing(Backend::OneStagePull), 16.0);
    assert_eq!(crossing(Backend::TwoStagePull), 4.0);
}

#[test]
fn island_phases_price_their_own_flows() {
    // The counterpart phase has one flow per GPU across the uplink; the island phase
    // three per GPU inside its switch: each is solved alone, so neither sees the other's
    // contention, and the one-shot's across phase moves the whole message.
    let (net, gpus, islands) = two_switches();
    let c = Custom::new(&net, &gpus, Some(&islands));
    assert_eq!(c.pattern(Peers::Island).peers, 3);
    assert_eq!(c.pattern(Peers::Counterparts).peers, 1);
    let per_gpu = c.phase_bytes(Backend::IslandTwoShot, 8 << 20, None);
    let quarter = (2u64 << 20) as f64;
    assert_eq!(
        per_gpu,
        vec![
            (Peers::Island, 3.0 * quarter),
            (Peers::Counterparts, quarter),
            (Peers::Island, 3.0 * quarter)
        ]
    );
    // At large sizes the island schedule beats the flat one-stage kernel, whose every GPU
    // loads the whole message from 7 peers, 4 of them across the uplinks; at 1 KiB its
    // bandwidth form's extra phase costs latency.
    let read = Directions {
        inside: Direction::Read,
        across: Direction::Read,
        because: String::new(),
    };
    let big = 64 << 20;
    assert!(
        c.time(Backend::IslandTwoShot, big, Some(&read)) < c.time(Backend::OneStagePull, big, None)
    );
    let bw = |b, d| c.price(&c.steps_as(b, None, 1024.0, d));
    assert!(bw(Backend::IslandTwoShot, Some(&read)) > bw(Backend::OneStagePull, None));
}

#[test]
fn push_pays_the_local_reduce_pull_does_not() {
    // On one switch with equal read/write rates push would win by its one-way latency;
    // the reduce of N landed buffers costs it more at large sizes.
    let c = custom("nvswitch-8x", &[0, 1, 2, 3, 4, 5, 6, 7]);
    assert!(c.time(Backend::OneStagePush, 1024, None) < c.time(Backend::OneStagePull, 1024, None));
    assert!(
        c.time(Backend::OneStagePush, 64 << 20, None)
            > c.time(Backend::OneStagePull, 64 << 20, None)
    );
}

/// Every custom backend with the LL layout of its kernel, from the table.
fn with_ll() -> Vec<(Backend, Option<Ll>)> {
    crate::allreduce::TABLE
        .iter()
        .filter_map(|s| Some((s.backend, s.kernel?.ll)))
        .collect()
}

fn lined(steps: &[Step]) -> bool {
    steps
        .iter()
        .any(|s| matches!(s, Step::Transfer { lines: true, .. }))
}

#[test]
fn the_ll_form_runs_exactly_up_to_the_tables_limit() {
    let (net, gpus, islands) = two_switches();
    let c = Custom::new(&net, &gpus, Some(&islands));
    let mut seen = 0;
    for (b, ll) in with_ll() {
        let Some(ll) = ll else {
            // No LL kernel (one_stage_pull): the bandwidth form at every size.
            for bytes in [8, 1 << 10, 32 << 10, 64 << 10] {
                assert!(!lined(&c.steps(b, bytes, None)), "{b} at {bytes}");
            }
            continue;
        };
        seen += 1;
        let max = ll.max_bytes();
        for bytes in [8, 1 << 10, max] {
            let steps = c.steps(b, bytes, None);
            assert!(lined(&steps), "{b} at {bytes}: not LL");
            // Lines carry their flags: every phase in lines, no barrier, nothing staged.
            assert!(
                steps.iter().all(|s| match s {
                    Step::Transfer { lines, .. } => *lines,
                    Step::Local { pass, .. } => !pass,
                    Step::Barrier(_) => false,
                }),
                "{b} at {bytes}: {steps:?}"
            );
            assert_eq!(
                steps.len(),
                2 * b.phases().len(),
                "{b} at {bytes}: a transfer and its words per phase"
            );
        }
        assert!(!lined(&c.steps(b, max + 8, None)), "{b} past {max}");
    }
    assert_eq!(seen, 5, "every LL layout of the table");
}

#[test]
fn an_ll_phase_carries_twice_its_data_on_every_link() {
    // Two switches of four (pcie-8x-2switch), 8 KiB per GPU, within every LL limit: each
    // resource carries what the bandwidth form's flows carry, twice over where the phase
    // travels in lines (8 data bytes and 8 of flags per line).
    let (net, gpus, islands) = two_switches();
    let s = 8u64 << 10;
    let crossing = |b: Backend| crossing(&net, &gpus, &islands, b, s);
    // The bandwidth forms' crossings (the_crossing_carries_a_shard_per_gpu_not_every_pair)
    // doubled; one-stage pull has no LL form.
    assert_eq!(crossing(Backend::IslandTwoShot), 2.0);
    assert_eq!(crossing(Backend::IslandOneShot), 8.0);
    assert_eq!(crossing(Backend::OneStagePush), 32.0);
    assert_eq!(crossing(Backend::TwoStagePush), 8.0);
    assert_eq!(crossing(Backend::TwoStagePull), 8.0);
    assert_eq!(crossing(Backend::OneStagePull), 16.0);
    // Every link: an LL form carries exactly twice its bandwidth form's bytes.
    let c = Custom::new(&net, &gpus, Some(&islands));
    for (b, ll) in with_ll() {
        let Some(ll) = ll else {
            continue;
        };
        let load = |steps: Vec<Step>| steps_load(&net, &gpus, &islands, &steps);
        let lines = load(c.steps_as(b, Some(ll), s as f64, None));
        let data = load(c.steps_as(b, None, s as f64, None));
        assert!(data.iter().any(|&x| x > 0.0));
        for (r, (l, d)) in lines.iter().zip(&data).enumerate() {
            assert_eq!(*l, 2.0 * d, "{b}: resource {r}");
        }
    }
}

#[test]
fn kernels_stage_where_peers_read_the_input_or_write_the_output() {
    // A local copy of the message (read and written: 2·S) before the first barrier where
    // peers read the shared input, after the last where they wrote the shared output;
    // none in the LL forms, whose peers read and write only lines.
    let (net, gpus, islands) = two_switches();
    let c = Custom::new(&net, &gpus, Some(&islands));
    let (big, small) = (1u64 << 20, 4u64 << 10);
    let copy = |bytes: u64| Step::Local {
        bytes: 2.0 * bytes as f64,
        pass: true,
    };
    let first = |b, bytes, d| c.steps(b, bytes, d).first().copied();
    let last = |b, bytes, d| c.steps(b, bytes, d).last().copied();
    let dirs = |inside| Directions {
        inside,
        across: Direction::Read,
        because: String::new(),
    };
    let (pull, push) = (dirs(Direction::Read), dirs(Direction::Write));
    for b in [Backend::OneStagePull, Backend::TwoStagePull] {
        assert_eq!(first(b, big, None), Some(copy(big)), "{b}");
    }
    // One-stage pull has no LL form; two-stage pull's pulls lines.
    assert_eq!(first(Backend::OneStagePull, small, None), Some(copy(small)));
    assert_ne!(first(Backend::TwoStagePull, small, None), Some(copy(small)));
    for b in [Backend::IslandOneShot, Backend::IslandTwoShot] {
        assert_eq!(first(b, big, Some(&pull)), Some(copy(big)), "{b}");
        assert_ne!(first(b, big, Some(&push)), Some(copy(big)), "{b}");
        assert_ne!(first(b, small, Some(&pull)), Some(copy(small)), "{b} LL");
    }
    assert_eq!(last(Backend::TwoStagePush, big, None), Some(copy(big)));
    assert_eq!(
        last(Backend::IslandTwoShot, big, Some(&push)),
        Some(copy(big))
    );
    // island_one_shot's result is its own (it shares no output).
    assert_ne!(
        last(Backend::IslandOneShot, big, Some(&push)),
        Some(copy(big))
    );
    for (b, bytes) in [
        (Backend::OneStagePush, big),
        (Backend::OneStagePush, small),
        (Backend::TwoStagePush, small),
    ] {
        let steps = c.steps(b, bytes, None);
        assert!(!steps.contains(&copy(bytes)), "{b} at {bytes}");
    }
}

#[test]
fn two_stage_pull_ll_pulls_both_phases_in_lines() {
    // 4 KiB on 8 GPUs under two switches: the reduce-scatter and the all-gather each a
    // read round trip of a shard's lines (512 B of data, 1 KiB on the wire per flow), with
    // no staging copy and no barrier. In local memory the sender writes a line per peer
    // (each takes another shard) in the reduce-scatter and one for all in the all-gather,
    // beside the word it loads or stores.
    let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
    let shard = 512.0;
    let pat = c.pattern(Peers::All);
    let phase = 2.0 * pat.max_latency_us + 2.0 * shard * pat.read_us_per_byte;
    let local = |lines: f64| (lines * 2.0 * shard + shard) / (LOCAL_MEM_GBPS * 1e3);
    let want = c.prologue_us + 2.0 * phase + local(7.0) + local(1.0);
    let got = c.time(Backend::TwoStagePull, 4096, None);
    assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    // So it beats its bandwidth form by the staging copy and three barriers, less the
    // lines' second 4 KiB on the wire.
    assert!(got < c.price(&c.steps_as(Backend::TwoStagePull, None, 4096.0, None)));
}

#[test]
fn the_ll_form_saves_the_barriers_of_a_small_message() {
    // One-stage push at 1 KiB on two switches: the bandwidth form pays a barrier before and
    // after its stores; the LL form one crossing and a poll, with twice the bytes.
    let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
    let b = Backend::OneStagePush;
    let ll = c.price(&c.steps_as(b, Some(Ll::Message), 1024.0, None));
    let bw = c.price(&c.steps_as(b, None, 1024.0, None));
    assert!(ll < bw, "{ll} vs {bw}");
    assert_eq!(c.time(b, 1024, None), ll);
    // Two barriers and the reduce loop saved, a poll and 1 KiB more on the wire paid (and
    // a few hundredths of a µs of lines in local memory).
    let saved = 2.0 * c.barrier(Peers::All) + REDUCE_FIXED_US - FLAG_POLL_US;
    let lines = 1024.0 * c.pattern(Peers::All).write_us_per_byte;
    assert!((bw - ll - saved + lines).abs() < 0.05, "{bw} - {ll}");
}
