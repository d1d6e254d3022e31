#!/usr/bin/env python3
"""Compare an artune profile with PyTorch's allreduce paths measured by torch_peers.py.

Writes a Markdown report: per TP group and message size, artune's `nccl` against torch's NCCL
(ratio, flagged past --gap), artune's best one_stage_* against torch's symmetric-memory
one_shot and best two_stage_* against two_shot, the regret of the profile's choice against the
fastest of everything measured, the tuning time and each backend's GPU memory. With matplotlib
it also draws compare.svg and compare.png. Standard library only otherwise.

    python3 benches/compare.py --profile profile.json --torch torch-peers.csv \\
        --out report.md [--plots DIR] [--gap 0.10] [--torch-tp 1]
    python3 benches/compare.py --self-test

Exit codes: 2 bad input (one sentence says what and what to do), 130 interrupted. The report is
written whole (temporary file, then rename) or not at all.
"""

import argparse
import csv
import json
import math
import os
import sys
import tempfile

import atomic


REQUIRED = ["impl", "mode", "tp", "bytes", "median_us", "p10_us", "p90_us", "iters",
            "torch_version", "nccl_version", "gpu_name", "date"]
TORCH_IMPLS = ["torch_nccl", "torch_one_shot", "torch_two_shot"]
ONE_STAGE = ["one_stage_pull", "one_stage_push"]
TWO_STAGE = ["two_stage_pull", "two_stage_push"]


class BadInput(Exception):
    """Exit 2."""


# ---------------------------------------------------------------- reading

def load_profile(path):
    try:
        with open(path) as f:
            p = json.load(f)
    except FileNotFoundError:
        raise BadInput(f"profile {path} does not exist: pass the JSON `artune tune --out` "
                       f"wrote.") from None
    except (OSError, ValueError) as e:
        raise BadInput(f"profile {path} is not readable JSON ({e}): pass the file "
                       f"`artune tune --out` wrote.") from None
    groups = p.get("groups") if isinstance(p, dict) else None
    if not isinstance(groups, list) or not groups:
        raise BadInput(f"profile {path} has no groups: it is not an artune profile, or the "
                       f"tune measured nothing; rerun `artune tune`.")
    for i, g in enumerate(groups):
        if not isinstance(g, dict) or not all(k in g for k in ("tp", "mode", "buckets")):
            raise BadInput(f"profile {path}: group {i} lacks tp, mode or buckets; regenerate "
                           f"it with `artune tune`.")
        for b in g["buckets"]:
            if not isinstance(b, dict) or "bytes" not in b or "results" not in b:
                raise BadInput(f"profile {path}: a bucket of group {i} lacks bytes or "
                               f"results; regenerate it with `artune tune`.")
    return p


def load_torch(path):
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            rows = list(reader)
    except FileNotFoundError:
        raise BadInput(f"torch CSV {path} does not exist: pass the file torch_peers.py "
                       f"--out wrote.") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise BadInput(f"torch CSV {path} is not readable ({e}).") from None
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise BadInput(f"torch CSV {path} lacks column(s) {', '.join(missing)}: pass the file "
                       f"benches/torch_peers.py wrote.")
    out = []
    for n, r in enumerate(rows, start=2):
        try:
            r["tp"] = int(r["tp"])
            r["bytes"] = int(r["bytes"])
            for k in ("median_us", "p10_us", "p90_us"):
                r[k] = float(r[k]) if r[k] not in ("", None) else None
        except ValueError:
            raise BadInput(f"torch CSV {path} line {n}: tp, bytes or a time is not a "
                           f"number.") from None
        r.setdefault("status", "ok" if r["median_us"] is not None else "missing")
        r["status"] = r["status"] or ("ok" if r["median_us"] is not None else "missing")
        if r["status"] == "ok" and (r["median_us"] is None or not r["median_us"] > 0):
            raise BadInput(f"torch CSV {path} line {n}: status ok but no positive median_us.")
        out.append(r)
    if not out:
        raise BadInput(f"torch CSV {path} has no rows: torch_peers.py measured nothing.")
    return out


# ---------------------------------------------------------------- numbers

def human_bytes(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return f"{b}B" if b < 1024 else f"{b / 1024:.0f}K"


def mib(b):
    return "-" if b is None or b == "" else f"{int(b) / (1 << 20):.1f} MiB"


def us(v):
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:.1f}"


def ratio_cell(a, t, gap):
    """artune / torch; > 1 means artune is slower. Flag when |ratio - 1| > gap."""
    if a is None or t is None:
        return "-", None
    r = a / t
    flag = " ⚠" if abs(r - 1) > gap else ""
    return f"{r:.2f}{flag}", r


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def best_of(results, names):
    got = [(results[n]["median_us"], n) for n in names if n in results]
    return min(got) if got else (None, None)


def torch_index(rows):
    """(impl, mode, tp, bytes) -> row, and the set of torch TP sizes with any row."""
    idx = {}
    for r in rows:
        idx[(r["impl"], r["mode"], r["tp"], r["bytes"])] = r
    return idx, sorted({r["tp"] for r in rows})


def torch_time(idx, impl, mode, tp, b):
    r = idx.get((impl, mode, tp, b))
    return r["median_us"] if r and r["status"] == "ok" else None


def analyse_group(g, idx, ttp, gap, torch_in_regret=True):
    """Per-size rows of one group, over the sizes both sides measured. Regret counts torch's
    paths only when they ran the same collective (same TP), not for loopback profiles."""
    mode = g["mode"]
    out = []
    for b in g["buckets"]:
        size = b["bytes"]
        res = b["results"]
        t = {i: torch_time(idx, i, mode, ttp, size) for i in TORCH_IMPLS}
        if all(v is None for v in t.values()) and not any(
                (i, mode, ttp, size) in idx for i in TORCH_IMPLS):
            continue
        a_nccl = res.get("nccl", {}).get("median_us")
        one_us, one_name = best_of(res, ONE_STAGE)
        two_us, two_name = best_of(res, TWO_STAGE)
        choice = b.get("choice")
        choice_us = res.get(choice, {}).get("median_us")
        every = [(v["median_us"], k) for k, v in res.items()]
        if torch_in_regret:
            every += [(v, k) for k, v in t.items() if v is not None]
        fastest_us, fastest = min(every) if every else (None, None)
        regret = (choice_us / fastest_us - 1) if choice_us and fastest_us else None
        out.append(dict(
            bytes=size, a_nccl=a_nccl, t_nccl=t["torch_nccl"],
            nccl_ratio=ratio_cell(a_nccl, t["torch_nccl"], gap),
            one_us=one_us, one_name=one_name, t_one=t["torch_one_shot"],
            one_ratio=ratio_cell(one_us, t["torch_one_shot"], gap),
            two_us=two_us, two_name=two_name, t_two=t["torch_two_shot"],
            two_ratio=ratio_cell(two_us, t["torch_two_shot"], gap),
            choice=choice, choice_us=choice_us, fastest=fastest, fastest_us=fastest_us,
            regret=regret, results=res, torch=t))
    return out


# ---------------------------------------------------------------- report

def header_lines(p, rows, args, loopback):
    r0 = rows[0]
    lines = []
    fabric = p.get("fabric") or "(fabric not recorded)"
    lines.append(f"# artune vs PyTorch allreduce: {fabric}")
    lines.append("")
    if p.get("simulated"):
        lines.append("> **SIMULATED profile.** artune's numbers below come from its simulated "
                     "fabric (a model), not from hardware; the torch numbers were measured. "
                     "Ratios compare a model with a measurement and say nothing about "
                     "artune's kernels.")
        lines.append("")
    if loopback:
        lines.append(f"> **LOOPBACK comparison.** The profile was measured on one GPU "
                     f"(virtual ranks; NCCL with one rank) and torch's rows at TP "
                     f"{args.torch_tp} stand in for every group. The NCCL columns compare "
                     f"one-rank NCCL with one-rank NCCL. The peer columns do not compare like "
                     f"with like: artune's loopback kernels read TP buffers from one GPU's "
                     f"memory, torch's symmetric-memory ops at world size {args.torch_tp} "
                     f"read {args.torch_tp}. Read this as a check that the pipeline runs, "
                     f"not as a verdict on either side.")
        lines.append("")
    vers = p.get("versions") or {}
    settings = p.get("settings") or {}
    dtypes = sorted({g.get("dtype", "?") for g in p["groups"]})
    t_dtypes = sorted({r.get("dtype") or "?" for r in rows})
    lines += [
        "| | artune profile | torch CSV |",
        "|---|---|---|",
        f"| file | `{args.profile}` | {', '.join(f'`{t}`' for t in args.torch)} |",
        f"| when | {p.get('created', '?')} | {r0['date']} |",
        f"| measured on | {fabric} | {r0['gpu_name']} (world size "
        f"{r0.get('world_size') or '?'}) |",
        f"| software | artune {p.get('tool_version', '?')}, driver {vers.get('driver') or '-'}, "
        f"CUDA {vers.get('cuda') or '-'}, NCCL {vers.get('nccl') or '-'} | torch "
        f"{r0['torch_version']}, "
        f"NCCL {r0['nccl_version']} |",
        f"| dtype | {', '.join(dtypes)} | {', '.join(t_dtypes)} |",
        f"| tuning time | {settings.get('tuning_seconds', 0):.2f} s "
        f"(TP {settings.get('tp')}, modes {settings.get('modes')}) | - |",
        "",
    ]
    if dtypes != t_dtypes:
        lines += [f"**Warning:** the profile measured {', '.join(dtypes)} but torch measured "
                  f"{', '.join(t_dtypes)}; times are not comparable size for size.", ""]
    if vers.get("nccl") and r0["nccl_version"] and vers.get("nccl") != r0["nccl_version"]:
        lines += [f"Note: different NCCL builds (artune loaded {vers.get('nccl')}, torch "
                  f"ships {r0['nccl_version']}).", ""]
    lines += [
        f"Ratios are artune / torch: above 1 artune is slower; ⚠ marks |ratio − 1| > "
        f"{args.gap:.0%}. One-stage and two-stage columns take artune's faster of pull and "
        f"push (named). Regret = the profile's choice / the fastest of everything measured at "
        f"that size (artune's backends and torch's; artune's alone for a loopback comparison, "
        f"where torch ran a different collective) − 1. torch_nccl is dist.all_reduce in "
        f"place; torch_one_shot is symm_mem.one_shot_all_reduce_out with the input resident "
        f"in the symmetric buffer; torch_two_shot is symm_mem.two_shot_all_reduce_ in place "
        f"(reduce-scatter by reads, results written to peers).",
        "",
    ]
    return lines


def group_title(g):
    gpus = ",".join(str(x) for x in g.get("gpus", []))
    place = f", {g['placement']}" if g.get("placement") else ""
    return f"TP{g['tp']} {g['mode']} (GPUs {gpus}{place}, {g.get('dtype', '?')})"


def summary_lines(analysed, gap, loopback):
    lines = ["## Summary", "",
             "| group | sizes | NCCL ratio geomean (min–max) | NCCL ⚠ | one-stage / one_shot "
             "geomean | two-stage / two_shot geomean | max regret (size, fastest) | sizes a "
             "torch path beats the choice by > gap |",
             "|---|---|---|---|---|---|---|---|"]
    for g, rows in analysed:
        if not rows:
            lines.append(f"| {group_title(g)} | 0 | no torch rows at these sizes | | | | | |")
            continue
        nr = [r["nccl_ratio"][1] for r in rows if r["nccl_ratio"][1]]
        flagged = sum(1 for x in nr if abs(x - 1) > gap)
        gm = geomean(nr)
        nccl = f"{gm:.2f} ({min(nr):.2f}–{max(nr):.2f})" if nr else "-"
        one = geomean([r["one_ratio"][1] for r in rows])
        two = geomean([r["two_ratio"][1] for r in rows])
        reg = [r for r in rows if r["regret"] is not None]
        worst = max(reg, key=lambda r: r["regret"]) if reg else None
        worst_s = (f"{worst['regret']:.1%} ({human_bytes(worst['bytes'])}, {worst['fastest']})"
                   if worst else "-")
        beaten = "n/a (loopback)" if loopback else sum(
            1 for r in rows if r["choice_us"] and any(
                v is not None and r["choice_us"] / v - 1 > gap for v in r["torch"].values()))
        lines.append(f"| {group_title(g)} | {len(rows)} | {nccl} | {flagged} | "
                     f"{'-' if one is None else f'{one:.2f}'} | "
                     f"{'-' if two is None else f'{two:.2f}'} | {worst_s} | {beaten} |")
    lines.append("")
    return lines


def group_lines(g, rows, idx, ttp, n_buckets, loopback):
    lines = [f"## {group_title(g)}", ""]
    if not rows:
        lines += ["No torch measurement at this group's sizes and mode.", ""]
        return lines
    tg = next((r.get("gpus") for (i, m, t, _), r in idx.items()
               if t == ttp and r.get("gpus")), None)
    gg = " ".join(str(x) for x in g.get("gpus", []))
    if tg and tg != gg and not loopback:
        lines += [f"torch measured GPUs {tg.replace(' ', ',')}, this group is GPUs "
                  f"{gg.replace(' ', ',')}: where the placement differs, so may the links.", ""]
    if n_buckets > len(rows):
        lines += [f"{len(rows)} of the profile's {n_buckets} bucket sizes have torch rows "
                  f"(torch measured powers of two; artune refines crossovers).", ""]
    lines += ["| size | artune nccl µs | torch NCCL µs | ratio | artune one-stage µs | torch "
              "one_shot µs | ratio | artune two-stage µs | torch two_shot µs | ratio | "
              "choice | fastest measured | regret |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        one = f"{us(r['one_us'])} ({r['one_name'].split('_')[-1]})" if r["one_name"] else "-"
        two = f"{us(r['two_us'])} ({r['two_name'].split('_')[-1]})" if r["two_name"] else "-"
        reg = "-" if r["regret"] is None else f"{r['regret']:.1%}"
        lines.append(
            f"| {human_bytes(r['bytes'])} | {us(r['a_nccl'])} | {us(r['t_nccl'])} | "
            f"{r['nccl_ratio'][0]} | {one} | {us(r['t_one'])} | {r['one_ratio'][0]} | {two} | "
            f"{us(r['t_two'])} | {r['two_ratio'][0]} | {r['choice']} {us(r['choice_us'])} | "
            f"{r['fastest']} {us(r['fastest_us'])} | {reg} |")
    lines.append("")
    # Memory: artune's record per backend, torch's per implementation at this TP.
    lines += ["| memory per GPU | bytes | measured | serves up to | as chosen by the profile |",
              "|---|---:|---|---:|---:|"]
    for name, m in sorted((g.get("memory") or {}).items()):
        serves = m.get("serves_up_to_bytes")
        req = m.get("required_bytes_per_gpu")
        lines.append(f"| artune {name} | {mib(m.get('bytes_per_gpu'))} | "
                     f"{'yes' if m.get('measured') else 'modelled'} | "
                     f"{human_bytes(serves) if serves else '-'} | "
                     f"{mib(req) if req is not None else 'not chosen'} |")
    for impl in TORCH_IMPLS:
        mrow = next((r for (i, mo, tp, _), r in sorted(idx.items(), key=lambda kv: kv[0][3])
                     if i == impl and tp == ttp and r.get("mem_bytes") not in (None, "")), None)
        if mrow:
            top = max(b for (i, _, t, b) in idx if i == impl and t == ttp)
            serves = "-" if impl == "torch_nccl" else human_bytes(top)
            lines.append(f"| {impl} | {mib(mrow['mem_bytes'])} | yes (free-memory drop) | "
                         f"{serves} | - |")
    lines.append("")
    return lines


def skipped_lines(rows):
    bad = {}
    for r in rows:
        if r["status"] != "ok":
            key = (r["impl"], r["mode"], r["tp"], r["status"], r.get("note") or "")
            bad.setdefault(key, []).append(r["bytes"])
    if not bad:
        return []
    lines = ["## torch paths not measured", "", "| impl | mode | TP | status | sizes | why |",
             "|---|---|---|---|---|---|"]
    for (impl, mode, tp, status, note), sizes in sorted(bad.items()):
        span = (human_bytes(min(sizes)) + "–" + human_bytes(max(sizes))) if len(sizes) > 1 \
            else human_bytes(sizes[0])
        lines.append(f"| {impl} | {mode} | {tp} | {status} | {span} ({len(sizes)}) | "
                     f"{note.replace('|', '/')} |")
    lines.append("")
    return lines


def build(p, rows, args):
    idx, torch_tps = torch_index(rows)
    loopback = args.torch_tp is not None
    groups = p["groups"]
    if not loopback:
        if not any(g["tp"] in torch_tps for g in groups):
            raise BadInput(
                f"the torch CSV has TP {torch_tps} but the profile has TP "
                f"{sorted({g['tp'] for g in groups})}: rerun torch_peers.py with --tp for the "
                f"profile's sizes, or pass --torch-tp N to compare a loopback profile with "
                f"torch's rows at TP N.")
    elif args.torch_tp not in torch_tps:
        raise BadInput(f"--torch-tp {args.torch_tp}: the torch CSV has only TP {torch_tps}.")
    analysed = []
    for g in groups:
        ttp = args.torch_tp if loopback else g["tp"]
        analysed.append((g, analyse_group(g, idx, ttp, args.gap, not loopback), ttp))
    lines = header_lines(p, rows, args, loopback)
    lines += summary_lines([(g, r) for g, r, _ in analysed], args.gap, loopback)
    for g, r, ttp in analysed:
        lines += group_lines(g, r, idx, ttp, len(g["buckets"]), loopback)
    lines += skipped_lines(rows)
    if p.get("faults"):
        lines += ["## Faults artune recorded", ""] + [f"- {f}" for f in p["faults"]] + [""]
    return "\n".join(lines), analysed


# ---------------------------------------------------------------- plots

def plot(analysed, p, out_dir, gap, loopback=False):
    """compare.svg and compare.png in out_dir, or None with the reason there are none."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except Exception as e:  # noqa: BLE001 - plots are optional
        return f"plots skipped: matplotlib not importable ({type(e).__name__})"
    shown = [(g, r) for g, r, _ in analysed if r]
    if not shown:
        return "plots skipped: no group has torch rows"
    fig, axes = plt.subplots(len(shown), 2, figsize=(13, 3.6 * len(shown)), squeeze=False)
    sim = " [SIMULATED profile]" if p.get("simulated") else ""
    if loopback:
        sim += " [LOOPBACK: torch at another world size]"
    for (g, rows), (ax, axr) in zip(shown, axes):
        xs = [r["bytes"] for r in rows]
        names = sorted({k for r in rows for k in r["results"]})
        for n in names:
            ys = [r["results"].get(n, {}).get("median_us") for r in rows]
            ax.plot(xs, [y if y else float("nan") for y in ys], "--", lw=1, label=f"artune {n}")
        for impl in TORCH_IMPLS:
            ys = [r["torch"][impl] for r in rows]
            if any(ys):
                ax.plot(xs, [y if y else float("nan") for y in ys], "o-", ms=3, lw=1.6,
                        label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message bytes")
        ax.set_ylabel("µs per call (median)")
        ax.set_title(group_title(g) + sim, fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        for key, label in (("nccl_ratio", "nccl / torch NCCL"),
                           ("one_ratio", "one-stage / torch one_shot"),
                           ("two_ratio", "two-stage / torch two_shot")):
            ys = [r[key][1] if r[key][1] else float("nan") for r in rows]
            axr.plot(xs, ys, "o-", ms=3, label=label)
        axr.axhspan(1 - gap, 1 + gap, color="0.9")
        axr.axhline(1, color="0.5", lw=0.8)
        axr.set_xscale("log", base=2)
        axr.set_xlabel("message bytes")
        axr.set_ylabel("artune / torch (>1: artune slower)")
        axr.legend(fontsize=6)
    for ax in axes.flat:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(int(v))))
    fig.tight_layout()
    written = []
    for ext in ("svg", "png"):
        path = os.path.join(out_dir, f"compare.{ext}")
        atomic.replace(path, lambda tmp: fig.savefig(tmp, format=ext, dpi=110),
                       ".compare-", f".{ext}")
        written.append(path)
    plt.close(fig)
    return "plots: " + ", ".join(os.path.basename(w) for w in written)


# ---------------------------------------------------------------- main

def write_atomic(path, text):
    atomic.write_text(path, lambda f: f.write(text), ".compare-", ".md")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="artune profile JSON")
    ap.add_argument("--torch", action="append",
                    help="CSV from benches/torch_peers.py (repeat to merge several runs)")
    ap.add_argument("--out", default="compare.md", help="Markdown report to write")
    ap.add_argument("--plots", help="directory for compare.svg/.png (needs matplotlib)")
    ap.add_argument("--gap", type=float, default=0.10, help="flag |ratio-1| above this")
    ap.add_argument("--torch-tp", type=int, default=None,
                    help="use torch rows of this TP for every group (loopback profiles)")
    ap.add_argument("--self-test", action="store_true", help="run the built-in checks")
    a = ap.parse_args(argv)
    if a.self_test:
        return a
    if not a.profile or not a.torch:
        raise BadInput("--profile and --torch are both needed: the artune profile JSON and "
                       "the CSV torch_peers.py wrote.")
    if not 0 <= a.gap < 10:
        raise BadInput(f"--gap {a.gap} is not a fraction like 0.10.")
    for what, d in (("--out", os.path.dirname(os.path.abspath(a.out))), ("--plots", a.plots)):
        if d and not os.path.isdir(d):
            raise BadInput(f"{what} directory {d} does not exist: create it first.")
    return a


def run(a):
    p = load_profile(a.profile)
    rows = [r for path in a.torch for r in load_torch(path)]
    text, analysed = build(p, rows, a)
    note = (plot(analysed, p, a.plots, a.gap, a.torch_tp is not None) if a.plots
            else "plots not asked for (--plots DIR)")
    text += f"\n_{note}_\n"
    write_atomic(a.out, text)
    print(f"wrote {a.out}; {note}")
    return 0


def main(argv=None):
    try:
        a = parse_args(argv)
        return self_test() if a.self_test else run(a)
    except BadInput as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("compare: interrupted; no report written.", file=sys.stderr)
        return 130


# ---------------------------------------------------------------- self-test

def _fixture(d):
    t = lambda m: {"median_us": m, "ci_low_us": m, "ci_high_us": m, "samples": 10}  # noqa
    prof = {
        "schema_version": 1, "tool_version": "0.1.0", "created": "2026-01-01T00:00:00Z",
        "simulated": True, "fabric": "simulated test-2x",
        "versions": {"driver": None, "cuda": None, "nccl": "2.28.3"},
        "settings": {"tuning_seconds": 12.5, "tp": [2], "modes": ["graph"]},
        "groups": [{
            "gpus": [0, 1], "tp": 2, "mode": "graph", "dtype": "bf16", "placement": "x",
            "buckets": [
                {"bytes": 1024, "choice": "one_stage_pull",
                 "results": {"nccl": t(10.0), "one_stage_pull": t(5.0),
                             "one_stage_push": t(6.0), "two_stage_pull": t(8.0)}},
                {"bytes": 1536, "choice": "one_stage_pull",
                 "results": {"nccl": t(10.0), "one_stage_pull": t(5.5)}},
                {"bytes": 2048, "choice": "nccl",
                 "results": {"nccl": t(20.0), "one_stage_pull": t(25.0),
                             "two_stage_push": t(21.0)}},
            ],
            "crossovers": [],
            "memory": {"nccl": {"bytes_per_gpu": 3 << 20, "measured": False},
                       "one_stage_pull": {"bytes_per_gpu": 1 << 20, "measured": False,
                                          "serves_up_to_bytes": 2048,
                                          "required_bytes_per_gpu": 1 << 20}},
        }],
    }
    ppath = os.path.join(d, "p.json")
    with open(ppath, "w") as f:
        json.dump(prof, f)
    base = dict(p10_us="", p90_us="", iters=50, torch_version="2.11.0", nccl_version="2.28.9",
                gpu_name="Test GPU", date="2026-01-02T00:00:00Z", dtype="bf16",
                world_size=2, mem_bytes="", note="")
    rows = [
        dict(base, impl="torch_nccl", mode="graph", tp=2, bytes=1024, median_us=8.0,
             status="ok", mem_bytes=4 << 20),
        dict(base, impl="torch_one_shot", mode="graph", tp=2, bytes=1024, median_us=4.0,
             status="ok", mem_bytes=2 << 20),
        dict(base, impl="torch_two_shot", mode="graph", tp=2, bytes=1024, median_us="",
             status="skipped", note="world size 2 not supported here"),
        dict(base, impl="torch_nccl", mode="graph", tp=2, bytes=2048, median_us=19.5,
             status="ok"),
        dict(base, impl="torch_one_shot", mode="graph", tp=2, bytes=2048, median_us=30.0,
             status="ok"),
        dict(base, impl="torch_nccl", mode="eager", tp=2, bytes=1024, median_us=0.2,
             status="no-op", note="no GPU work"),
    ]
    cpath = os.path.join(d, "t.csv")
    with open(cpath, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) + ["status"])
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return ppath, cpath


def self_test():
    with tempfile.TemporaryDirectory() as d:
        ppath, cpath = _fixture(d)
        out = os.path.join(d, "r.md")
        assert main(["--profile", ppath, "--torch", cpath, "--out", out]) == 0
        text = open(out).read()
        assert "**SIMULATED profile.**" in text, "simulated profiles must be labelled"
        assert "tuning time | 12.50 s" in text
        # 1K: nccl 10 vs 8 -> 1.25 flagged; one-stage pull 5 vs one_shot 4 -> 1.25 flagged;
        # choice one_stage_pull 5.00 vs fastest torch_one_shot 4.00 -> regret 25.0%.
        row1k = next(line for line in text.splitlines() if line.startswith("| 1K |"))
        cells = [c.strip() for c in row1k.strip("|").split("|")]
        assert cells[1:4] == ["10.00", "8.00", "1.25 ⚠"], cells
        assert cells[4:7] == ["5.00 (pull)", "4.00", "1.25 ⚠"], cells
        assert cells[7:10] == ["8.00 (pull)", "-", "-"], cells
        assert cells[10:] == ["one_stage_pull 5.00", "torch_one_shot 4.00", "25.0%"], cells
        # 2K: 20 vs 19.5 -> 1.03, not flagged; choice nccl vs torch_nccl 19.5 -> regret 2.6%.
        row2k = next(line for line in text.splitlines() if line.startswith("| 2K |"))
        c2 = [c.strip() for c in row2k.strip("|").split("|")]
        assert c2[3] == "1.03" and c2[7] == "21.00 (push)" and c2[12] == "2.6%", c2
        # 1.5K has no torch row: left out and counted.
        assert "| 1536B |" not in text and "2 of the profile's 3 bucket sizes" in text
        assert "world size 2 not supported here" in text and "| skipped |" in text
        assert "| torch_one_shot | 2.0 MiB |" in text and "| artune nccl | 3.0 MiB |" in text
        assert "different NCCL builds" in text
        # Two CSVs (e.g. NCCL and symmetric memory run apart) merge to the same report.
        lines = open(cpath).read().splitlines(keepends=True)
        halves = [os.path.join(d, "a.csv"), os.path.join(d, "b.csv")]
        for path, body in zip(halves, (lines[1:3], lines[3:])):
            with open(path, "w") as f:
                f.writelines([lines[0]] + body)
        merged = os.path.join(d, "m.md")
        assert main(["--profile", ppath, "--torch", halves[0], "--torch", halves[1],
                     "--out", merged]) == 0
        strip = lambda t: [x for x in t.splitlines() if not x.startswith("| file |")]  # noqa
        assert strip(open(merged).read()) == strip(text)
        # Bad input: exit 2, no report left behind.
        gone = os.path.join(d, "none.md")
        assert main(["--profile", ppath, "--torch", ppath, "--out", gone]) == 2
        assert main(["--profile", cpath, "--torch", cpath, "--out", gone]) == 2
        assert main(["--profile", ppath, "--torch", cpath, "--out", gone,
                     "--torch-tp", "4"]) == 2
        with open(os.path.join(d, "tp8.csv"), "w") as f:
            f.write(open(cpath).read().replace(",2,", ",8,"))
        assert main(["--profile", ppath, "--torch", os.path.join(d, "tp8.csv"),
                     "--out", gone]) == 2
        assert not os.path.exists(gone)
        # Loopback: torch rows at TP 8 stand in for the TP 2 group, labelled.
        assert main(["--profile", ppath, "--torch", os.path.join(d, "tp8.csv"), "--out", out,
                     "--torch-tp", "8"]) == 0
        text = open(out).read()
        assert "**LOOPBACK comparison.**" in text
        # Loopback regret counts artune's backends only: 1K's choice is artune's fastest.
        row1k = next(line for line in text.splitlines() if line.startswith("| 1K |"))
        assert row1k.rstrip().endswith("| one_stage_pull 5.00 | 0.0% |"), row1k
        assert "| torch_nccl | eager | 8 | no-op | 1K (1) | no GPU work |" in text, text
        assert sorted(f for f in os.listdir(d) if f.startswith(".")) == []
    print("compare self-test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
