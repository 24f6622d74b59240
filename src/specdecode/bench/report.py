"""Turn run records into the numbers we publish: per-category metrics, a terminal table, JSON, plots.

Speedup follows Spec-Bench: the mean over prompts of each prompt's tokens/s,
divided by the same mean for our plain decoding, computed per repetition and
then averaged (± std over repetitions). Beside it we print what Leviathan's
model predicts from the measured α, c and v(γ), so a gap between the two
points at overhead the model does not see.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..sizing.costs import Costs, expected_tokens, predicted_speedup
from .ours import baseline_family, eager_baseline_family, paired_families
from .positions import by_output_position, format_output_position, plot_output_position, pyplot
from .runners import Method, MethodFailure, PreparedPrompt, RunRecord, Skipped
from .stats import Counts, counts_from_steps, first_mismatch, mean_std

OVERALL = "overall"
BASELINE = baseline_family()  # plain decoding's family
FP32_BASELINE = eager_baseline_family()  # the reference for runs in fp32 arithmetic (eager path, transformers)
_DRAFT, GAMMA_PICK_FAMILY = paired_families()  # the draft model's family and its gamma='auto' companion
DRAFT_MODEL_FAMILIES = frozenset({_DRAFT, *([GAMMA_PICK_FAMILY] if GAMMA_PICK_FAMILY else [])})  # c from the
# measured draft forward
NO_TOKEN_RUNTIMES = frozenset({"llama.cpp"})  # runtimes whose runs report timings, not token ids


@dataclass(frozen=True)
class Mismatch:
    method: str
    workload: str
    rep: int
    index: int  # first differing token
    expected: list[int]  # a few tokens of the baseline from there
    got: list[int]


def _ms(values: Sequence[float]) -> dict[str, float]:
    m, s = mean_std(values)
    return {"mean": m, "std": s}


def summarize(records: Sequence[RunRecord], methods: Sequence[Method], skipped: Sequence[Skipped],
              failures: Sequence[MethodFailure], prompts: Sequence[PreparedPrompt], costs: Optional[Costs],
              baseline: str = BASELINE, greedy: bool = True) -> dict[str, Any]:
    """Everything per method and category (plus 'overall'); pure arithmetic on the records. Sampled
    runs (``greedy`` False) have no reference output, so no exact-match check."""
    categories = sorted({p.workload.category for p in prompts}, key=_category_order) + [OVERALL]
    in_cat = {c: {p.workload.id for p in prompts if c in (OVERALL, p.workload.category)} for c in categories}
    reps = sorted({r.rep for r in records})
    by_method: dict[str, list[RunRecord]] = {}
    for r in records:
        by_method.setdefault(r.method, []).append(r)
    # Greedy outputs are compared with plain decoding on the same arithmetic: our fast path (bf16
    # products with --matmul bf16) against our plain; the fp32 runs (our eager path, transformers)
    # against our eager plain decoding when it ran.
    references = {name: {r.workload: r.output.token_ids for r in by_method.get(name, []) if r.rep == 0 and greedy}
                  for name in (baseline, FP32_BASELINE)}
    tps = {m: {(r.rep, r.workload): len(r.output.token_ids) / r.output.seconds
               for r in rs if r.output.seconds > 0} for m, rs in by_method.items()}
    failed = {f.method: f.error for f in failures}
    mismatches: list[Mismatch] = []
    out_methods: list[dict[str, Any]] = []
    for m in methods:
        rs = by_method.get(m.name, [])
        ref_name = (FP32_BASELINE if (m.runtime != "specdecode" or m.name.startswith("eager-"))
                    and references[FP32_BASELINE] else baseline)
        # llama.cpp's runs return no token ids to compare (llama-bench decodes its own tokens; bench/llamacpp.py)
        reference = references[ref_name] if m.runtime not in NO_TOKEN_RUNTIMES else {}
        entry: dict[str, Any] = {"name": m.name, "family": m.family, "runtime": m.runtime, "setting": m.setting,
                                 "status": "failed" if m.name in failed else "ok", "reason": failed.get(m.name)}
        for r in rs:
            ref = reference.get(r.workload)
            if ref is None or (m.name == ref_name and r.rep == 0):
                continue
            i = first_mismatch(ref, r.output.token_ids)
            if i >= 0:
                mismatches.append(Mismatch(m.name, r.workload, r.rep, i, ref[i:i + 8], r.output.token_ids[i:i + 8]))
        entry["categories"] = {c: _category_metrics(m, rs, in_cat[c], reps, tps, baseline, reference, costs)
                               for c in categories}
        out_methods.append(entry)
    for s in skipped:
        out_methods.append({"name": s.name, "family": s.family, "runtime": s.runtime, "setting": None,
                            "status": "skipped", "reason": s.reason, "categories": {}})
    return {"categories": categories, "methods": out_methods,
            "mismatches": [m.__dict__ for m in mismatches]}


def _category_order(c: str) -> tuple[int, str]:
    order = ("completion", "editing", "long", "code", "chat", "edit", "summarize", "reasoning")
    return (order.index(c) if c in order else len(order), c)


def _category_metrics(m: Method, rs: Sequence[RunRecord], ids: set[str], reps: Sequence[int],
                      tps: dict[str, dict[tuple[int, str], float]], baseline: str,
                      reference: dict[str, list[int]], costs: Optional[Costs]) -> dict[str, Any]:
    rs = [r for r in rs if r.workload in ids]
    mine = tps.get(m.name, {})
    base = tps.get(baseline, {})
    per_rep_tps, per_rep_speedup = [], []
    for rep in reps:
        ws = [w for (rp, w) in mine if rp == rep and w in ids]
        if not ws:
            continue
        per_rep_tps.append(sum(mine[(rep, w)] for w in ws) / len(ws))
        both = [w for w in ws if (rep, w) in base]
        if both:
            per_rep_speedup.append(sum(mine[(rep, w)] for w in both) / sum(base[(rep, w)] for w in both))
    out: dict[str, Any] = {
        "n_prompts": len({r.workload for r in rs}), "n_runs": len(rs),
        "new_tokens_mean": (sum(len(r.output.token_ids) for r in rs) / len(rs)) if rs else None,
        "tokens_per_s": _ms(per_rep_tps), "speedup": _ms(per_rep_speedup) if per_rep_speedup else None,
    }
    timed = [r for r in rs if r.output.prefill_seconds is not None]
    if timed:  # speculation shortens the decode steps only: this share of the time stays
        out["prefill_share"] = (sum(r.output.prefill_seconds or 0.0 for r in timed)
                                / max(1e-12, sum(r.output.seconds for r in timed)))
    checked = [r for r in rs if r.workload in reference]
    out["exact_match"] = (sum(reference[r.workload] == r.output.token_ids for r in checked) / len(checked)
                          if checked else None)
    traced = [r for r in rs if r.output.steps is not None]
    if not traced:
        return out
    counts = Counts()
    draft_s = 0.0
    for r in traced:
        counts.merge(counts_from_steps(r.output.steps or [], len(r.output.token_ids)))
        draft_s += r.output.draft_seconds
    out.update(tau=counts.tau, alpha_hat=counts.alpha_hat if counts.drafted else None,
               alpha_iid=counts.alpha_iid if counts.drafted else None,
               acceptance_by_position=counts.acceptance_by_position,
               acceptance_by_output_position=by_output_position([r.output.steps or [] for r in traced]),
               drafted_by_position=counts.drafted_by_position, accepted_by_position=counts.accepted_by_position,
               draft_length_hist=counts.draft_length_hist, target_passes=counts.passes)
    g = m.setting
    if costs is None or not counts.drafted:
        return out
    sp = out["speedup"]["mean"] if out["speedup"] else math.nan
    if g is None:  # trees and adaptive lengths: no one γ for Leviathan's formula
        if not costs.target_s:
            return out
        out.update(_unfixed_draft_costs(counts, draft_s, costs))
        out.update(efficiency=sp / out["predicted_speedup"], cost_model_efficiency=sp / out["cost_model_speedup"])
        return out
    # c: measured single-token forwards for a draft model; for drafters without a model
    # (prompt lookup) the engine's own drafting time per pass, in target-pass units.
    model_drafter = m.family in DRAFT_MODEL_FAMILIES and costs.draft_s is not None
    c = costs.c if model_drafter else draft_s / counts.passes / costs.target_s[0] / g
    v = costs.v_at(g)
    predicted = predicted_speedup(counts.alpha_iid, g, c, v)
    cost_model = counts.tau / counts.mean_pass_cost(c, costs.v_at)
    out.update(c=c, c_per="token", v=v, predicted_speedup=predicted, prediction="leviathan", efficiency=sp / predicted,
               cost_model_speedup=cost_model, cost_model_efficiency=sp / cost_model)
    return out


def _unfixed_draft_costs(counts: Counts, draft_s: float, costs: Costs) -> dict[str, Any]:
    """c, v and the predicted speedup of a method whose draft size varies per pass (trees, γ auto).

    Leviathan's E(α, γ) needs one γ and chain-shaped drafts; a tree's accepted length is not that
    law. What is measured instead: τ, the drafting time (the engine's, over every pass, so the
    passes where a drafter ran and proposed nothing count too) and the nodes verified per pass. In
    one-token target passes, c = draft time per drafting pass (one draft of any size: Medusa runs
    its heads once, EAGLE its layer once per level), v = the mean over drafting passes of v(nodes),
    and the prediction τ / (draft time per pass + mean v(nodes) per pass): what the measured costs
    give for the measured τ, so a gap to the measured speedup is overhead the model does not see
    (a tree's mask and path compaction, the drafter's planning). ``costs.v`` must reach the widest
    draft (the bench measures it after the runs, to the widest seen); beyond it v is extrapolated."""
    t1 = costs.target_s[0]
    hist = counts.draft_length_hist
    drafting = sum(hist[1:])
    v_mean = sum(n * costs.v_at(k) for k, n in enumerate(hist) if k and n) / drafting
    per_pass = draft_s / t1 / counts.passes + sum(n * costs.v_at(k) for k, n in enumerate(hist) if n) / counts.passes
    predicted = counts.tau / per_pass
    return {"c": draft_s / t1 / drafting, "c_per": "draft", "v": v_mean, "mean_nodes": counts.drafted / drafting,
            "max_nodes": len(hist) - 1, "predicted_speedup": predicted, "prediction": "cost-model",
            "cost_model_speedup": predicted}


# ---------------------------------------------------------------------------
# Terminal table
# ---------------------------------------------------------------------------

def _f(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _pm(d: Optional[dict[str, float]], fmt: str = "{:.2f}") -> str:
    if not d or math.isnan(d["mean"]):
        return "-"
    return f"{fmt.format(d['mean'])}±{fmt.format(d['std'])}"


def format_table(summary: dict[str, Any]) -> str:
    """Overall metrics per method, then speedup and τ per category; skipped methods listed with why."""
    head = ["method", "tok/s", "speedup", "tau", "a_hat", "a_iid", "c", "v(g|n)", "pred", "eff", "exact"]
    rows = []
    unfixed = False
    for m in summary["methods"]:
        if m["status"] == "skipped":
            continue
        o = m["categories"].get(OVERALL, {})
        star = "*" if o.get("c_per") == "draft" else ""
        unfixed = unfixed or bool(star)
        rows.append([m["name"], _pm(o.get("tokens_per_s"), "{:.1f}"), _pm(o.get("speedup")), _f(o.get("tau")),
                     _f(o.get("alpha_hat")), _f(o.get("alpha_iid")), _f(o.get("c"), "{:.3f}") + star,
                     _f(o.get("v")) + star, _f(o.get("predicted_speedup")) + star, _f(o.get("efficiency")),
                     _f(o.get("exact_match"), "{:.0%}") + ("" if m["status"] == "ok" else " FAILED")])
    lines = [_grid(head, rows)]
    if unfixed:
        lines.append("* no fixed γ (trees, γ auto): c = drafting time per draft, v = mean v(nodes) over drafting "
                     "passes, pred = τ / measured cost per pass (not Leviathan's E(α, γ))")
    cats = summary["categories"]
    head2 = ["method"] + [f"{c}: speedup (tau)" for c in cats]
    rows2 = []
    for m in summary["methods"]:
        if m["status"] == "skipped":
            continue
        row = [m["name"]]
        for c in cats:
            d = m["categories"].get(c, {})
            row.append(f"{_pm(d.get('speedup'))} ({_f(d.get('tau'))})")
        rows2.append(row)
    lines += ["", _grid(head2, rows2)]
    base = next((m for m in summary["methods"] if m["name"] == BASELINE and m["status"] == "ok"), None)
    shares = {c: (base["categories"].get(c) or {}).get("prefill_share") for c in cats} if base else {}
    if any(v is not None for v in shares.values()):
        lines.append(f"prefill's share of {BASELINE} decoding's time (no drafter shortens it): "
                     + ", ".join(f"{c} {v:.2f}" for c, v in shares.items() if v is not None))
    by_position = format_output_position(summary)
    if by_position:
        lines += ["", by_position]
    for m in summary["methods"]:
        if m["status"] != "ok":
            lines.append(f"{m['status']}: {m['name']}: {m['reason']}")
    mm = summary["mismatches"]
    if mm:
        lines.append(f"\n{len(mm)} output(s) differ from plain decoding on the same arithmetic "
                     "(greedy should match exactly):")
        for x in mm[:20]:
            lines.append(f"  {x['method']} on {x['workload']} (rep {x['rep']}): first difference at token "
                         f"{x['index']}: expected {x['expected']} got {x['got']}")
        if len(mm) > 20:
            lines.append(f"  ... and {len(mm) - 20} more (see the JSON)")
    return "\n".join(lines)


def _grid(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = lambda r: "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=_jsonable, allow_nan=False) + "\n")


def _jsonable(x: object) -> object:
    raise TypeError(f"cannot serialise {type(x).__name__}")


def finite(x: Any) -> Any:
    """NaN/inf -> None, recursively: JSON has no NaN and readers choke on it."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------

SWEPT_FAMILIES = ("draft", "lookup", "hf-assisted", "hf-lookup")


def _series(summary: dict[str, Any], family: str, cat: str, key: str) -> tuple[list[int], list[Any]]:
    pts = [(m["setting"], m["categories"].get(cat, {}).get(key)) for m in summary["methods"]
           if m["family"] == family and m["status"] == "ok" and m["setting"] is not None]
    pts = sorted(p for p in pts if p[1] is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def write_plots(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    """speedup_vs_gamma.png, tau_vs_theory.png, acceptance_by_position.png, acceptance_by_output_position.png
    (positions.py) (empty panels say why)."""
    plt = pyplot()
    cats = summary["categories"]
    paths = []

    fig, axes = plt.subplots(1, len(cats), figsize=(4.2 * len(cats), 3.6), squeeze=False, sharey=True)
    for ax, cat in zip(axes[0], cats):
        for fam in SWEPT_FAMILIES:
            xs, sp = _series(summary, fam, cat, "speedup")
            if xs:
                ax.errorbar(xs, [d["mean"] for d in sp], yerr=[d["std"] for d in sp], marker="o", capsize=3,
                            label=fam)
            px, pred = _series(summary, fam, cat, "predicted_speedup")
            if px:
                ax.plot(px, pred, linestyle="--", marker="x", alpha=0.6, label=f"{fam} (Leviathan prediction)")
        for m in summary["methods"]:
            sp_auto = (m["categories"].get(cat, {}).get("speedup")
                       if m["family"] == GAMMA_PICK_FAMILY and m["setting"] is not None else None)
            if sp_auto:
                ax.plot([m["setting"]], [sp_auto["mean"]], marker="*", markersize=14, linestyle="none",
                        color="C3", label=f"{m['name']} (cost model's pick)")
        unswept = [m for m in summary["methods"]
                   if m["status"] == "ok" and m["setting"] is None and m["name"] != BASELINE]
        for i, m in enumerate(unswept):
            sp1 = m["categories"].get(cat, {}).get("speedup")
            if sp1:
                ax.axhline(sp1["mean"], linestyle=":", color=f"C{7 + i}", label=f"{m['name']} (no γ)")
        ax.axhline(1.0, color="black", linewidth=0.8, label="plain (ours) = 1")
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.set_title(cat)
        ax.set_xlabel("γ (draft tokens per pass)")
    axes[0][0].set_ylabel("speedup over our plain decoding")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    paths.append(_save(fig, out_dir / "speedup_vs_gamma.png"))

    fams = [f for f in ("draft", "lookup") if _series(summary, f, OVERALL, "tau")[0]] or ["draft"]
    fig, axes = plt.subplots(1, len(fams), figsize=(5.2 * len(fams), 3.8), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        per_cat = [c for c in cats if c != OVERALL] or cats  # pooling categories would mix different α
        for i, cat in enumerate(per_cat):
            xs, taus = _series(summary, fam, cat, "tau")
            if not xs:
                continue
            color = f"C{i}"
            ax.plot(xs, taus, "o", color=color, label=f"{cat} measured")
            alpha = _pooled_alpha(summary, fam, cat)
            if alpha is not None:
                grid = list(range(0, max(xs) + 1))
                ax.plot(grid, [expected_tokens(alpha, g) for g in grid], "-", color=color, alpha=0.5,
                        label=f"{cat} theory, α={alpha:.2f}")
        _label(ax, f"{fam}: τ vs (1-α^(γ+1))/(1-α)", "γ", "tokens per target pass τ")
    paths.append(_save(fig, out_dir / "tau_vs_theory.png"))

    fig, axes = plt.subplots(1, len(fams), figsize=(5.2 * len(fams), 3.8), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for m in summary["methods"]:
            if m["family"] != fam or m["status"] != "ok":
                continue
            acc = m["categories"].get(OVERALL, {}).get("acceptance_by_position")
            if acc:
                ax.plot(range(1, len(acc) + 1), acc, marker="o", label=m["name"])
        ax.set_ylim(0, 1.02)
        _label(ax, f"{fam}: acceptance by draft position", "draft position i", "P(token i accepted | drafted)")
    paths.append(_save(fig, out_dir / "acceptance_by_position.png"))
    paths.append(_save(plot_output_position(summary), out_dir / "acceptance_by_output_position.png"))
    return paths


def _label(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    """Title, axis labels (integer ticks on x: γ and positions are counts) and a legend for one panel."""
    ax.xaxis.set_major_locator(pyplot().MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[1]:  # a panel with nothing to plot (no fixed γ ran) gets none
        ax.legend(fontsize=7)


def _pooled_alpha(summary: dict[str, Any], family: str, cat: str) -> Optional[float]:
    """α_iid pooled over all settings of a family: one α, so the theory curve is one curve."""
    acc = judged = 0.0
    for m in summary["methods"]:
        d = m["categories"].get(cat, {}) if m["family"] == family and m["status"] == "ok" else {}
        alpha_iid = d.get("alpha_iid")
        if alpha_iid is not None and alpha_iid > 0:
            a = sum(d["accepted_by_position"])
            acc += a
            judged += a / d["alpha_iid"]
    return acc / judged if judged else None


def _save(fig: Any, path: Path) -> Path:
    """Lay out, write and close a figure (closing frees it: a bench run draws several)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path


def format_markdown(payload: dict[str, Any], table: str, image_dir: str = "img") -> str:
    """A results section to paste into docs/benchmarks.md: setup line, the table, the plots."""
    cfg, costs = payload["config"], payload["costs"]
    v = cfg["versions"]
    lines = [
        f"Run {cfg['started']} ({cfg['duration_s']:.0f} s), commit `{cfg['git_commit']}`, {cfg['cpu']} "
        f"({cfg['cpu_count']} CPUs, load average {cfg['load_average_start_end'][0]:.1f} → "
        f"{cfg['load_average_start_end'][1]:.1f}), {cfg['threads']} thread(s), {cfg['dtype']}, "
        f"kernels {cfg.get('kernels') or 'none'}, torch {v['torch']}, "
        f"transformers {v['transformers']}, python {v['python']}.",
        f"Target {cfg['target']} ({cfg['target_parameters'] / 1e6:.1f}M parameters), draft {cfg['draft']} "
        f"({(cfg['draft_parameters'] or 0) / 1e6:.1f}M); {len(payload['workloads'])} prompts × {cfg['reps']} "
        f"repetitions; greedy, {'fixed budgets (EOS ignored)' if cfg['ignore_eos'] else 'stop at EOS'}.",
        "",
        f"Measured costs at {costs['context_len']} context tokens: c = {_f(costs['c'], '{:.3f}')}, "
        + ", ".join(f"v({g}) = {x:.2f}" for g, x in costs["v"].items() if int(g) > 0) + ".",
        "",
        "```",
        table,
        "```",
        "",
    ]
    lines += [f"![{p.removesuffix('.png')}]({image_dir}/{p})" for p in payload.get("plots", [])]
    return "\n".join(lines) + "\n"
