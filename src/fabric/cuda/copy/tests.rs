//! The executor's calls as data, run on a model of streams: each worker's stream executes its
//! steps in order, the workers interleave at random, a wait holds its stream until its word
//! equals the value, and the same steps are replayed call after call, as a CUDA graph replays
//! them. Every rank must end every call with that call's sum.

use std::collections::HashMap;
use std::ops::Range;

use super::steps::{self, inbox, Addrs, Enqueue, Step, StepError, ARRIVED, BARRIERS, ONE};
use super::*;
use crate::fabric::cuda::copy_plan::tests::{copy_engine_backends, GROUPS};
use crate::fabric::cuda::layout::SIGNAL_STATUS_OFFSET;

const SRC: u64 = 1;
const DST: u64 = 2;
const INPUT: u64 = 3;
const SCRATCH: u64 = 4;
const SIG: u64 = 5;

fn base(rank: usize, kind: u64) -> u64 {
    ((rank as u64 + 1) << 36) | (kind << 32)
}

/// Buffers of fp32 elements at made-up addresses, one region per rank and kind.
fn fake(call: &Call) -> Addrs {
    addrs(call, &fake_args(call))
}

fn fake_args(call: &Call) -> ArArgs {
    let mut args = ArArgs::default();
    for r in 0..call.ranks.n {
        args.src[r] = base(r, SRC);
        args.dst[r] = base(r, DST);
        args.input[r] = base(r, INPUT);
        args.scratch[r] = base(r, SCRATCH);
        args.sig[r] = base(r, SIG);
    }
    args
}

fn value(rank: usize, call: usize, i: u64) -> f32 {
    ((i * 7 + rank as u64 * 13 + call as u64 * 5) % 97 + 1) as f32
}

/// What a stream of the model does: a step, or (the host, in stream order) a rank's input
/// for a call written, or its output for a call read.
#[derive(Debug, Clone)]
enum Action {
    Fill(usize, usize),
    Run(Step),
    Snap(usize, usize),
}

#[derive(Default)]
struct Memory {
    words: HashMap<u64, u32>,
}

impl Memory {
    fn read(&self, a: u64) -> u32 {
        let flags = (a >> 32) & 0xf == SIG;
        let unset = if flags { 0 } else { f32::NAN.to_bits() };
        *self.words.get(&a).unwrap_or(&unset)
    }

    /// Runs one step; false where it is a wait not yet met.
    fn run(&mut self, s: &Step) -> bool {
        match s {
            Step::Copy { dst, src, bytes } => {
                for i in (0..*bytes).step_by(4) {
                    let w = self.read(src + i);
                    self.words.insert(dst + i, w);
                }
            }
            Step::Sum { inputs, out, elems } => {
                for i in 0..*elems {
                    let acc: f32 = inputs
                        .iter()
                        .map(|a| f32::from_bits(self.read(a + 4 * i)))
                        .sum();
                    self.words.insert(out + 4 * i, acc.to_bits());
                }
            }
            Step::WaitEq { addr, value } => return self.read(*addr) == *value,
            Step::Write { addr, value } => {
                self.words.insert(*addr, *value);
            }
            Step::Guard { status, out, elems } => {
                if self.read(*status) != 0 {
                    for i in 0..*elems {
                        self.words.insert(out + 4 * i, f32::NAN.to_bits());
                    }
                }
            }
        }
        true
    }
}

/// A small deterministic generator, so a failing interleaving can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below as u64) as usize
    }
}

/// Runs `calls` calls of `call.backend` with the ranks split among workers `workers`, each
/// replaying the steps `edit` leaves of its call; returns each rank's output of each call
/// where it is not the sum, or that the streams stopped.
fn replay(
    call: &Call,
    workers: &[Range<usize>],
    calls: usize,
    seed: u64,
    edit: impl Fn(Vec<Step>) -> Vec<Step>,
) -> Result<Memory, String> {
    let addrs = fake(call);
    let plan = copy_plan::plan(call.backend, call.ranks, call.elems);
    let queues: Vec<Vec<Action>> = workers
        .iter()
        .map(|local| {
            let mine: Vec<usize> = local.clone().collect();
            let s = edit(steps::steps(&plan, call.ranks, call.elems, &mine, &addrs).unwrap());
            (0..calls)
                .flat_map(|c| {
                    let fill = local.clone().map(move |r| Action::Fill(r, c));
                    let snap = local.clone().map(move |r| Action::Snap(r, c));
                    fill.chain(s.iter().cloned().map(Action::Run)).chain(snap)
                })
                .collect()
        })
        .collect();
    let mut mem = Memory::default();
    let mut pos = vec![0; queues.len()];
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let elems = call.elems;
    loop {
        let live: Vec<usize> = (0..queues.len())
            .filter(|&w| pos[w] < queues[w].len())
            .collect();
        if live.is_empty() {
            return Ok(mem);
        }
        let first = rng.next(live.len());
        let mut moved = false;
        for k in 0..live.len() {
            let w = live[(first + k) % live.len()];
            for _ in 0..1 + rng.next(4) {
                let Some(a) = queues[w].get(pos[w]) else {
                    break;
                };
                match a {
                    Action::Fill(r, c) => {
                        for i in 0..elems {
                            let v = value(*r, *c, i).to_bits();
                            mem.words.insert(base(*r, SRC) + 4 * i, v);
                        }
                    }
                    Action::Run(s) if !mem.run(s) => break,
                    Action::Run(_) => {}
                    Action::Snap(r, c) => {
                        for i in 0..elems {
                            let want: f32 = (0..call.ranks.n).map(|p| value(p, *c, i)).sum();
                            let got = f32::from_bits(mem.read(base(*r, DST) + 4 * i));
                            if got != want {
                                return Err(format!(
                                    "call {c}: rank {r} element {i} is {got}, the sum {want}"
                                ));
                            }
                        }
                    }
                }
                pos[w] += 1;
                moved = true;
            }
            if moved {
                break;
            }
        }
        if !moved {
            return Err(format!("every stream waits (at {pos:?})"));
        }
    }
}

fn call(backend: Backend, ranks: Ranks, elems: u64) -> Call {
    Call {
        backend,
        dtype: Dtype::Fp32,
        elems,
        ranks,
        local: 0..ranks.n,
        max_bytes: elems * 4,
        absent: None,
        watch: None,
    }
}

/// Loopback (one worker, every rank on its stream), a worker per rank, two ranks a worker.
fn layouts(n: usize) -> Vec<Vec<Range<usize>>> {
    vec![
        vec![0..n],
        (0..n).map(|r| r..r + 1).collect(),
        (0..n).step_by(2).map(|r| r..r + 2).collect(),
    ]
}

#[test]
fn replayed_calls_end_with_their_sums_in_any_interleaving_and_leave_flags_clear() {
    let backends = copy_engine_backends();
    assert_eq!(backends.len(), 2);
    for b in backends {
        for ranks in GROUPS {
            if b.is_hierarchical() == (ranks.island == ranks.n) {
                continue;
            }
            for elems in [1, 7, 1000] {
                let c = call(b, ranks, elems);
                for workers in layouts(ranks.n) {
                    for seed in 0..8 {
                        let mem = replay(&c, &workers, 3, seed, |s| s).unwrap_or_else(|e| {
                            panic!("{b} {ranks:?} {elems} elements {workers:?} seed {seed}: {e}")
                        });
                        for r in 0..ranks.n {
                            for bar in 0..BARRIERS {
                                for from in 0..ranks.n {
                                    let w = mem.read(base(r, SIG) + inbox(bar, from));
                                    assert_eq!(w, 0, "{b}: rank {r} barrier {bar} from {from}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_replay_without_clearing_its_flags_lets_a_rank_read_a_stale_peer() {
    // Without the clears, the second call's waits pass at once: some rank copies a peer's
    // share before the peer wrote that call's input.
    let c = call(Backend::TwoStageCopy, Ranks::flat(4), 64);
    let workers: Vec<_> = (0..4).map(|r| r..r + 1).collect();
    let unclear = |s: Vec<Step>| {
        s.into_iter()
            .filter(|s| !matches!(s, Step::Write { value: 0, .. }))
            .collect()
    };
    let failed = (0..32).filter(|&seed| replay(&c, &workers, 3, seed, unclear).is_err());
    assert!(failed.count() > 0);
    for seed in 0..32 {
        replay(&c, &workers, 3, seed, |s| s).unwrap();
    }
}

#[test]
fn a_barrier_without_its_signals_stops_every_stream() {
    let c = call(Backend::IslandTwoShotCopy, Ranks { n: 4, island: 2 }, 16);
    let silent = |s: Vec<Step>| {
        s.into_iter()
            .filter(|s| !matches!(s, Step::Copy { bytes: 4, .. }))
            .collect()
    };
    let e = replay(&c, &layouts(4)[1], 1, 0, silent).err().unwrap();
    assert!(e.contains("every stream waits"), "{e}");
}

/// Records what [`steps::enqueue`] asks of the driver.
#[derive(Default)]
struct Recorder {
    calls: Vec<String>,
}

impl Enqueue for Recorder {
    type Error = String;
    unsafe fn copy(&mut self, dst: u64, src: u64, bytes: u64) -> Result<(), String> {
        self.calls.push(format!("copy {dst:x} {src:x} {bytes}"));
        Ok(())
    }
    unsafe fn sum(&mut self, inputs: &[u64], out: u64, elems: u64) -> Result<(), String> {
        self.calls
            .push(format!("sum {} -> {out:x} {elems}", inputs.len()));
        Ok(())
    }
    unsafe fn wait_eq(&mut self, addr: u64, value: u32) -> Result<(), String> {
        self.calls.push(format!("wait {addr:x} == {value}"));
        Ok(())
    }
    unsafe fn write(&mut self, addr: u64, value: u32) -> Result<(), String> {
        self.calls.push(format!("write {addr:x} = {value}"));
        Ok(())
    }
    unsafe fn guard(&mut self, status: u64, out: u64, elems: u64) -> Result<(), String> {
        self.calls
            .push(format!("guard {status:x} -> {out:x} {elems}"));
        Ok(())
    }
}

#[test]
fn a_rank_of_two_stage_copy_queues_its_copies_sum_and_flags_in_order() {
    let ranks = Ranks::flat(2);
    let mut c = call(Backend::TwoStageCopy, ranks, 1000);
    c.local = 1..2;
    let s = steps::steps(
        &copy_plan::plan(c.backend, ranks, c.elems),
        ranks,
        c.elems,
        &[1],
        &fake(&c),
    )
    .unwrap();
    let mut q = Recorder::default();
    // SAFETY: the recorder touches no memory.
    unsafe { steps::enqueue(&s, &mut q) }.unwrap();
    let (me, peer) = (base(1, SIG), base(0, SIG));
    let signal = |b| format!("copy {:x} {:x} 4", peer + inbox(b, 1), me + ONE);
    let wait = |b| {
        [
            format!("wait {:x} == {ARRIVED}", me + inbox(b, 0)),
            format!("write {:x} = 0", me + inbox(b, 0)),
        ]
    };
    let shard = 500 * 4;
    let slot = base(1, SCRATCH);
    let out = slot + kernels::scratch_entries(c.backend, c.max_bytes, ranks)[1].0;
    let mut want = vec![
        format!("write {:x} = {ARRIVED}", me + ONE),
        format!("copy {:x} {:x} 4000", base(1, INPUT), base(1, SRC)),
        signal(0),
    ];
    want.extend(wait(0));
    want.extend([
        format!("copy {slot:x} {:x} {shard}", base(0, INPUT) + shard),
        format!("sum 2 -> {out:x} 500"),
        signal(1),
    ]);
    want.extend(wait(1));
    want.extend([
        format!(
            "copy {:x} {:x} {shard}",
            base(1, DST),
            base(0, SCRATCH) + out - slot
        ),
        format!("copy {:x} {out:x} {shard}", base(1, DST) + shard),
        signal(2),
    ]);
    want.extend(wait(2));
    let status = me + SIGNAL_STATUS_OFFSET as u64;
    want.push(format!("guard {status:x} -> {:x} 1000", base(1, DST)));
    assert_eq!(q.calls, want);
}

#[test]
fn every_copy_and_sum_stays_inside_the_buffers_setup_allocates() {
    for b in copy_engine_backends() {
        for ranks in GROUPS {
            if b.is_hierarchical() == (ranks.island == ranks.n) {
                continue;
            }
            let max = 4099 * 4;
            let c = call(b, ranks, 4099);
            let scratch = kernels::scratch_bytes(b, max, ranks);
            let sizes = [(SRC, max), (DST, max), (INPUT, max), (SCRATCH, scratch)];
            let inside = |a: u64, len: u64| {
                let kind = (a >> 32) & 0xf;
                let off = a & 0xffff_ffff;
                let (_, size) = sizes.iter().find(|(k, _)| *k == kind).unwrap();
                assert!(
                    off + len <= *size,
                    "{b} {ranks:?}: {kind} {off}+{len} of {size}"
                );
            };
            let all: Vec<usize> = (0..ranks.n).collect();
            let s = steps::steps(
                &copy_plan::plan(b, ranks, 4099),
                ranks,
                4099,
                &all,
                &fake(&c),
            );
            for step in s.unwrap() {
                match step {
                    Step::Copy { bytes: 4, .. } | Step::WaitEq { .. } | Step::Write { .. } => {}
                    Step::Copy { dst, src, bytes } => {
                        inside(dst, bytes);
                        inside(src, bytes);
                    }
                    Step::Sum { inputs, out, elems } => {
                        inside(out, elems * 4);
                        inputs.iter().for_each(|&a| inside(a, elems * 4));
                    }
                    Step::Guard { out, elems, .. } => inside(out, elems * 4),
                }
            }
        }
    }
}

#[test]
fn a_rank_whose_buffers_are_not_mapped_is_refused_before_anything_is_queued() {
    let ranks = Ranks::flat(4);
    let c = call(Backend::TwoStageCopy, ranks, 100);
    let mut a = fake(&c);
    a.input[2] = 0;
    let e = steps::steps(
        &copy_plan::plan(c.backend, ranks, 100),
        ranks,
        100,
        &[0],
        &a,
    );
    assert_eq!(
        e.unwrap_err(),
        StepError::Unmapped {
            rank: 2,
            buf: copy_plan::Buf::Input
        }
    );
}

#[test]
fn the_executor_is_on_unless_switched_off() {
    assert_eq!(runs(), std::env::var(SWITCH).as_deref() != Ok("0"));
    assert!(SWITCHED_OFF.contains(SWITCH));
}

#[test]
fn a_worker_whose_peers_never_arrive_runs_through_once_its_inboxes_are_released() {
    // Worker 0 alone, its peers' streams never run: it stops at its first wait until the host
    // writes every inbox slot, as `recover` does after a timeout.
    for (b, ranks) in [
        (Backend::TwoStageCopy, Ranks::flat(4)),
        (Backend::IslandTwoShotCopy, Ranks { n: 8, island: 2 }),
    ] {
        let c = call(b, ranks, 64);
        let a = fake(&c);
        let plan = copy_plan::plan(b, ranks, 64);
        let s = steps::steps(&plan, ranks, 64, &[0, 1], &a).unwrap();
        let run = |mem: &mut Memory| s.iter().all(|s| mem.run(s));
        assert!(!run(&mut Memory::default()), "{b}: ran without its peers");
        let mut mem = Memory::default();
        for r in 0..2 {
            for (k, w) in steps::released().chunks(4).enumerate() {
                let word = u32::from_le_bytes(w.try_into().unwrap());
                mem.words.insert(base(r, SIG) + 4 * k as u64, word);
            }
        }
        // Each wait clears its slot, so a call needs its inboxes released once.
        assert!(run(&mut mem), "{b}: a wait outlives the release");
    }
}

#[test]
fn an_absent_rank_queues_nothing_and_the_others_wait_on_it() {
    // The fault knob's peer that never arrives: rank 1's calls are left out of the stream,
    // so ranks 0, 2 and 3, which share it, stop at their first wait on rank 1.
    let ranks = Ranks::flat(4);
    let mut c = call(Backend::TwoStageCopy, ranks, 64);
    c.absent = Some(1);
    let s = call_steps(&c, &fake_args(&c)).unwrap();
    let rank_of = |a: u64| (a >> 36) as usize - 1;
    for step in &s {
        match step {
            Step::Write { addr, .. } | Step::WaitEq { addr, .. } => assert_ne!(rank_of(*addr), 1),
            Step::Guard { out, .. } => assert_ne!(rank_of(*out), 1),
            Step::Copy { dst, .. } | Step::Sum { out: dst, .. } => {
                assert!(rank_of(*dst) != 1 || matches!(step, Step::Copy { bytes: 4, .. }))
            }
        }
    }
    let mut mem = Memory::default();
    let stopped = s.iter().position(|s| !mem.run(s)).unwrap();
    assert_eq!(
        s[stopped],
        Step::WaitEq {
            addr: base(0, SIG) + inbox(0, 1),
            value: ARRIVED
        }
    );
}

/// Writes rank `r`'s words as the watchdog releases them: its status (where `status`), then
/// every inbox slot.
fn release(mem: &mut Memory, r: usize, status: bool) {
    if status {
        mem.words
            .insert(base(r, SIG) + SIGNAL_STATUS_OFFSET as u64, 1);
    }
    for (k, w) in steps::released().chunks(4).enumerate() {
        let word = u32::from_le_bytes(w.try_into().unwrap());
        mem.words.insert(base(r, SIG) + 4 * k as u64, word);
    }
}

#[test]
fn a_released_call_is_nan_where_without_its_guard_it_sums_stale_shards() {
    // A healthy call of all four ranks, then one whose ranks 2 and 3 never arrive: ranks 0
    // and 1, released from the host, pass their waits with the shards ranks 2 and 3 left in
    // the first call. Released alone that is a wrong sum that looks right; released as the
    // watchdog does (the status first), every element is NaN.
    for (b, ranks) in [
        (Backend::TwoStageCopy, Ranks::flat(4)),
        (Backend::IslandTwoShotCopy, Ranks { n: 4, island: 2 }),
    ] {
        let c = call(b, ranks, 64);
        let a = fake(&c);
        let plan = copy_plan::plan(b, ranks, 64);
        let all = steps::steps(&plan, ranks, 64, &[0, 1, 2, 3], &a).unwrap();
        let two = steps::steps(&plan, ranks, 64, &[0, 1], &a).unwrap();
        for status in [false, true] {
            let mut mem = Memory::default();
            let fill = |mem: &mut Memory, call: usize| {
                for r in 0..4 {
                    for i in 0..64 {
                        let v = value(r, call, i).to_bits();
                        mem.words.insert(base(r, SRC) + 4 * i, v);
                    }
                }
            };
            fill(&mut mem, 0);
            assert!(all.iter().all(|s| mem.run(s)), "{b}: a healthy call waits");
            fill(&mut mem, 1);
            assert!(
                !two.iter().all(|s| mem.run(s)),
                "{b}: ran without its peers"
            );
            let mut mem2 = Memory::default();
            fill(&mut mem2, 0);
            assert!(all.iter().all(|s| mem2.run(s)));
            fill(&mut mem2, 1);
            release(&mut mem2, 0, status);
            release(&mut mem2, 1, status);
            assert!(
                two.iter().all(|s| mem2.run(s)),
                "{b}: a wait outlives the release"
            );
            for r in 0..2 {
                let out: Vec<f32> = (0..64)
                    .map(|i| f32::from_bits(mem2.read(base(r, DST) + 4 * i)))
                    .collect();
                if status {
                    assert!(out.iter().all(|v| v.is_nan()), "{b}: rank {r} {out:?}");
                } else {
                    let want: Vec<f32> = (0..64)
                        .map(|i| (0..4).map(|p| value(p, 1, i)).sum())
                        .collect();
                    assert!(out.iter().all(|v| v.is_finite()), "{b}: rank {r} {out:?}");
                    assert_ne!(out, want, "{b}: rank {r}");
                }
            }
        }
    }
}

#[test]
fn calls_marked_for_the_watchdog_still_sum_and_end_outside_with_the_beat_clear() {
    let w = watch::Words {
        inside: base(9, SIG) + 0x100,
        beat: base(9, SIG) + 0x200,
    };
    let c = call(Backend::TwoStageCopy, Ranks::flat(4), 100);
    for seed in 0..8 {
        let mem = replay(&c, &layouts(4)[1], 3, seed, |s| w.around(s)).unwrap();
        assert_eq!((mem.read(w.inside), mem.read(w.beat)), (0, 0));
    }
}

#[test]
fn a_group_missing_a_rank_ends_all_nan_on_every_other_rank_and_never_hangs() {
    // A stream per rank, rank `gone` never runs. Whenever every stream waits, a rank waiting
    // is released as the op's watchdog does it (every rank's status, then its own inboxes),
    // after a healthy call that left each rank's buffers holding its numbers.
    for b in copy_engine_backends() {
        for ranks in GROUPS {
            if b.is_hierarchical() == (ranks.island == ranks.n) {
                continue;
            }
            let (n, elems) = (ranks.n, 16);
            let c = call(b, ranks, elems);
            let a = fake(&c);
            let plan = copy_plan::plan(b, ranks, elems);
            let fill = |mem: &mut Memory, call: usize| {
                for r in 0..n {
                    for i in 0..elems {
                        mem.words
                            .insert(base(r, SRC) + 4 * i, value(r, call, i).to_bits());
                    }
                }
            };
            let all: Vec<usize> = (0..n).collect();
            let healthy = steps::steps(&plan, ranks, elems, &all, &a).unwrap();
            for gone in 0..n {
                let mut mem = Memory::default();
                fill(&mut mem, 0);
                assert!(healthy.iter().all(|s| mem.run(s)));
                fill(&mut mem, 1);
                let streams: Vec<Vec<Step>> = (0..n)
                    .map(|r| match r == gone {
                        true => Vec::new(),
                        false => steps::steps(&plan, ranks, elems, &[r], &a).unwrap(),
                    })
                    .collect();
                let mut pos = vec![0; n];
                for releases in 0.. {
                    assert!(
                        releases <= n,
                        "{b} {ranks:?} without {gone}: a stream hangs"
                    );
                    let mut moved = true;
                    while moved {
                        moved = false;
                        for r in 0..n {
                            while pos[r] < streams[r].len() && mem.run(&streams[r][pos[r]]) {
                                pos[r] += 1;
                                moved = true;
                            }
                        }
                    }
                    // Ranks waiting on the gone one first: a rank waiting on a released peer
                    // goes on before its own deadline.
                    let waits = |r: usize| match streams[r].get(pos[r]) {
                        Some(Step::WaitEq { addr, .. }) => Some(*addr),
                        _ => None,
                    };
                    let on_gone = |r: usize| {
                        (0..BARRIERS).any(|b| waits(r) == Some(base(r, SIG) + inbox(b, gone)))
                    };
                    let blocked = |r: usize| pos[r] < streams[r].len();
                    let Some(stuck) = (0..n)
                        .find(|&r| blocked(r) && on_gone(r))
                        .or_else(|| (0..n).find(|&r| blocked(r)))
                    else {
                        break;
                    };
                    for p in 0..n {
                        mem.words
                            .insert(base(p, SIG) + SIGNAL_STATUS_OFFSET as u64, 1);
                    }
                    release(&mut mem, stuck, false);
                }
                for r in (0..n).filter(|&r| r != gone) {
                    for i in 0..elems {
                        let v = f32::from_bits(mem.read(base(r, DST) + 4 * i));
                        assert!(
                            v.is_nan(),
                            "{b} {ranks:?} without {gone}: rank {r}[{i}] {v}"
                        );
                    }
                }
            }
        }
    }
}
