//! Shell `export` lines for everything expressible as environment: artune's NCCL tuner plugin
//! and, where one NCCL algorithm and protocol win at every size, NCCL_ALGO / NCCL_PROTO.

use super::*;

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let mut s = String::new();
    s.push_str("# artune: environment for processes that use NCCL (source this file).\n");
    s.push_str(&provenance(p, o, "#"));
    s.push_str("\n# artune's NCCL tuner plugin steers NCCL's allreduce algorithm and protocol per size from the\n");
    s.push_str(
        "# profile (give the library's absolute path if it is not on the loader's search path).\n",
    );
    if p.simulated {
        s.push_str("# The plugin refuses SIMULATED profiles (it logs why and leaves NCCL's choice) unless\n");
        s.push_str("# ARTUNE_ALLOW_SIMULATED=1 is set, which is for tests only.\n");
    }
    s.push_str("export NCCL_TUNER_PLUGIN=libartune.so\n");
    s.push_str(&format!(
        "export ARTUNE_PROFILE={}\n",
        shell_quote(&o.source)
    ));
    s.push_str("# Follow the eager-mode measurements instead of graph mode (default graph):\n# export ARTUNE_MODE=eager\n");

    let per_tp: Vec<(usize, Option<(String, String)>)> = tps
        .iter()
        .filter_map(|&tp| preferred_group(p, tp).map(|g| (tp, g)))
        .map(|(tp, g)| {
            let (rows, gaps) = super::nccl::rows(g);
            let one = match (rows.as_slice(), gaps.is_empty()) {
                ([r], true) => Some((r.algo.name().to_string(), r.proto.name().to_string())),
                _ => None,
            };
            (tp, one)
        })
        .collect();
    s.push_str("\n# Without the plugin: NCCL_ALGO / NCCL_PROTO pin every collective, so they are exported only\n");
    s.push_str("# when one NCCL algorithm and protocol were fastest at every measured size of every TP size.\n");
    let first = per_tp.first().and_then(|(_, o)| o.clone());
    match first {
        Some(ap) if per_tp.iter().all(|(_, o)| o.as_ref() == Some(&ap)) => {
            s.push_str(&format!(
                "export NCCL_ALGO={}\nexport NCCL_PROTO={}\n",
                ap.0, ap.1
            ));
        }
        _ => {
            for (tp, one) in &per_tp {
                match one {
                    Some((a, pr)) => {
                        s.push_str(&format!("# TP{tp} alone: NCCL_ALGO={a} NCCL_PROTO={pr}\n"))
                    }
                    None => s.push_str(&format!(
                        "# TP{tp}: the fastest NCCL variant changes with size; use the plugin.\n"
                    )),
                }
            }
        }
    }
    s.push_str("\n# What environment variables cannot express:\n");
    s.push_str("# - Custom peer-to-peer kernels: engines pick them in their own code (see artune export --engine vllm|sglang|trtllm).\n");
    s.push_str("# - vLLM: using its custom all-reduce is the --disable-custom-all-reduce flag, not a variable.\n");
    s.push_str("# - SGLang: custom all-reduce size thresholds are a table in its source.\n");
    s.push_str("# - TensorRT-LLM: the per-size strategy lives in an autotuner cache file; point\n");
    s.push_str(
        "#   TLLM_AUTOTUNER_CACHE_PATH at the file `artune export --engine trtllm` writes.\n",
    );
    s.push_str("# - NCCL channel counts: the profile records none.\n");
    Ok(Export {
        files: vec![File {
            name: "artune.env".into(),
            contents: s,
        }],
    })
}
