"""Renders docs/ENGINE-PATHS.md from python/artune/engines.json, the one engine model:
`python3 tests/python/engine_paths.py > docs/ENGINE-PATHS.md`. test_package checks the page
is current."""

import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

INTRO = "# Every allreduce path of vLLM and SGLang, and what artune does with it\n\nThe rule the engine plugins (`artune.vllm`, `artune.sglang`) follow:\n\n- artune's one-stage and two-stage, pull and push kernels stand for the engine's peer-to-peer\n  kernels of the same shape (FlashInfer's one-shot/two-shot, custom all-reduce's 1stage/2stage,\n  SGLang v2's 1shot/2shot push/pull, QuickReduce, MSCCL++, symmetric memory).\n- Where the profile says **NCCL** at a size (TP size, size, graph or eager), no peer-to-peer path\n  of the engine takes that size, FlashInfer included, unless the user opts that path out of\n  artune's control.\n- Where the profile says **custom**, the engine's own order applies inside the profile's custom\n  band (for SGLang v2, at the limits artune's plan sets: 1shot_push, 1shot_pull, 2shot_pull,\n  and per call, so a size the profile gives NCCL inside those limits runs NCCL).\n- NCCL itself runs the algorithm and protocol the profile chose, through artune's tuner plugin\n  (`NCCL_TUNER_PLUGIN`, set by the plugins when unset).\n- Where the profile says an **island schedule**, which no engine has, artune's own kernels\n  (`artune.allreduce`, the images the tune timed) run it: the plugin builds that op on each TP\n  group as the engine builds the group, before the engine sizes its KV cache, and routes those\n  sizes to it ahead of the engine's order (the *artune* row). Where the op cannot be built (no GPU,\n  no P2P, other kernels, no handle exchange), the engine follows the bucket's fallback, the rule\n  among the backends engines have. `ARTUNE_KERNELS=artune` routes every custom size to artune's\n  kernels instead of the engine's kernels of the same shape.\n- A path the plugin cannot verify in the installed release (symbol missing, signature changed)\n  is not patched, and the start-up line names it.\n- A refusal goes only to a caller that falls back when refused (the *asked by* column: the\n  engine's dispatch). Any other caller of a gated method (a model's build-time probe that raises\n  when refused, such as Muse Spark's in vLLM 0.34.0) gets the engine's own answer, so no engine\n  fails to start because of artune; the plugin logs one line naming that caller.\n- Every path is either governed per TP size, size and mode, or left alone with its reason; the\n  start-up line lists the ones left alone. `tests/python/engine_sites.py` checks that every call\n  site of the installed engine that names an all-reduce mechanism (the function, method or class\n  body around it) is listed by a path below (its *sites*) or by the engine's dispatch order, so a\n  new path in a new release is seen, in a new file or in a new function of a file listed here.\n\nThe tables below are `python/artune/engines.json`, the one description of each released\nengine that the plugins, `artune why` and the exports all read (src/export/engines.rs embeds\nthe same file). This page is generated from it (see the end).\n\n## Fusion passes, decided\n\n- **vLLM** (`AllReduceFusionPass`, on at `-O2` on 9.0/10.x with FlashInfer): the fused\n  allreduce+RMSNorm runs FlashInfer's peer-to-peer kernel at *every* size up to its limit, and\n  saves a kernel and a norm pass that the profile did not measure. artune decides it by the\n  profile: it fuses only up to the profile's custom band that starts at the smallest size (both\n  modes), and not at all where the profile starts with NCCL, because a fused size is a\n  peer-to-peer size. The other choice is an opt-in: `ARTUNE_VLLM_FUSION=engine` keeps vLLM's own\n  fusion sizes. The same cut governs the models that call FlashInfer's fused kernel from\n  their own code (`fused_allreduce_rms_norm`, `fused_allreduce_gemma_rms_norm`: DeepSeek-V3.2,\n  Kimi-K3, MiniMax-M3), which read the pass's table but not the pass's `flashinfer_max_size`:\n  artune cuts their `_max_token_num`, and a size it refuses runs the communicator's all-reduce.\n  Where the profile refuses fusion at a TP size, the pass is not built at all (`PostGradPassManager.configure`\n  runs with `fuse_allreduce_rms` off), so vLLM never logs its \"Flashinfer allreduce fusion is not\n  supported\" WARNING for artune's refusal.\n- **SGLang** (FlashInfer allreduce+residual+RMSNorm in the layer's norm, auto-enabled for the\n  architectures listed below): decided the same way, by the profile, by default: the fused kernel\n  is FlashInfer's peer-to-peer all-reduce at every size it takes, so it fuses only up to the\n  profile's custom band from the smallest size at the fusion group's TP size, and a size above is\n  declined as SGLang declines (`(None, None)`), so the norm runs its group's all-reduce and the\n  gates. The decline depends only on the TP size, the size and the profile, so every rank of the\n  group declines alike (SGLang requires that, or the kernel hangs). The other choice is an opt-in:\n  `ARTUNE_SGLANG_FUSION=engine` leaves the fusion to SGLang. Its standalone FlashInfer allreduce\n  (`_can_use_flashinfer_allreduce`) is gated.\n\n## Switches\n\n| setting | effect |\n|---|---|\n| `ARTUNE_PROFILE=path` | the profile to follow (unset: the plugins do nothing) |\n| `ARTUNE_VLLM=0`, `ARTUNE_SGLANG=0` (or `false`, `off`, `no`, any case) | that engine's plugin does nothing (one line says so) |\n| `VLLM_BATCH_INVARIANT=1` | vLLM's fixed reduction order: the vLLM plugin does nothing and says why |\n| SGLang deterministic inference (`SGLANG_ENABLE_DETERMINISTIC_INFERENCE`) | the SGLang plugin does nothing and says why |\n| `ARTUNE_VLLM_FUSION=engine` (or `0`, `false`, `off`, `no`) | vLLM's fusion pass and the models' fused allreduce+norm keep vLLM's sizes |\n| `ARTUNE_SGLANG_FUSION=engine` (or `0`, `false`, `off`, `no`) | SGLang's FlashInfer allreduce+RMSNorm fusion keeps SGLang's sizes |\n| `ARTUNE_KERNELS=islands` (the default) | artune's own kernels take the sizes where the profile chose an island schedule, no others |\n| `ARTUNE_KERNELS=artune` (or `1`, `true`, `on`, `yes`) | artune's own kernels take every size the profile gives a custom kernel (messages of the profile's dtype) |\n| `ARTUNE_KERNELS=engine` (or `0`, `false`, `off`, `no`) | no op is built: the engine's own paths at every size, island sizes on their fallback |\n| `ARTUNE_VLLM_KERNELS`, `ARTUNE_SGLANG_KERNELS` (the same words) | the kernels setting for that engine alone, over `ARTUNE_KERNELS` |\n| `ARTUNE_VLLM_CUSTOM_AR=off` (or `0`, `false`, `no`) | at a TP size the profile gives NCCL everywhere, or where artune's own kernels take every custom size (`ARTUNE_KERNELS=artune`), vLLM builds no custom all-reduce: no IPC buffers, and its custom all-gather/reduce-scatter run NCCL |\n| any of these set to another word | refused in one line, and that engine starts as without artune |\n| `SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB` set by you | a smaller value caps SGLang v2's workspace and the profile's limits with it; a larger one changes nothing |\n\n## vLLM's custom all-reduce at a TP size the profile gives NCCL everywhere, decided\n\nThere the plugin makes `should_custom_ar` answer no at every size, and still lets vLLM build its\n`CustomAllreduce`, because in vLLM 0.34.0 the same object serves collectives the profile does not\nmeasure:\n\n- `CudaCommunicator.custom_all_gather` / `custom_reduce_scatter` run it whenever it exists. vLLM's\n  sequence-parallel `sp_all_gather` / `sp_reduce_scatter` (models/common/ops/sequence_parallel.py:\n  DeepSeek V3.2, V4 and V4.1, Kimi K3, Qwen4-exp, Step5, GLM5-next, Muse Spark) and DeepSeek-V4.1's\n  logits gather call them first and fall back to the TP group's NCCL collective. The all-gather\n  takes bf16/fp16/fp32 inputs up to 2 MiB per rank on full NVLink, or 8/4/2 MiB at TP2/TP4/TP6+\n  through its multicast kernel where NVLink multicast exists; the reduce-scatter takes inputs up to\n  16 MiB (on 10.x also a multimem kernel to 64 MiB, whose buffer is allocated at first use);\n  neither runs on PCIe-only GPUs or on a single-node TP16.\n- DeepSeek-V4.1's fused all-reduce+mHC kernel (TP4) needs its multicast buffers, and its H200\n  sharding of `fused_wqa_wkv` needs it fully connected.\n- What it holds per GPU (custom_all_reduce.py): IPC metadata of `meta_size() + max_size`, an IPC\n  staging buffer of `max(max_size, 2 MiB, 16 MiB)` (the reduce-scatter's 16 MiB, whatever\n  `max_size` is), 8 MiB of rank data, and where NVLink multicast exists a symmetric-memory buffer\n  of 6 x max(all-gather limit x TP, 16 MiB), 96 MiB at TP2, TP4 and TP8.\n\nTurning custom all-reduce off would move all of these to NCCL, a change the profile never measured,\nto free memory that mostly serves them. So by default artune gates only the all-reduce, and the\nstart-up line gives the IPC and multicast memory vLLM allocated, read from the object it built,\nand says what keeps it. Where vLLM runs none of those collectives on it (no full NVLink and no\nmulticast, e.g. a PCIe pair), nothing the profile leaves custom uses it: the plugin closes it\nas soon as vLLM built it (vLLM's own `close()`), its IPC buffers are freed, and the line gives\nthe memory freed. The other choice is the opt-in `ARTUNE_VLLM_CUSTOM_AR=off`: `_ENABLE_CUSTOM_ALL_REDUCE` reads False\nwhile that TP communicator is built, nothing is allocated, and those collectives run NCCL.\n\n## The start-up line\n\nA warning about the profile or the settings (missing, bad, stale, simulated, an unknown setting,\nanother release) is logged once per job, by the first process that loads the plugin (the\nengine's main process); the processes it starts inherit `ARTUNE_SAID` and log it at DEBUG only.\nEach TP group's rank 0 logs one line (through `vllm.artune` / `sglang.artune`, the engines' own\nlogger trees) saying what the engine runs per size band; other ranks stay quiet. A failure of\nartune's own logic around an engine constructor is one warning, and the engine's call runs as\nwithout artune; a constructor whose parameters artune binds by name changed is not wrapped, and\nsaid. `sglang.Engine(...)` sets `log_level=\"error\"` when the caller passes none, which drops\nevery INFO and WARNING line of SGLang's, artune's included; artune does not override the\ncaller's choice: pass `log_level=\"info\"` to `Engine(...)` to see the line (`sglang serve`\nlogs at INFO by default).\n\n## Ray\n\n- vLLM's Ray workers get `ARTUNE_*`: the plugin adds `ARTUNE_` to\n  `VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY` (vllm/ray/ray_env.py).\n- SGLang 0.5.23 under Ray (`--use-ray`, `RayEngine`, sglang/srt/ray/) runs each scheduler as a Ray\n  actor whose constructor builds the Scheduler without `load_plugins()` (the forked\n  `run_scheduler_process` calls it), so no plugin runs where its communicators are built, whatever\n  environment reaches the actor. artune cannot apply a profile there; the driver's plugin says so\n  in one warning line when SGLang launches that way.\n\n## SGLang v2's workspace\n\nSGLang's v2 constructor sizes its pull and push workspaces to what `get_all_reduce_config` wants,\nclipped to `max_size`, which defaults to `SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB` as read at import\n(16 MiB). The plugin patches that config, which the constructor reads in every process, so the\nprofile's workspace takes effect with `sglang.Engine(...)` as with `sglang serve`, with no variable\ninvolved. The plan (src/export/sglang/) keeps every v2 limit within SGLang's 16 MiB default, so\nthe profile only ever shrinks the workspace, and sizes above it run NCCL even where the profile's\ncustom band goes further. Growing it would need a plan priced for the larger workspace and\n`max_size` passed to the constructor; artune does not do that.\n\n"


def render(d) -> str:
    out = [INTRO]
    for key, name in (("vllm", "vLLM"), ("sglang", "SGLang")):
        e = d[key]
        out.append(f"## {name} {e['read_against']}: paths in dispatch order\n")
        out.append("| path | how the engine picks it | what the plugin does | patch point | asked by |")
        out.append("|---|---|---|---|---|")
        for r in e["order"]:
            pts = [(r[k], how) for k, how in (("patch", ""), ("gate", " (per call)")) if k in r]
            pp = "; ".join(f"`{pt['module']}.{pt['qualname']}`{how}" for pt, how in pts) or "none"
            asked = ", ".join(f"`{a}`" for a in r.get("asked_by", [])) or "-"
            out.append(f"| {r['path']} | {r['picked_by']} | {r['plugin']} | {pp} | {asked} |")
        out.append("")
        out.append(f"Left alone, as the start-up line says: {'; '.join(r['left_alone'] for r in e['order'] if 'left_alone' in r)}.\n")
    v = d["vllm"]
    out.append("## vLLM size tables (bytes; capability, then TP size)\n")
    for t in ("flashinfer_max_bytes", "fusion_max_bytes", "custom_max_bytes",
              "symm_mem_max_bytes"):
        out.append(f"- `{t}`: " + "; ".join(
            f"{c}: " + ", ".join(f"TP{w} {n}" for w, n in tab.items())
            for c, tab in v[t].items()))
    out.append("\nUnder HiSparse (or `VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm`) vLLM's FlashInfer all-reduce runs "
               "its trtllm backend on one node, whose limit is `fusion_max_bytes`, and is off across nodes "
               "under HiSparse; the start-up line and `artune why` say so.")
    out.append("\n## SGLang v2 multicast ranges (inclusive bytes; architecture, TP size, mode)\n")
    for c, tab in d["sglang"]["v2_multicast"].items():
        out.append(f"- {c}: " + "; ".join(
            f"TP{w} graph {r['graph']}, eager {r['eager']}" for w, r in tab.items()))
    out.append("\nSGLang auto-enables FlashInfer allreduce fusion for: "
               + ", ".join(d["sglang"]["flashinfer_fusion_auto"]) + "; with its CuTe DSL backend "
               "(the flashinfer_cutedsl row) for: "
               + ", ".join(d["sglang"]["flashinfer_fusion_auto_cutedsl"]) + ". "
               f"Its standalone FlashInfer allreduce takes up to {d['sglang']['flashinfer_max_tokens']} "
               "tokens on a group it tags.")
    out.append("\n## Call sites each path covers\n")
    out.append("The functions, methods and class bodies (`<module>`: the top level) of the engine's package "
               "that name an all-reduce mechanism, by file, and the path that covers each; "
               "`tests/python/engine_sites.py` fails on a call site listed nowhere, so a new function in a "
               "file listed here reads as not modelled. Files and folders (ending in `/`) with no all-reduce "
               "are skipped whole.\n")
    for key, name in (("vllm", "vLLM"), ("sglang", "SGLang")):
        e = d[key]
        out.append(f"### {name}\n")
        rows = [(r["path"], r["sites"]) for r in e["order"] if r.get("sites")]
        rows.append(("the dispatch order and its communicators, shared by every gated path",
                     e["scan"]["dispatch"]))
        for path, sites in rows:
            files = {}
            for x in sites:
                f, _, fn = x.partition("::")
                files.setdefault(f, []).append(fn)
            out.append(f"- {path}: " + "; ".join(
                f"`{f}` (" + ", ".join(f"`{fn}`" for fn in fns) + ")" for f, fns in files.items()))
        out.append("- no all-reduce: " + "; ".join(
            f"`{x}` ({why})" for x, why in e["scan"]["not_all_reduce"].items()))
        out.append("")
    out.append("\n## Regenerating this page\n")
    out.append("Edit `python/artune/engines.json`, never this page, then run\n"
               "`python3 tests/python/engine_paths.py > docs/ENGINE-PATHS.md`.")
    return "\n".join(out) + "\n"


def model():
    with open(os.path.join(ROOT, "python", "artune", "engines.json")) as f:
        return json.load(f)


if __name__ == "__main__":
    print(render(model()), end="")
