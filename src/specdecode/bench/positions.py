"""Acceptance by output position: does drafting keep paying deep into a long answer?

Per-draft-position acceptance (report.py) says how far into one draft the target
agrees; this says how acceptance moves along the answer itself, in buckets of
``OUTPUT_BUCKET`` output tokens: a long reasoning chain may settle into a pattern a
lookup drafter copies, or drift away from anything a draft model predicts. Reported
per method and category in bench.json, as a table for the long categories, and as
acceptance_by_output_position.png.
"""

from __future__ import annotations

from typing import Any, Sequence

OUTPUT_BUCKET = 64  # output tokens per bucket
LONG_CATEGORIES = ("long", "reasoning")  # followed by output position (else the longest-running category)
OVERALL = "overall"


def by_output_position(traces: Sequence[Sequence[tuple[int, int]]], bucket: int = OUTPUT_BUCKET) -> dict[str, Any]:
    """Accepted / drafted draft tokens per ``bucket`` of output position, pooled over runs.

    A trace is a run's (drafted, accepted) per target pass; a pass counts in the bucket
    of the first token it emits, and emits its accepted tokens plus the target's own.
    Passes with no draft count nowhere, so plain decoding has no buckets.
    """
    drafted: list[int] = []
    accepted: list[int] = []
    for steps in traces:
        pos = 0
        for d, a in steps:
            b = pos // bucket
            if d:
                if b >= len(drafted):
                    drafted.extend([0] * (b + 1 - len(drafted)))
                    accepted.extend([0] * (b + 1 - len(accepted)))
                drafted[b] += d
                accepted[b] += a
            pos += a + 1
    return {"bucket_tokens": bucket, "drafted": drafted, "accepted": accepted,
            "acceptance": [a / d if d else None for a, d in zip(accepted, drafted)]}


def long_categories(summary: dict[str, Any]) -> list[str]:
    """The categories to follow by output position: the long ones, else the one with the longest outputs."""
    cats = [c for c in summary["categories"] if c != OVERALL]
    named = [c for c in cats if c in LONG_CATEGORIES]
    if named or not cats:
        return named
    lengths = {c: max((m["categories"].get(c, {}).get("new_tokens_mean") or 0 for m in summary["methods"]),
                      default=0) for c in cats}
    return [max(cats, key=lambda c: lengths[c])]


def _curves(summary: dict[str, Any], cat: str) -> list[tuple[str, dict[str, Any]]]:
    """(method, its buckets) for every method that drafted in ``cat``."""
    out = []
    for m in summary["methods"]:
        d = m["categories"].get(cat, {}).get("acceptance_by_output_position") if m["status"] == "ok" else None
        if d and any(d["drafted"]):
            out.append((m["name"], d))
    return out


def format_output_position(summary: dict[str, Any]) -> str:
    """One row per method of accepted/drafted per bucket, for each long category ('' when none has two buckets)."""
    blocks = []
    for cat in long_categories(summary):
        curves = _curves(summary, cat)
        width = max((len(d["drafted"]) for _, d in curves), default=0)
        if width < 2:
            continue  # one bucket says nothing about length
        name_w = max(len(n) for n, _ in curves)
        head = " ".join(f"{i * OUTPUT_BUCKET:>5}" for i in range(width))
        lines = [f"{cat}: acceptance (accepted / drafted) by output position, {OUTPUT_BUCKET}-token buckets from",
                 f"{'':<{name_w}}  {head}"]
        for name, d in curves:
            cells = [f"{a:5.2f}" if a is not None else "    -" for a in d["acceptance"]]
            lines.append(f"{name:<{name_w}}  " + " ".join(cells + ["    -"] * (width - len(cells))))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (the Agg backend: no display needed)."""
    import matplotlib.pyplot  # lazy: matplotlib (~0.3 s) loads only when a bench draws its plots

    matplotlib.use("Agg")  # a no-op once it is the backend: open figures stay open
    return matplotlib.pyplot


def plot_output_position(summary: dict[str, Any]) -> Any:
    """The figure: acceptance per bucket of output position, one line per drafting method, a panel per category."""
    plt = pyplot()
    cats = long_categories(summary) or [OVERALL]
    fig, axes = plt.subplots(1, len(cats), figsize=(5.6 * len(cats), 3.8), squeeze=False, sharey=True)
    for ax, cat in zip(axes[0], cats):
        curves = _curves(summary, cat)
        for name, d in curves:
            b = d["bucket_tokens"]
            pts = [(i * b + b / 2, a) for i, a in enumerate(d["acceptance"]) if a is not None]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=name)
        if curves:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no method drafted here", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=0)
        ax.set_title(f"{cat}: acceptance over the answer")
        ax.set_xlabel(f"output position (tokens, {OUTPUT_BUCKET}-token buckets)")
        ax.set_ylabel("accepted / drafted")
    return fig
