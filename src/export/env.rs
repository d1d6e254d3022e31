//! Shell `export` lines for everything expressible as environment: artune's NCCL tuner plugin
//! and, where one pinned NCCL variant is the rule's answer at every size, the per-collective
//! NCCL_ALGO / NCCL_PROTO values NCCL 2.24 and later read (`allreduce:ring`).

use super::*;

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let mut s = String::new();
    s.push_str("# artune: environment for processes that use NCCL (source this file).\n");
    s.push_str(&provenance(p, o, "#"));
    s.push_str("\n# artune's NCCL tuner plugin steers NCCL's allreduce algorithm and protocol per size from the\n");
    s.push_str(&format!(
        "# profile (`artune export {} --engine nccl` lists what it runs at each size).\n",
        shell_quote(&o.source)
    ));
    s.push_str(&super::nccl::plugin_lines(p, o));

    // Variables hold for every communicator, so every placement of every TP size must agree.
    let per_tp: Vec<(String, Result<String, String>)> = tps
        .iter()
        .flat_map(|&tp| {
            let all = placements(p, tp);
            let several = all.len() > 1;
            all.into_iter().map(move |g| {
                let name = if several {
                    format!("TP{tp} on GPUs {}", gpu_list(&g.gpus))
                } else {
                    format!("TP{tp}")
                };
                (
                    name,
                    super::nccl::uniform(p, g).map(|(a, pr)| super::nccl::env_values(a, pr)),
                )
            })
        })
        .collect();
    s.push_str("\n# Without the plugin (NCCL 2.24 or later): per-collective NCCL_ALGO / NCCL_PROTO, exported only\n");
    s.push_str("# when one pinned variant beats NCCL's own choice at every size, 4K to 256M, of every TP size and\n");
    s.push_str("# placement.\n");
    let first = per_tp.first().and_then(|(_, v)| v.clone().ok());
    match first {
        Some(v) if per_tp.iter().all(|(_, o)| o.as_ref().ok() == Some(&v)) => {
            for kv in v.split(' ') {
                s.push_str(&format!("export {kv}\n"));
            }
        }
        _ => {
            for (tp, one) in &per_tp {
                match one {
                    Ok(v) => s.push_str(&format!("# {tp} alone: {v}\n")),
                    Err(why) => s.push_str(&format!("# {tp}: {why}; use the plugin.\n")),
                }
            }
        }
    }
    s.push_str("\n# What environment variables cannot express:\n");
    s.push_str("# - Custom peer-to-peer kernels: engines pick them in their own code (see artune export --engine vllm|sglang|trtllm).\n");
    s.push_str("# - vLLM: using its custom all-reduce is the --disable-custom-all-reduce flag, not a variable.\n");
    s.push_str("# - SGLang: custom all-reduce size limits are a table in its source.\n");
    s.push_str(
        "# - TensorRT-LLM: the per-size strategy is allreduce_strategy and its autotuner cache\n",
    );
    s.push_str("#   (artune export --engine trtllm).\n");
    Ok(Export {
        files: vec![File {
            name: "artune.env".into(),
            contents: s,
        }],
    })
}
