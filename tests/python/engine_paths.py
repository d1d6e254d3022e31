"""Renders docs/ENGINE-PATHS.md from python/artune/engines.json, the one engine model:
`python3 tests/python/engine_paths.py > docs/ENGINE-PATHS.md`. test_package checks the page
is current."""

import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

INTRO = "# Every allreduce path of vLLM and SGLang, and what artune does with it\n\nThe rule the engine plugins (`artune.vllm`, `artune.sglang`) follow:\n\n- artune's one-stage and two-stage, pull and push kernels stand for the engine's peer-to-peer\n  kernels of the same shape (FlashInfer's one-shot/two-shot, custom all-reduce's 1stage/2stage,\n  SGLang v2's 1shot/2shot push/pull, QuickReduce, MSCCL++, symmetric memory).\n- Where the profile says **NCCL** at a size (TP size, size, graph or eager), no peer-to-peer path\n  of the engine takes that size, FlashInfer included, unless the user opts that path out of\n  artune's control.\n- Where the profile says **custom**, the engine's own order applies inside the profile's custom\n  band (for SGLang v2, at the limits artune's plan sets: 1shot_push, 1shot_pull, 2shot_pull).\n- NCCL itself runs the algorithm and protocol the profile chose, through artune's tuner plugin\n  (`NCCL_TUNER_PLUGIN`, set by the plugins when unset).\n- A path the plugin cannot verify in the installed release (symbol missing, signature changed)\n  is not patched, and the start-up line names it.\n\nThe tables below are `python/artune/engines.json`, the one description of each released\nengine that the plugins, `artune why` and the exports all read (src/export/engines.rs embeds\nthe same file). This page is generated from it (see the end).\n\n## Fusion passes, decided\n\n- **vLLM** (`AllReduceFusionPass`, on at `-O2` on 9.0/10.x with FlashInfer): the fused\n  allreduce+RMSNorm runs FlashInfer's peer-to-peer kernel at *every* size up to its limit, and\n  saves a kernel and a norm pass that the profile did not measure. artune decides it by the\n  profile: it fuses only up to the profile's custom band that starts at the smallest size (both\n  modes), and not at all where the profile starts with NCCL, because a fused size is a\n  peer-to-peer size. The other choice is an opt-in: `ARTUNE_VLLM_FUSION=engine` keeps vLLM's own\n  fusion sizes. The same cut governs the models that call FlashInfer's fused kernel from\n  their own code (`fused_allreduce_rms_norm`, `fused_allreduce_gemma_rms_norm`: DeepSeek-V3.2,\n  Kimi-K3, MiniMax-M3), which read the pass's table but not the pass's `flashinfer_max_size`:\n  artune cuts their `_max_token_num`, and a size it refuses runs the communicator's all-reduce.\n- **SGLang** (FlashInfer allreduce+residual+RMSNorm, auto-enabled for the architectures listed\n  below): left to SGLang, and said in the start-up line; `--enforce-disable-flashinfer-allreduce-fusion`\n  turns it off. Its standalone FlashInfer allreduce (`_can_use_flashinfer_allreduce`) is gated.\n\n## Switches\n\n| setting | effect |\n|---|---|\n| `ARTUNE_PROFILE=path` | the profile to follow (unset: the plugins do nothing) |\n| `ARTUNE_VLLM=0`, `ARTUNE_SGLANG=0` | that engine's plugin does nothing (one line says so) |\n| `VLLM_BATCH_INVARIANT=1` | vLLM's fixed reduction order: the vLLM plugin does nothing and says why |\n| SGLang deterministic inference (`SGLANG_ENABLE_DETERMINISTIC_INFERENCE`) | the SGLang plugin does nothing and says why |\n| `ARTUNE_VLLM_FUSION=engine` | vLLM's fusion pass keeps vLLM's sizes |\n| `ARTUNE_VLLM_CUSTOM_AR=off` | at a TP size the profile gives NCCL everywhere, vLLM builds no custom all-reduce: no IPC buffers, and its custom all-gather/reduce-scatter run NCCL |\n| `SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB` set by you | a smaller value caps SGLang v2's workspace and the profile's limits with it; a larger one changes nothing |\n\n## vLLM's custom all-reduce at a TP size the profile gives NCCL everywhere, decided\n\nThere the plugin makes `should_custom_ar` answer no at every size, and still lets vLLM build its\n`CustomAllreduce`, because in vLLM 0.33.0 the same object serves collectives the profile does not\nmeasure:\n\n- `CudaCommunicator.custom_all_gather` / `custom_reduce_scatter` run it whenever it exists. vLLM's\n  sequence-parallel `sp_all_gather` / `sp_reduce_scatter` (models/common/ops/sequence_parallel.py:\n  DeepSeek V3.2, V4 and V4.1, Kimi K3, Qwen4-exp, Step5, GLM5-next, Muse Spark) and DeepSeek-V4.1's\n  logits gather call them first and fall back to the TP group's NCCL collective. The all-gather\n  takes bf16/fp16/fp32 inputs up to 2 MiB per rank on full NVLink, or 8/4/2 MiB at TP2/TP4/TP6+\n  through its multicast kernel where NVLink multicast exists; the reduce-scatter takes inputs up to\n  16 MiB (on 10.x also a multimem kernel to 64 MiB, whose buffer is allocated at first use);\n  neither runs on PCIe-only GPUs or on a single-node TP16.\n- DeepSeek-V4.1's fused all-reduce+mHC kernel (TP4) needs its multicast buffers, and its H200\n  sharding of `fused_wqa_wkv` needs it fully connected.\n- What it holds per GPU (custom_all_reduce.py): IPC metadata of `meta_size() + max_size`, an IPC\n  staging buffer of `max(max_size, 2 MiB, 16 MiB)` (the reduce-scatter's 16 MiB, whatever\n  `max_size` is), 8 MiB of rank data, and where NVLink multicast exists a symmetric-memory buffer\n  of 6 x max(all-gather limit x TP, 16 MiB), 96 MiB at TP2, TP4 and TP8.\n\nTurning custom all-reduce off would move all of these to NCCL, a change the profile never measured,\nto free memory that mostly serves them. So by default artune gates only the all-reduce, and the\nstart-up line gives the IPC and multicast memory vLLM allocated, read from the object it built,\nand says what keeps it. Where vLLM runs none of those collectives on it (no full NVLink and no\nmulticast, e.g. a PCIe pair), nothing the profile leaves custom uses it: the plugin closes it\nas soon as vLLM built it (vLLM's own `close()`), its IPC buffers are freed, and the line gives\nthe memory freed. The other choice is the opt-in `ARTUNE_VLLM_CUSTOM_AR=off`: `_ENABLE_CUSTOM_ALL_REDUCE` reads False\nwhile that TP communicator is built, nothing is allocated, and those collectives run NCCL.\n\n## Ray\n\n- vLLM's Ray workers get `ARTUNE_*`: the plugin adds `ARTUNE_` to\n  `VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY` (vllm/ray/ray_env.py).\n- SGLang 0.5.23 under Ray (`--use-ray`, `RayEngine`, sglang/srt/ray/) runs each scheduler as a Ray\n  actor whose constructor builds the Scheduler without `load_plugins()` (the forked\n  `run_scheduler_process` calls it), so no plugin runs where its communicators are built, whatever\n  environment reaches the actor. artune cannot apply a profile there; the driver's plugin says so\n  in one warning line when SGLang launches that way.\n\n## SGLang v2's workspace\n\nSGLang's v2 constructor sizes its pull and push workspaces to what `get_all_reduce_config` wants,\nclipped to `max_size`, which defaults to `SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB` as read at import\n(16 MiB). The plugin patches that config, which the constructor reads in every process, so the\nprofile's workspace takes effect with `sglang.Engine(...)` as with `sglang serve`, with no variable\ninvolved. The plan (src/export/sglang.rs) keeps every v2 limit within SGLang's 16 MiB default, so\nthe profile only ever shrinks the workspace, and sizes above it run NCCL even where the profile's\ncustom band goes further. Growing it would need a plan priced for the larger workspace and\n`max_size` passed to the constructor; artune does not do that.\n\n"


def render(d) -> str:
    out = [INTRO]
    for key, name in (("vllm", "vLLM"), ("sglang", "SGLang")):
        e = d[key]
        out.append(f"## {name} {e['read_against']}: paths in dispatch order\n")
        out.append("| path | how the engine picks it | what the plugin does | patch point |")
        out.append("|---|---|---|---|")
        for r in e["order"]:
            pt = r.get("patch")
            pp = f"`{pt['module']}.{pt['qualname']}`" if pt else "none"
            out.append(f"| {r['path']} | {r['picked_by']} | {r['plugin']} | {pp} |")
        out.append("")
    v = d["vllm"]
    out.append("## vLLM size tables (bytes; capability, then TP size)\n")
    for t in ("flashinfer_max_bytes", "fusion_max_bytes", "custom_max_bytes",
              "symm_mem_max_bytes"):
        out.append(f"- `{t}`: " + "; ".join(
            f"{c}: " + ", ".join(f"TP{w} {n}" for w, n in tab.items())
            for c, tab in v[t].items()))
    out.append("\n## SGLang v2 multicast ranges (inclusive bytes; architecture, TP size, mode)\n")
    for c, tab in d["sglang"]["v2_multicast"].items():
        out.append(f"- {c}: " + "; ".join(
            f"TP{w} graph {r['graph']}, eager {r['eager']}" for w, r in tab.items()))
    out.append("\nSGLang auto-enables FlashInfer allreduce fusion for: "
               + ", ".join(d["sglang"]["flashinfer_fusion_auto"]) + ".")
    out.append("\n## Regenerating this page\n")
    out.append("Edit `python/artune/engines.json`, never this page, then run\n"
               "`python3 tests/python/engine_paths.py > docs/ENGINE-PATHS.md`.")
    return "\n".join(out) + "\n"


def model():
    with open(os.path.join(ROOT, "python", "artune", "engines.json")) as f:
        return json.load(f)


if __name__ == "__main__":
    print(render(model()), end="")
