//! The CSV NCCL's example tuner plugin reads from `NCCL_TUNER_CONFIG_FILE` (NVIDIA/nccl
//! `ext-tuner/example`): `collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,
//! nRanks`, bounds inclusive, first matching row wins, `#` lines skipped, lines read 255
//! characters at a time (so every line here stays shorter).

use super::*;
use crate::allreduce::{NcclAlgo, NcclProto};

/// One contiguous byte range and the NCCL variant for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Row {
    pub min: u64,
    pub max: u64,
    pub algo: NcclAlgo,
    pub proto: NcclProto,
}

/// Rows covering 0..=u64::MAX for one group: the fastest pinned NCCL variant measured at each
/// size (even where it only ties NCCL's own choice, since any matching row forces a choice),
/// merged where neighbours agree. The last measured
/// size's choice is extended to every larger size (flagged by the caller). A bucket with no
/// pinned NCCL measurement leaves a gap, returned in `gaps`.
pub(super) fn rows(g: &GroupProfile) -> (Vec<Row>, Vec<(u64, u64)>) {
    let pinned: Vec<Backend> = Backend::ALL
        .into_iter()
        .filter(|b| b.nccl_pin().is_some())
        .collect();
    let mut rows: Vec<Row> = Vec::new();
    let mut gaps = Vec::new();
    let mut lo = 0u64;
    for b in &g.buckets {
        match fastest(b, &pinned).and_then(|(x, _)| x.nccl_pin()) {
            Some((algo, proto)) => match rows.last_mut() {
                Some(r) if r.max + 1 == lo && r.algo == algo && r.proto == proto => r.max = b.bytes,
                _ => rows.push(Row {
                    min: lo,
                    max: b.bytes,
                    algo,
                    proto,
                }),
            },
            None => gaps.push((lo, b.bytes)),
        }
        lo = b.bytes + 1;
    }
    if let Some(r) = rows.last_mut() {
        if r.max == g.buckets.last().map_or(0, |b| b.bytes) {
            r.max = u64::MAX;
        }
    }
    (rows, gaps)
}

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let mut s = String::new();
    s.push_str("# NCCL tuner configuration for NCCL's example tuner plugin (NVIDIA/nccl ext-tuner/example).\n");
    s.push_str("# Load it with NCCL_TUNER_PLUGIN=<libnccl-tuner-example.so> NCCL_TUNER_CONFIG_FILE=<this file>.\n");
    s.push_str("# Columns: collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks (bounds inclusive).\n");
    s.push_str(&provenance(p, o, "#"));
    s.push_str("#\n# Prefer artune's own plugin: it reads the profile itself and sets a channel count only\n# where it steers NCCL and the profile records the count its NCCL measurements ran with:\n");
    s.push_str(&format!(
        "#   export NCCL_TUNER_PLUGIN=/path/to/libartune.so ARTUNE_PROFILE={}\n",
        shell_quote(&o.source)
    ));
    s.push_str("#\n# What this file cannot express:\n");
    s.push_str("# - Channel counts. The profile records none, so every row says -1. The example plugin as read\n");
    s.push_str("#   (plugin.c, pluginGetCollInfo) sets *nChannels = 1 before matching and only overrides it with a\n");
    s.push_str("#   row's positive count, so with this plugin every allreduce runs on ONE channel, -1 included.\n");
    s.push_str("# - Custom peer-to-peer kernels (one/two-stage): NCCL cannot run them; rows give the fastest\n");
    s.push_str(
        "#   NCCL algorithm/protocol measured at each size, whatever the profile chose overall.\n",
    );
    s.push_str("# - Launch mode: a tuner cannot tell CUDA-graph capture from eager launches; rows follow the\n");
    s.push_str("#   graph-mode measurements where the profile has them.\n");
    s.push_str("# - Sizes above the largest measured size: the last measured choice is extended to them (not measured).\n");
    let mut uniform: Vec<(usize, NcclAlgo, NcclProto)> = Vec::new();
    let mut body = String::new();
    for &tp in tps {
        let Some(g) = preferred_group(p, tp) else {
            continue;
        };
        let (rows, gaps) = rows(g);
        body.push_str(&format!(
            "#\n# TP{tp} ({} mode, GPUs {:?}), nNodes=1 nRanks={tp}\n",
            g.mode.id(),
            g.gpus
        ));
        for (lo, hi) in &gaps {
            body.push_str(&format!(
                "# - no pinned NCCL variant was measured for {lo}..{hi} bytes: that range is not covered\n"
            ));
        }
        for r in &rows {
            body.push_str(&format!(
                "allreduce,{},{},{},{},-1,1,{tp}\n",
                r.min,
                r.max,
                r.algo.name().to_ascii_lowercase(),
                r.proto.name().to_ascii_lowercase()
            ));
        }
        if let ([r], true) = (rows.as_slice(), gaps.is_empty()) {
            uniform.push((tp, r.algo, r.proto));
        }
    }
    s.push_str("#\n# Environment alternative (applies to every collective, not just allreduce):\n");
    if uniform.is_empty() {
        s.push_str("#   none: no TP size keeps one NCCL algorithm and protocol across all measured sizes.\n");
    }
    for (tp, a, pr) in &uniform {
        s.push_str(&format!(
            "#   TP{tp}: one choice holds for all sizes: NCCL_ALGO={} NCCL_PROTO={}\n",
            a.name(),
            pr.name()
        ));
    }
    s.push_str(&body);
    Ok(Export {
        files: vec![File {
            name: "nccl_tuner.conf".into(),
            contents: s,
        }],
    })
}
