"""Cost cache files are checked on load and written as strict JSON (issue 49): a NaN read back from a file
passed ``c < 0``, reached /health's JSON and made it answer 500."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

import specdecode.sizing.book as cm
from specdecode.sizing.book import cached_costs, sane_costs, store_costs
from specdecode.sizing.costs import Costs

GOOD = Costs(c=0.2, v=(1.0, 1.1, 1.3), target_s=(0.01, 0.011, 0.013), draft_s=0.002, context_len=64, repeats=5,
             key="k0", extras=(("head", 0.05),))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(cm, "_MEMO", {})
    return tmp_path / "costs"


def _write(cache: Path, key: str, **changes: Any) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"{key}.json").write_text(json.dumps({**asdict(GOOD), "key": key, **changes}))  # json writes NaN


def test_a_sound_file_loads(cache: Path) -> None:
    _write(cache, "k0")
    assert cached_costs("k0") == GOOD


@pytest.mark.parametrize("changes", [
    {"c": float("nan")}, {"c": float("inf")}, {"c": -0.1},
    {"v": [1.0, float("nan"), 1.2]}, {"v": [1.0, float("inf")]}, {"v": [1.0, 0.5]}, {"v": [2.0, 2.5]}, {"v": []},
    {"target_s": [0.01, float("nan")]}, {"target_s": [0.0, 0.01]}, {"draft_s": float("nan")}, {"draft_s": -1.0},
    {"draft_s": "fast"}, {"extras": [["head", float("inf")]]}, {"repeats": -3},
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_a_file_no_measurement_can_give_is_treated_as_absent(cache: Path, changes: dict[str, Any]) -> None:
    _write(cache, "bad", **changes)
    assert cached_costs("bad") is None  # the caller measures again and overwrites it


def test_the_measurement_behind_refined_costs_is_kept(cache: Path) -> None:
    """A refined table carries the measurement it was refined from (``Costs.measured``), so that the next
    process refines from the measurement too, not from a refinement (``sizing.live.refined_v``)."""
    refined = replace(GOOD, v=(1.0, 1.05, 1.2), measured=GOOD.v)
    store_costs(refined)
    cm._MEMO.clear()
    assert cached_costs("k0") == refined and refined.measured_v == GOOD.v and GOOD.measured_v == GOOD.v
    _write(cache, "short", measured=[1.0, 1.1])  # not one figure a width
    _write(cache, "low", measured=[1.0, 0.5, 1.2])
    assert cached_costs("short") is None and cached_costs("low") is None


def test_costs_are_written_as_strict_json_and_insane_ones_not_at_all(cache: Path) -> None:
    store_costs(GOOD)
    text = (cache / "k0.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a cost file"))
    bad = Costs(c=float("nan"), v=(1.0, 1.2), key="k1")
    assert not sane_costs(bad)
    store_costs(bad)
    assert not (cache / "k1.json").exists()
    cm._MEMO.clear()
    assert cached_costs("k1") is None
