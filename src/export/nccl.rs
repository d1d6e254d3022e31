//! NCCL, steered by artune's own tuner plugin (`libartune.so`, symbols `ncclTunerPlugin_v3` ..
//! `_v7`): it reads the profile and, per allreduce, makes NCCL run the variant recorded in
//! each bucket's `nccl_choice` (the steering rule's answer), leaving NCCL's own choice wherever
//! that is `nccl` or the profile has no answer.
//!
//! No CSV for NCCL's example tuner plugin (NVIDIA/nccl plugins/tuner/example/plugin.c since
//! 2.29, ext-tuner/example before; commit 56a0c2299d0f read): its pluginGetCollInfo sets
//! `*nChannels = 1` before matching rows, so with any CSV every collective of every size runs
//! on one channel. Without any plugin, NCCL 2.24 and later read per-collective values
//! (`NCCL_ALGO=allreduce:ring`, `NCCL_PROTO=allreduce:ll`), which leave other collectives alone.

use super::*;
use crate::allreduce::{NcclAlgo, NcclProto};
use crate::units::fmt_bytes;

/// Consecutive buckets over which the plugin runs one NCCL variant.
pub(super) struct Band {
    pub lo: u64,
    pub hi: u64,
    pub backend: Backend,
}

pub(super) fn bands(g: &GroupProfile) -> Vec<Band> {
    let mut out: Vec<Band> = Vec::new();
    let mut lo = 1;
    for b in &g.buckets {
        let backend = plugin_nccl(b);
        match out.last_mut() {
            Some(band) if band.backend == backend => band.hi = b.bytes,
            _ => out.push(Band {
                lo,
                hi: b.bytes,
                backend,
            }),
        }
        lo = b.bytes + 1;
    }
    out
}

/// The one pinned variant the plugin runs at every size of this group, if there is one and
/// the group measured every size an engine sends (from the latency floor to the default
/// tune's 256 MiB): NCCL_ALGO and NCCL_PROTO hold at sizes the profile never measured too.
/// Otherwise, why not.
///
/// Never for a group whose GPUs all reach each other over NVLink: from NCCL 2.29.2 symmetric
/// kernels run on all-NVLink groups only, and in 2.31's cost model (src/tuning/) setting
/// NCCL_ALGO clears every symmetric kernel, so the variable would cost those users more than
/// the profile's pin gains. The plugin steers them per size instead.
pub(super) fn uniform(p: &Profile, g: &GroupProfile) -> Result<(NcclAlgo, NcclProto), String> {
    if all_nvlink(p, g) {
        return Err("its GPUs are all on NVLink, where NCCL_ALGO would switch off NCCL's symmetric kernels (NCCL 2.31 and later)".into());
    }
    let single = match bands(g).as_slice() {
        [one] => one.backend.nccl_pin(),
        _ => None,
    };
    let Some(pin) = single else {
        return Err("no single pinned variant holds at every size".into());
    };
    let first = g.buckets.first().map_or(0, |b| b.bytes);
    let last = g.buckets.last().map_or(0, |b| b.bytes);
    if !crate::profile::answers_below(first, 1) || last < ENGINE_TOP_BYTES {
        return Err(format!(
            "one pinned variant holds from {} to {}, but a variable would pin it at every size, and the profile does not reach from 4K to 256M",
            fmt_bytes(first),
            fmt_bytes(last)
        ));
    }
    Ok(pin)
}

/// Every pair of the group's GPUs is joined by NVLink (directly or through NVSwitch).
fn all_nvlink(p: &Profile, g: &GroupProfile) -> bool {
    g.gpus.iter().enumerate().all(|(i, &a)| {
        g.gpus[i + 1..]
            .iter()
            .all(|&b| p.topology.nvlinks_between(a, b) > 0)
    })
}

/// The largest message the default tune measures, and the least a group must reach before one
/// NCCL variant is exported for every size.
const ENGINE_TOP_BYTES: u64 = 256 << 20;

/// Per-collective environment values (NCCL 2.24 and later) that pin only allreduce.
pub(super) fn env_values(a: NcclAlgo, pr: NcclProto) -> String {
    format!(
        "NCCL_ALGO=allreduce:{} NCCL_PROTO=allreduce:{}",
        a.name().to_ascii_lowercase(),
        pr.name().to_ascii_lowercase()
    )
}

/// The lines that load artune's plugin.
pub(super) fn plugin_lines(p: &Profile, o: &Options) -> String {
    let mut s = String::new();
    if p.simulated {
        s.push_str("# The plugin refuses SIMULATED profiles (it logs why and leaves NCCL's choice) unless\n");
        s.push_str("# ARTUNE_ALLOW_SIMULATED=1 is set, which is for tests only.\n");
    }
    match o.plugin.starts_with('/') {
        true => s.push_str("# The plugin library installed with this artune:\n"),
        false => s.push_str(
            "# libartune.so was not found beside this artune or in ../lib: give NCCL its absolute\n# path (docs/GUIDE.md, \"The NCCL plugin library\"), or put it on the loader's search path.\n",
        ),
    }
    s.push_str(&format!(
        "export NCCL_TUNER_PLUGIN={}\n",
        shell_quote(&o.plugin)
    ));
    s.push_str(&format!(
        "export ARTUNE_PROFILE={}\n",
        shell_quote(&o.source)
    ));
    if p.groups.iter().any(|g| g.mode == Mode::Graph) {
        s.push_str("# Follow the eager-mode measurements instead of graph mode (default graph):\n# export ARTUNE_MODE=eager\n");
    } else {
        // The plugin would look for graph groups this profile does not have, and steer nothing.
        s.push_str("# The profile has eager-mode measurements only, so the plugin follows those:\nexport ARTUNE_MODE=eager\n");
    }
    s
}

/// What NCCL runs with artune's plugin for `bytes` on group `g`.
pub(super) fn runs(g: &GroupProfile, bytes: u64) -> EngineRun {
    let engine = "NCCL with artune's plugin";
    match bucket_for(g, bytes) {
        None => EngineRun {
            engine,
            runs: "NCCL's own choice".into(),
            backend: Some(Backend::Nccl),
            because: "the profile does not answer for this size (above its largest, or below a smallest above 4 KiB), so the plugin leaves NCCL's table alone".into(),
        },
        Some(b) => {
            let n = plugin_nccl(b);
            EngineRun {
                engine,
                runs: match n.nccl_pin() {
                    Some((a, pr)) => format!("{}/{}", a.name(), pr.name()),
                    None => "NCCL's own choice".into(),
                },
                backend: Some(n),
                because: if n == Backend::Nccl {
                    "no pinned algorithm x protocol beats NCCL's own choice here, so the plugin leaves it".into()
                } else {
                    "the profile's nccl_choice for this bucket".into()
                },
            }
        }
    }
}

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let mut s = String::new();
    s.push_str("# NCCL: load artune's tuner plugin, which steers each allreduce from the profile (source this file).\n");
    s.push_str("# NCCL loads the plugin named by NCCL_TUNER_PLUGIN through its tuner API, ncclTunerPlugin_v3..v7\n");
    s.push_str("# (NVIDIA/nccl src/include/plugin/tuner/tuner_v7.h, commit 2449986fd9ec, and the older headers).\n");
    s.push_str(&provenance(p, o, "#"));
    s.push('\n');
    s.push_str(&plugin_lines(p, o));
    s.push_str(
        "\n# What NCCL runs with the plugin (graph-mode measurements unless ARTUNE_MODE=eager):\n",
    );
    let mut fallback = String::new();
    for &tp in tps {
        let all = placements(p, tp);
        for (i, g) in all.iter().enumerate() {
            let held = if all.len() == 1 {
                ":".to_string()
            } else if i == 0 {
                format!(
                    ": the plugin follows this placement for every TP{tp} communicator (NCCL does not tell it the GPUs):"
                )
            } else {
                format!(
                    ": NOT followed, the plugin runs GPUs {}'s answers here too; this placement's own answers:",
                    gpu_list(&all[0].gpus)
                )
            };
            s.push_str(&format!(
                "#   TP{tp} ({} mode, GPUs {:?}){held}\n",
                g.mode.id(),
                g.gpus
            ));
            for band in bands(g) {
                let what = match band.backend.nccl_pin() {
                    Some((a, pr)) => format!("{}/{} ({})", a.name(), pr.name(), band.backend),
                    None => "NCCL's own choice (no pinned variant beats it)".into(),
                };
                let range = if band.lo <= 1 {
                    format!("up to {}", fmt_bytes(band.hi))
                } else {
                    format!(
                        "above {} up to {}",
                        fmt_bytes(band.lo - 1),
                        fmt_bytes(band.hi)
                    )
                };
                s.push_str(&format!("#     {range}: {what}\n"));
            }
            s.push_str(&format!(
                "#     above {}: NCCL's own choice (not measured)\n",
                fmt_bytes(g.buckets.last().map_or(0, |b| b.bytes))
            ));
            let name = if all.len() == 1 {
                format!("TP{tp}")
            } else {
                format!("TP{tp} on GPUs {}", gpu_list(&g.gpus))
            };
            fallback.push_str(&match uniform(p, g) {
                Ok((a, pr)) => format!(
                    "#   {name}: one variant holds at every size: export {}\n",
                    env_values(a, pr)
                ),
                Err(why) => format!("#   {name}: {why}; only the plugin can follow it.\n"),
            });
        }
    }
    s.push_str("#\n# Without the plugin: NCCL 2.24 or later takes per-collective values, which pin allreduce only:\n");
    s.push_str(&fallback);
    s.push_str("#\n# What NCCL's knobs cannot express:\n");
    s.push_str("# - Custom peer-to-peer kernels (one/two-stage): NCCL cannot run them; engines choose them\n");
    s.push_str("#   (artune export --engine vllm|sglang|trtllm).\n");
    s.push_str("# - NCCL's example tuner plugin is not used: its pluginGetCollInfo (NVIDIA/nccl\n");
    s.push_str("#   plugins/tuner/example/plugin.c, 2.29+) sets *nChannels = 1 before matching its CSV rows, so\n");
    s.push_str("#   every collective it sees would run on ONE channel.\n");
    if tps.iter().any(|&tp| placements(p, tp).len() > 1) {
        s.push_str("# - Placements: a tuner is not told which GPUs a communicator holds, so for a TP size with several\n");
        s.push_str("#   placements the plugin follows the first listed above (GPUs 0..TP where the profile has it).\n");
    }
    s.push_str("# - Launch mode: a tuner cannot tell CUDA-graph capture from eager launches; ARTUNE_MODE picks which\n");
    s.push_str("#   measurements the plugin follows.\n");
    Ok(Export {
        files: vec![File {
            name: "nccl.env".into(),
            contents: s,
        }],
    })
}
