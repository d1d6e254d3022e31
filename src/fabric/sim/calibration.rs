//! The model's constants fitted on published figures, each with the calibration sources it is
//! fitted on, so a fit can leave one source out: docs/MODEL-ERROR.md's leave-one-source-out
//! table predicts every source from a model fitted without it (tests/sim_residuals.rs). Where
//! no other source informs a constant, the fit without its source falls back to what the model
//! would assume with no data at all, said per field.

/// A calibration source whose figures fit a constant: C1-C9 are shared/calibration's; R1-R6
/// are published sources found beside them (cited where their figures are used), which fit
/// no kernel or NCCL rate of the model (R1 stands in for C5 and C2 only in a fit that leaves
/// them out; R3 and R5 set how far C5's kernel factor is known to hold, `kernel_flows_reach`;
/// R1's, R2's and R5's four-GPU copy-engine all-to-alls set `copy_served_share`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    C1,
    C2,
    C5,
    C6,
    /// rtx6kpro hardware/wrx90-cpayne-2switch-flat.md: SGLang's start-up one-shot (a
    /// kernel pulling every peer's buffer) on 4 RTX PRO 6000 under one Microchip switch.
    R1,
    /// rtx6kpro hardware/asus-esc8000a-e13p-broadcom-switches.md: the same one-shot and NCCL
    /// on 8 RTX PRO 6000 behind Broadcom PEX890xx switches over two sockets, and on the 4 of
    /// one socket. Fits `copy_served_share` (its chip A's 12-flow all-to-all) only.
    R2,
    /// local-inference-lab/b12x#139: NCCL's all-reduce and an island reduce-scatter (artune's
    /// island two-shot, pulling in every phase) on 16 RTX PRO 6000 in four four-GPU islands
    /// under Microchip switches, each on its own root complex of one socket: the one kernel
    /// timing past C5's 12 flows per switch beside R5's. Fits `kernel_flows_reach` in a fit
    /// without R5, which reaches further; nothing beside it.
    R3,
    /// haohervchb/sglang-V100#2: a one-shot push in CUDA graphs on 4 V100 behind one PLX
    /// (Broadcom) Gen3 switch, 4 KB to 384 KB. Fits nothing: the one published push of the
    /// LL form's shape (no barrier behind its writes at 4 µs) on a box the model describes.
    R4,
    /// rtx6kpro hardware/pcie-bandwidth.md, "Custom Allreduce vs NCCL" (benchmarks/results.md:
    /// "luke's switches, 8 GPUs"): a one-shot pull (p2pmark --allreduce's output) and NCCL on
    /// 8 RTX PRO 6000 Max-Q under three Microchip switches, two partitioned leaves under one
    /// root switch (hardware/gpu-configs.md): 48 kernel flows through the root switch, 7 peers
    /// per GPU. Fits `kernel_flows_reach`, and with R1 and R2 `copy_served_share`.
    R5,
    /// local-inference-lab/b12x docs/evidence/pcie_calibration (its `overlap_probe`, f3fb62c8):
    /// NCCL's all-reduce, one eager call at a time, on 8 of 16 RTX PRO 6000 in two-GPU switch
    /// partitions, each on its own root port of one socket (its `nvidia-smi topo -m`: PIX in a
    /// pair, NODE across). Fits nothing.
    R6,
}

impl Source {
    pub const ALL: [Source; 10] = [
        Source::C1,
        Source::C2,
        Source::C5,
        Source::C6,
        Source::R1,
        Source::R2,
        Source::R3,
        Source::R4,
        Source::R5,
        Source::R6,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Source::C1 => "C1",
            Source::C2 => "C2",
            Source::C5 => "C5",
            Source::C6 => "C6",
            Source::R1 => "R1",
            Source::R2 => "R2",
            Source::R3 => "R3",
            Source::R4 => "R4",
            Source::R5 => "R5",
            Source::R6 => "R6",
        }
    }
}

/// Kernel loads and stores through peer mappings, GB/s as measured on a Gen5 x16 link whose
/// copy engine writes at [`COPY_PAIR_GBPS`] (C5: 4 GPUs under one switch, 16-byte accesses).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelRates {
    pub store_alone: f64,
    pub load_alone: f64,
    /// Per GPU with every rank driving all its peers at once.
    pub store_concurrent: f64,
    pub load_concurrent: f64,
    /// Distinct kernel flows through the switch in the concurrent case (4 GPUs × 3 peers).
    pub flows: u32,
}

/// C1: one pair of these GPUs writes at 56.2-56.3 GB/s with copy engines.
pub const COPY_PAIR_GBPS: f64 = 56.25;

/// C5's cudaIpcOpenMemHandle row.
const C5: KernelRates = KernelRates {
    store_alone: 44.78,
    load_alone: 42.83,
    store_concurrent: 25.40,
    load_concurrent: 20.60,
    flows: 12,
};

/// R1's one-shot pulls 3 peers' buffers: 24.6 µs at 64 KB and 37.6 at 120 KB, so 3 × 56 KB
/// more per GPU in 13.0 µs, 13.2 GB/s of loads per GPU with every rank pulling all peers
/// (12 flows, as C5's). R1 times no lone stream and no stores: a lone stream moves as a copy
/// engine does, and stores as loads (C3 says only that Microchip's are the faster).
const R1: KernelRates = KernelRates {
    store_alone: COPY_PAIR_GBPS,
    load_alone: COPY_PAIR_GBPS,
    store_concurrent: (120.0 - 64.0) * 1024.0 * 3.0 / (37.6 - 24.6) / 1e3,
    load_concurrent: (120.0 - 64.0) * 1024.0 * 3.0 / (37.6 - 24.6) / 1e3,
    flows: 12,
};

/// Four GPUs each copying with their 3 peers at once, GB/s in total, per source. p2pmark
/// 3c39f36's dense score (`All GPUs read all peers simultaneously`: each GPU's copy engines
/// read its 3 peers' 64 MB at once, each GPU's rate summed): R5's page ("p2pmark Scores (4
/// GPUs)": one c-payne switch, a Turin socket's root ports, two Broadcom partitions) and R1's
/// box (hardware/wrx90-cpayne-microchip-switches.md, GPUs 0-3; its flat rebuild,
/// hardware/wrx90-cpayne-2switch-flat.md, one switch). The pages' own 12-flow all-to-all
/// (direction unstated): R1's flat rebuild ("Multi-Flow Scaling", 148.9) and R2's chip A
/// ("Same-Chip Scaling", 153). p2pmark's single reader (test 2b: one GPU reading all 3 peers,
/// the others idle) moves 54 GB/s, the link's: the loss comes with a GPU's memory serving
/// three peers at once.
pub const SERVED_FOUR: [(Source, f64); 7] = [
    (Source::R5, 138.3),
    (Source::R5, 129.7),
    (Source::R5, 127.6),
    (Source::R1, 126.0),
    (Source::R1, 121.0),
    (Source::R1, 148.9),
    (Source::R2, 153.0),
];

/// The share of its port a GPU serves peer copies at with [`SERVED_FOUR`]'s three accessors:
/// the geometric mean of the figures of `has`'s sources, per GPU over [`COPY_PAIR_GBPS`]; with
/// none, 1 (no loss).
fn served_share(has: impl Fn(Source) -> bool) -> f64 {
    let logs: Vec<f64> = SERVED_FOUR
        .iter()
        .filter(|(s, _)| has(*s))
        .map(|(_, total)| (total / 4.0 / COPY_PAIR_GBPS).ln())
        .collect();
    if logs.is_empty() {
        return 1.0;
    }
    (logs.iter().sum::<f64>() / logs.len() as f64).exp()
}

/// The fitted constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Kernel traffic through a switch: C5; without it, R1's one-shot; with neither (None),
    /// kernel loads and stores move as copy engines do.
    pub kernel: Option<KernelRates>,
    /// What one NCCL channel moves over PCIe at most, GB/s on the wire. C6: NCCL's defaults
    /// on a dual-AMD box reach 22.2 GB/s busbw with the search's one channel run as two;
    /// without C6, C1's plateau of 46.1 GB/s over its four runtime channels.
    pub nccl_channel_gbps: f64,
    /// A kernel's prologue (block scheduling, loading arguments and peer pointers) on the
    /// GPU class the published one-shots ran on (RTX PRO 6000, sm_120; other classes:
    /// custom/fixed.rs), µs. With the barriers and read round trip of a one-shot it makes
    /// C2's 1 KB one-shot 7.5 µs (CUDA graphs). Without C2, R1's, the same start-up
    /// one-shot on 4 GPUs under a switch: 7.5 µs at 1 KB where the model without a prologue
    /// gives 5.28, so 2.2.
    pub kernel_prologue_us: f64,
    /// The forwarding peak of C1's switch (five Gen5 x16 ports) past which its capacity falls
    /// with the flows, GB/s: C1's 56 copy-engine pairs move 179 GB/s in total. Without C1,
    /// from C2's 56 flows pulling 184.6 GB/s through two socket fabrics of the same curve.
    pub forwarding_peak_gbps: f64,
    /// How many distinct kernel flows through one switch the concurrency factor is known to,
    /// flat past C5's 12 (the band extrapolates past it: `band::BandPart::width`). R5's
    /// one-shot on 8 GPUs puts 48 through its root switch (7 peers per GPU, 6 across it) and,
    /// with the factor flat, the model is 1.17-1.49x slow from 32 KB to 256 KB: the loss C5's
    /// slope would add from 24 to 48 flows (x0.76) would make it slower still, the wrong way.
    /// Without R5, R3's 24: its island reduce-scatter puts 24 through each switch and comes
    /// out 1.12-1.24x slow the same way. With neither, C5's 12.
    pub kernel_flows_reach: usize,
    /// The share of its port at which a GPU whose memory three or more peers' copy engines
    /// access at once (their reads of it, their writes into it) moves those bytes: 0.598 from
    /// [`SERVED_FOUR`]'s seven figures; without R1 0.608, without R2 0.585, without R5 0.607;
    /// with none of them, 1.
    pub copy_served_share: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration::fitted()
    }
}

impl Calibration {
    /// Fitted on every source.
    pub fn fitted() -> Calibration {
        Calibration::without(&[])
    }

    /// Fitted on every source but `left_out`.
    pub fn without(left_out: &[Source]) -> Calibration {
        let has = |s: Source| !left_out.contains(&s);
        Calibration {
            kernel: if has(Source::C5) {
                Some(C5)
            } else if has(Source::R1) {
                Some(R1)
            } else {
                None
            },
            nccl_channel_gbps: if has(Source::C6) {
                22.2 / 2.0
            } else if has(Source::C1) {
                46.1 / 4.0
            } else {
                COPY_PAIR_GBPS / 4.0
            },
            kernel_prologue_us: if has(Source::C2) {
                1.0
            } else if has(Source::R1) {
                2.2
            } else {
                0.0
            },
            kernel_flows_reach: if has(Source::R5) {
                48
            } else if has(Source::R3) {
                24
            } else {
                C5.flows as usize
            },
            forwarding_peak_gbps: if has(Source::C1) {
                300.0
            } else if has(Source::C2) {
                // The curve is linear in its peak past the knee: scale C1's by C2's ratio of
                // published to modelled aggregate (184.6 against 179.12 with C1's peak).
                300.0 * 184.6 / 179.12
            } else {
                300.0
            },
            copy_served_share: served_share(has),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaving_a_source_out_changes_only_what_it_fits() {
        let all = Calibration::fitted();
        assert_eq!(all.kernel, Some(C5));
        let no5 = Calibration::without(&[Source::C5]);
        assert_eq!(no5.kernel, Some(R1));
        assert!((R1.load_concurrent - 13.23).abs() < 0.01);
        let no_r1 = Calibration::without(&[Source::R1]);
        assert_eq!(
            Calibration {
                copy_served_share: all.copy_served_share,
                ..no_r1
            },
            all
        );
        assert_eq!(Calibration::without(&[Source::R4]), all);
        assert_eq!(Calibration::without(&[Source::R6]), all);
        assert_eq!(all.kernel_flows_reach, 48);
        assert_eq!(Calibration::without(&[Source::R5]).kernel_flows_reach, 24);
        assert_eq!(Calibration::without(&[Source::R3]), all);
        let no_reach = Calibration::without(&[Source::R3, Source::R5]);
        assert_eq!(no_reach.kernel_flows_reach, 12);
        assert_eq!(Calibration::without(&[Source::C5, Source::R1]).kernel, None);
        assert_eq!(no5.nccl_channel_gbps, all.nccl_channel_gbps);
        let no6 = Calibration::without(&[Source::C6]);
        assert!((no6.nccl_channel_gbps - 11.525).abs() < 1e-9);
        assert_eq!(Calibration::without(&[Source::C2]).kernel_prologue_us, 2.2);
        let neither = Calibration::without(&[Source::C2, Source::R1]);
        assert_eq!(neither.kernel_prologue_us, 0.0);
        assert!(Calibration::without(&[Source::C1]).forwarding_peak_gbps > 300.0);
        assert!((all.copy_served_share - 0.598).abs() < 0.001);
        let share = |left_out: &[Source]| Calibration::without(left_out).copy_served_share;
        assert!((no_r1.copy_served_share - 0.608).abs() < 0.001);
        assert!((share(&[Source::R2]) - 0.585).abs() < 0.001);
        assert!((share(&[Source::R5]) - 0.607).abs() < 0.001);
        assert_eq!(share(&[Source::R1, Source::R2, Source::R5]), 1.0);
    }
}
