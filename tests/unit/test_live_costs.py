"""Issue #30 for the self-sizing drafters: their measured costs (the target's v(n), EAGLE's ingestion and
levels, Medusa's heads) are checked against the live steps, and a poisoned cost cache is corrected and
rewritten (``drafters/live_costs.py``)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

import pytest

import specdecode as sd
import specdecode.sizing.book as cm
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.core import REFINE_EVERY, DecodeCore
from specdecode.rows import FinishEvent, Request
from specdecode.sizing.book import cached_costs
from specdecode.sizing.costs import Costs
from specdecode.drafters.eagle import EagleCosts, EagleDrafter
from specdecode.drafters.eagle_sizing import refined_eagle_costs
from specdecode.sizing.live import Stored, StepTimings, costs_differ, live_v
from specdecode.drafters.medusa import MedusaDrafter
from specdecode.sizing.live import DISAGREE, TRUST

from eagle_util import make_eagle
from medusa_util import make_heads

V = (1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6)


def test_live_v_puts_in_the_widths_that_contradict_the_measurement_and_bounds_the_others() -> None:
    costs = Costs(c=0.0, v=V, target_s=tuple(0.01 * x for x in V), key="k")
    assert live_v(costs, {}) is None and live_v(costs, {4: 0.02}) is None  # no trusted one-token pass: no unit
    assert live_v(costs, {1: 0.01, 3: 0.0115}) is None  # within FOLLOW (10%) of the measurement: kept
    near = live_v(costs, {1: 0.01, 3: 0.0135})  # 23% dearer live: followed in memory, the file left as it is
    assert near is not None and near.v[2] == pytest.approx(1.35) and Stored(costs).changed(near) == []
    got = live_v(costs, {1: 0.01, 2: 0.03})  # width 2 costs 3 passes live, not 1.05
    assert got is not None and got.key == "k" and Stored(costs).changed(got) == [got]  # past DISAGREE: written
    assert got.v[1] == pytest.approx(3.0) and got.v[0] == 1.0
    assert got.v[2:] == V[2:]  # wider widths stay as measured: physics allows them to be cheaper (row blocking)
    got = live_v(costs, {1: 0.02, 8: 0.02})  # 8 tokens cost what one does live: no narrower pass costs more
    assert got is not None and got.v == (1.0,) * 8 and got.target_s == (0.02,) * 8


def test_widths_past_a_run_one_are_tried_when_the_cache_there_was_only_the_cap() -> None:
    """A cache whose wide widths were timed 3x too dear reads 1, 2, 3, ... (``plausible`` caps a width at n/m times
    a narrower one): a live v(2) of 1.5 against that capped 2.0 says little of how far the rest overstate, so the
    widths not run are taken at most at the dearest run one below them (they get run, so measured), where scaling
    them by 1.5 / 2.0 left width 3 at 2.25 and width 8 at 3.8 and ``auto`` drafting one token a step for good."""
    spoiled = (1.0, 2.0, 3.0, 4.0, 4.5, 4.8, 5.0, 5.3)  # what plausible() makes of 1, 3.5, 3.6, ...
    costs = Costs(c=0.0, v=spoiled, target_s=tuple(0.001 * x for x in spoiled), key="k")
    got = live_v(costs, {1: 0.001, 2: 0.0015})
    assert got is not None and got.v[:2] == (1.0, 1.5) and got.v[2:] == (1.5,) * 6
    sound = Costs(c=0.0, v=V, target_s=tuple(0.01 * x for x in V), key="k")  # not at the cap: scaled as before
    got = live_v(sound, {1: 0.01, 2: 0.021})
    assert got is not None and got.v[1] == pytest.approx(2.1) and got.v[2:] == V[2:]


def test_refinements_under_noise_do_not_compound() -> None:
    """Each refinement starts from the measurement (``Costs.measured``), never the last refinement: live passes
    0-12% dearer than the truth (load only adds time), refined 40 times, leave every width not run where it was
    measured, or within physics' bound of a live one. Rescaling each refinement by its lowest live/table ratio
    drove those widths to v = 1.0 within 20 refinements (a Gemma 3 table: 11-token chains priced as free, and
    written back to the cache)."""
    truth = (1.0, 1.17, 1.21, 1.24, 1.24, 1.24, 1.31, 1.40, 1.58, 1.70, 1.81, 1.92, 2.05, 2.16, 2.31, 2.46)
    costs = Costs(c=0.0, v=truth, target_s=tuple(0.01 * x for x in truth), key="k")
    rng = random.Random(0)
    for _ in range(40):
        costs = live_v(costs, {w: 0.01 * truth[w - 1] * (1 + rng.uniform(0.0, 0.12)) for w in (1, 2, 3, 4, 8)}) \
            or costs
        assert costs.measured_v == truth
        assert costs.v[4:6] == truth[4:6]
        # past the widest run width, only ``plausible``'s bound moves them (at most n/8 times the live v(8))
        assert all(costs.v[w - 1] >= 0.9 * truth[w - 1] for w in range(9, 17))


def _steps(**seconds: float) -> StepTimings:
    steps = StepTimings(lambda: 0.0)
    for name, s in seconds.items():
        for _ in range(TRUST):
            steps.add(name, s)
    return steps


def test_a_pessimistic_eagle_level_is_bounded_by_the_ingestion_then_replaced_by_its_own_timing() -> None:
    costs = Costs(c=1.5, v=V, target_s=tuple(0.01 * x for x in V), key="eagle")
    cur = EagleCosts(costs, level=1.5, tree_extra=0.03, ingest=0.1, level_one=1.5)
    passes = {1: 0.01}
    assert refined_eagle_costs(cur, _steps(), {}, 4) is None  # nothing trusted yet: nothing to go on
    bounded = refined_eagle_costs(cur, _steps(ingest=0.0011), passes, 4)
    assert bounded is not None  # a level of one node does less than an ingestion: 0.11, so it gets run
    assert bounded.ingest == pytest.approx(0.11) and bounded.level_one == pytest.approx(0.11)
    assert bounded.level == pytest.approx(0.44) and bounded.tree_extra == 0.03
    timed = refined_eagle_costs(bounded, _steps(ingest=0.0011, level_one=0.0004, level=0.0006), passes, 4)
    assert timed is not None and timed.level_one == pytest.approx(0.04) and timed.level == pytest.approx(0.06)
    assert refined_eagle_costs(timed, _steps(ingest=0.0011, level_one=0.00045, level=0.0006), passes, 4) is None
    written = timed.costs  # what the cache gets
    assert written.c == pytest.approx(0.06) and written.extra("level_one") == pytest.approx(0.04)
    assert written.key == "eagle" and EagleCosts.from_costs(written, 0.03) == timed  # it reads back the same


def _request(core: DecodeCore, name: str, prompt: list[int], tokens: int) -> None:
    """One greedy request as the server sends it (``adaptive``: the live passes are timed)."""
    core.add(Request(prompt, SamplingConfig(temperature=0.0), GenerationConfig(max_new_tokens=tokens,
                                                                               ignore_eos=True), name, adaptive=True))
    while core.rows:
        if any(isinstance(ev, FinishEvent) for _, ev in core.step()):
            return


@pytest.mark.parametrize("name", ["eagle", "medusa"])
def test_a_poisoned_tree_cost_cache_is_corrected_by_the_live_steps(name: str, tiny_dirs: dict[str, Path],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every figure of the drafter's cached file says a step costs 50 passes (no tree pays, and EAGLE would
    never run a level again): within a long request the live timings have replaced them, in the drafter and
    then on disk."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cm, "_MEMO", {})
    target = sd.load_model(tiny_dirs["llama"])
    build: Callable[[], EagleDrafter | MedusaDrafter] = (
        (lambda: EagleDrafter.load(make_eagle(tmp_path / "e", target))) if name == "eagle" else
        (lambda: MedusaDrafter.load(make_heads(tmp_path / "h", target.config.dim, target.vocab_size))))
    drafter = build()
    DecodeCore(target, {name: drafter}, max_rows=1, prepare=[name])  # measures and writes the cache
    spec = drafter.cost_spec(target)
    key = cm.cost_key(spec.models, spec.what)
    path = tmp_path / "cache" / "costs" / f"{key}.json"
    d = json.loads(path.read_text())
    extras = [[k, 50.0] for k, _ in d["extras"]]
    path.write_text(json.dumps(dict(d, c=50.0, extras=extras)))  # a measurement under load spoiled it
    monkeypatch.setattr(cm, "_MEMO", {})

    drafter = build()
    core = DecodeCore(target, {name: drafter}, max_rows=1, prepare=[name])
    assert drafter.costs is not None and drafter.costs.c == 50.0
    prompt = [i % target.vocab_size for i in range(3, 40)]
    core.add(Request(prompt, SamplingConfig(temperature=0.0), GenerationConfig(max_new_tokens=400, ignore_eos=True),
                     name, adaptive=True))
    while core.forward_passes < 2 * REFINE_EVERY + 1:  # a long request: checked while it runs, not only at its end
        core.step()
    assert core.rows and drafter.costs.c < 50.0 / DISAGREE
    while core.rows:
        core.step()
    for _ in range(3):
        _request(core, name, prompt, 48)
    assert drafter.costs.c < 50.0 / DISAGREE
    if isinstance(drafter, EagleDrafter):
        assert drafter._level_one < 50.0 / DISAGREE and drafter._ingest < 50.0 / DISAGREE
    monkeypatch.setattr(cm, "_MEMO", {})
    rewritten = cached_costs(key)
    # written when the figures in use left the file's by DISAGREE×; later moves within that stay in memory
    assert rewritten is not None and rewritten.c < 50.0 / DISAGREE and not costs_differ(drafter.costs, rewritten)


def test_the_drafters_hear_a_pass_width_as_soon_as_its_timings_are_trusted(tiny_dirs: dict[str, Path],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The core hands the self-sizing drafters the live passes when a single-row width's timings become trusted,
    not only at a request's end and every ``REFINE_EVERY`` passes: after a 3x pessimistic cache, ``auto`` on the
    bundled pair drafted from the 2nd request at best, and with a faster plain step from the 3rd or 4th."""
    from specdecode.drafters.base import as_batch_drafter
    from specdecode.drafters.ngram import PromptLookupDrafter

    target = sd.load_model(tiny_dirs["llama"])
    drafter = as_batch_drafter(PromptLookupDrafter())
    core = DecodeCore(target, {"ngram": drafter}, max_rows=1)
    heard: list[tuple[int, dict[int, float]]] = []
    real = drafter.refine_costs

    def spy(passes: dict[int, float]) -> list[Costs]:
        heard.append((core.forward_passes, dict(passes)))
        return real(passes)

    monkeypatch.setattr(drafter, "refine_costs", spy)
    prompt = [i % target.vocab_size for i in range(3, 30)]
    core.add(Request(prompt, SamplingConfig(temperature=0.0), GenerationConfig(max_new_tokens=40, ignore_eos=True),
                     "ngram", adaptive=True))
    while core.rows and not heard:
        core.step()
    assert core.rows, "heard only at the request's end"
    at, passes = heard[0]
    assert at < REFINE_EVERY and passes  # a width's trusted timing, handed over at once
