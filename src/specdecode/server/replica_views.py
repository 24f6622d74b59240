"""One view of several replicas: their /metrics merged, and their /health summed (``serve --ray``).

Each replica reports what its own /health and /metrics say; the front answers from the latest
reports. Counters and histograms add up across replicas, as do the load gauges; a ratio gauge
(α̂, τ) is recomputed from the summed counters it is the ratio of, since a sum or mean of ratios
would weigh a replica that ran little like one that ran much. Nothing here imports Ray.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

from prometheus_client.parser import text_string_to_metric_families

STALE_S = 6.0  # a replica reports every second; one silent this long is gone (killed, or being replaced)
ADDITIVE_GAUGES = frozenset({"specdecode_active_rows", "specdecode_queue_depth", "specdecode_tokens_per_second"})
# ratio gauge -> (numerator, denominator) counter samples it is computed from in metrics.py
RATIOS = {"specdecode_acceptance_rate": ("specdecode_accepted_tokens_total", "specdecode_draft_tokens_total"),
          "specdecode_mean_accepted_per_pass": ("specdecode_accepted_tokens_total",
                                                "specdecode_target_row_passes_total"),
          "specdecode_tokens_per_pass": ("specdecode_generated_tokens_total", "specdecode_target_row_passes_total")}
HEALTH_SUMS = ("active_rows", "queue_depth", "forward_passes")


@dataclass
class Report:
    """What one replica said last: its /health body and its /metrics text, and when."""

    replica: str
    health: dict[str, Any]
    metrics: str
    at: float


def fresh(reports: Iterable[Report], now: Optional[float] = None) -> list[Report]:
    t = time.monotonic() if now is None else now
    return sorted((r for r in reports if t - r.at <= STALE_S), key=lambda r: r.replica)


def merged_health(reports: list[Report], replicas_wanted: int, now: Optional[float] = None) -> tuple[int, dict]:
    """(status code, body): the first replica's /health fields with the load summed over the live ones, and
    ``replicas``, one line each. 200 while one replica serves; 503 while none has reported lately."""
    t = time.monotonic() if now is None else now
    if not reports:
        return 503, {"status": "unavailable", "replicas": [], "replicas_live": 0, "replicas_wanted": replicas_wanted}
    body = dict(reports[0].health)
    for key in HEALTH_SUMS:
        body[key] = sum(int(r.health.get(key) or 0) for r in reports)
    body["max_batch_size"] = sum(int(r.health.get("max_batch_size") or 0) for r in reports)
    statuses = [r.health.get("status") for r in reports]
    body["status"] = "ok" if "ok" in statuses else "warming" if "warming" in statuses else "draining"
    body["replicas"] = [{"replica": r.replica, "status": r.health.get("status"),
                         "active_rows": r.health.get("active_rows"), "queue_depth": r.health.get("queue_depth"),
                         "preparing": r.health.get("preparing"), "age_s": round(t - r.at, 1)} for r in reports]
    body["replicas_live"], body["replicas_wanted"] = len(reports), replicas_wanted
    return (503 if body["status"] == "draining" else 200), body


Key = tuple[str, tuple[tuple[str, str], ...]]


def merged_metrics(reports: list[Report], per_replica: bool = False) -> str:
    """Prometheus text: the replicas' samples summed (``per_replica``: each one's, with a ``replica`` label)."""
    docs: dict[str, tuple[str, str]] = {}  # family -> (type, help), in first-seen order
    samples: dict[str, dict[Key, float]] = {}
    for r in reports:
        for fam in text_string_to_metric_families(r.metrics):
            docs.setdefault(fam.name, (fam.type, fam.documentation))
            into = samples.setdefault(fam.name, {})
            for s in fam.samples:
                labels = dict(s.labels)
                if per_replica:
                    labels["replica"] = r.replica
                key = (s.name, tuple(sorted(labels.items())))
                if s.name.endswith("_created"):  # a start time: the earliest, not a sum
                    into[key] = min(into.get(key, math.inf), s.value)
                elif fam.type == "gauge" and not per_replica and fam.name not in ADDITIVE_GAUGES:
                    into[key] = math.nan  # a ratio: recomputed below, or shown per replica only
                else:
                    into[key] = into.get(key, 0.0) + s.value
    if not per_replica:
        totals = {name: v for fam in samples.values() for (name, labels), v in fam.items() if not labels}
        for gauge, (num, den) in RATIOS.items():
            if gauge in samples:
                d = totals.get(den, 0.0)
                samples[gauge] = {(gauge, ()): totals.get(num, 0.0) / d if d else 0.0}
    out: list[str] = []
    for name, (kind, doc) in docs.items():
        rows = [(k, v) for k, v in samples.get(name, {}).items() if not math.isnan(v)]
        if not rows:
            continue
        out.append(f"# HELP {name} {_escape_help(doc)}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{sample}{_labels(labels)} {_number(v)}" for (sample, labels), v in rows)
    return "\n".join(out) + "\n"


def only_role_chunks(piece: Union[bytes, bytearray]) -> bool:
    """Whether ``piece`` holds only a chat stream's opening events (the assistant role, no content yet)."""
    events = [e for e in bytes(piece).split(b"\n\n") if e.strip()]
    if not events:
        return False
    for event in events:
        if not event.startswith(b"data: {"):
            return False
        try:
            choices = json.loads(event[6:]).get("choices")
        except ValueError:
            return False
        if not choices or any(c.get("delta") != {"role": "assistant", "content": ""} for c in choices):
            return False
    return True


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in labels) + "}"


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if v != int(v) or abs(v) >= 1e15 else f"{int(v)}.0"
