"""`serve --ray` without Ray: its flags, the conversation key its router uses, and the merged /metrics and
/health the front answers with (replica_views.py). The Ray application itself: test_ray_serve.py (slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdecode.cli import main
from specdecode.config import ConfigError
from specdecode.server.metrics import ServerMetrics
from specdecode.server.ray_config import RayConfig, conversation_key
from specdecode.server.replica_views import Report, fresh, merged_health, merged_metrics, only_role_chunks


def chat(*messages: tuple[str, str]) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}).encode()


def test_conversation_key_is_shared_by_every_turn_and_names_follow_ups() -> None:
    first = chat(("system", "be brief"), ("user", "hi"))
    later = chat(("system", "be brief"), ("user", "hi"), ("assistant", "hello"), ("user", "and then?"))
    other = chat(("system", "be brief"), ("user", "bye"))
    k1, f1 = conversation_key(first)
    k2, f2 = conversation_key(later)
    k3, _ = conversation_key(other)
    assert k1 is not None and k1 == k2 and k1 != k3
    assert (f1, f2) == (False, True)
    for junk in (b"{", b"[]", b'{"messages": 3}', b'{"messages": [1]}', chat(("system", "no user turn"))):
        assert conversation_key(junk) == (None, False)


def test_ray_flags_are_checked_up_front() -> None:
    with pytest.raises(ConfigError, match="min-replicas 3 is above"):
        RayConfig(ray=True, min_replicas=3, max_replicas=2)
    with pytest.raises(ConfigError, match="both --min-replicas and --max-replicas"):
        RayConfig(ray=True, min_replicas=1)
    with pytest.raises(ConfigError, match="must lie in"):
        RayConfig(ray=True, replicas=5, min_replicas=1, max_replicas=2)
    assert RayConfig(ray=True).initial_replicas == 2
    assert RayConfig(ray=True, min_replicas=1, max_replicas=3).initial_replicas == 1


def test_a_ray_flag_without_ray_is_an_error_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--replicas", "3"]) == 2
    assert "--replicas only apply with --ray" in capsys.readouterr().err


def test_ray_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as on an install without the extra
    monkeypatch.delitem(sys.modules, "specdecode.server.ray_app", raising=False)
    assert main(["serve", "--ray"]) == 2
    assert "pip install 'specdecode[ray]'" in capsys.readouterr().err


def test_plain_serve_never_imports_ray() -> None:
    code = ("import sys, specdecode.server.cli, specdecode.server.app, specdecode.server.runner; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def replica_metrics(drafted: int, accepted: int, passes: int, active: int) -> str:
    m = ServerMetrics()
    m.observe_step(4, [(drafted, accepted, accepted + 1, [True] * accepted)] + [(0, 0, 1, [])] * (passes - 1))
    m.set_occupancy(active, 1)
    return m.render().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_merged_metrics_sum_counters_and_recompute_ratios() -> None:
    a = Report("a", {}, replica_metrics(drafted=8, accepted=6, passes=2, active=2), 0.0)
    b = Report("b", {}, replica_metrics(drafted=4, accepted=0, passes=4, active=1), 0.0)
    merged = samples(merged_metrics([a, b]))
    assert merged[("specdecode_draft_tokens_total", ())] == 12
    assert merged[("specdecode_accepted_tokens_total", ())] == 6
    assert merged[("specdecode_active_rows", ())] == 3
    assert merged[("specdecode_queue_depth", ())] == 2
    assert merged[("specdecode_acceptance_rate", ())] == pytest.approx(6 / 12)  # not the mean of 0.75 and 0
    assert merged[("specdecode_tokens_per_pass", ())] == pytest.approx((7 + 1 + 1 + 3) / 6)
    assert merged[("specdecode_batch_size_count", ())] == 2
    assert not any(name == "specdecode_acceptance_rate_by_position" for name, _ in merged)  # per replica only
    per = samples(merged_metrics([a, b], per_replica=True))
    assert per[("specdecode_draft_tokens_total", (("replica", "b"),))] == 4
    assert per[("specdecode_acceptance_rate", (("replica", "a"),))] == pytest.approx(0.75)


def test_merged_health_sums_the_load_and_drops_silent_replicas() -> None:
    base = {"model": "m", "max_batch_size": 4, "forward_passes": 10, "queue_depth": 1}
    a = Report("a", {**base, "status": "ok", "active_rows": 2}, "", at=100.0)
    b = Report("b", {**base, "status": "warming", "active_rows": 1}, "", at=99.0)
    gone = Report("c", {**base, "status": "ok", "active_rows": 4}, "", at=50.0)
    live = fresh([a, b, gone], now=100.5)
    assert [r.replica for r in live] == ["a", "b"]
    code, body = merged_health(live, 2, now=100.5)
    assert code == 200 and body["status"] == "ok" and body["model"] == "m"
    assert (body["active_rows"], body["queue_depth"], body["max_batch_size"], body["replicas_live"]) == (3, 2, 8, 2)
    assert [r["status"] for r in body["replicas"]] == ["ok", "warming"]
    assert merged_health([], 2)[0] == 503


def test_only_a_chat_streams_opening_is_held_back() -> None:
    opening = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    token = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    assert only_role_chunks(opening) and only_role_chunks(opening * 2)
    assert not only_role_chunks(opening + token) and not only_role_chunks(token)
    assert not only_role_chunks(b"") and not only_role_chunks(b"data: [DONE]\n\n")
    assert not only_role_chunks(b'data: {"error":{"message":"x"}}\n\n')
