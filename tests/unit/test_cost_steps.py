"""The one cost timer (``sizing.costs.time_steps``) and the one cost cache, as tree drafters use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pytest
import torch

import specdecode as sd
import specdecode.sizing.book as book
import specdecode.sizing.costs as cm
from specdecode.sizing.costs import CostSteps, Step, measure_steps, time_steps
from specdecode.drafters.eagle import EagleDrafter, eagle_costs
from specdecode.drafters.medusa import MedusaDrafter, tree_costs
from specdecode.sizing.pricer import DEFAULT_PRICER

from eagle_util import make_eagle
from medusa_util import make_heads


class _Ticks:
    """A clock that advances only when a step says so: each step's time is exactly what it adds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_timer_interleaves_widths_skips_warmup_and_keeps_the_statistic() -> None:
    clock, log = _Ticks(), []

    def work(name: str, seconds: float) -> Step:
        def run() -> None:
            log.append(name)
            clock.now += seconds
        return Step(run, undo=lambda: log.append(f"undo {name}"))

    widths = {1: work("w1", 1.0), 2: work("w2", 2.0)}
    steps = {"draft": Step(work("d", 3.0).run, per=3), "pair": Step(work("p", 0.5).run, samples=2)}
    w, s = time_steps(widths, steps, clock, torch.device("cpu"), reps=2, statistic=max, warmup=1)
    assert w == {1: 1.0, 2: 2.0} and s == {"draft": 1.0, "pair": 0.5}  # ``per`` divides; warmup not kept
    # round 0 ascending, round 1 descending; a step's undo right after it, untimed; samples interleaved
    assert log[:8] == ["w1", "undo w1", "w2", "undo w2", "d", "p", "p", "w2"]
    assert log.count("d") == 3 and log.count("p") == 6


def test_measure_steps_reads_c_from_the_draft_step_and_the_rest_as_extras() -> None:
    clock = _Ticks()

    def pause(seconds: float) -> Step:
        return Step(lambda: setattr(clock, "now", clock.now + seconds))

    steps = CostSteps({1: pause(2.0), 3: pause(4.0)}, 3, 10, {"draft": pause(1.0), "level_one": pause(0.5)})

    class _Target:
        device = torch.device("cpu")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cm, "cost_clock", lambda target: clock)
        costs = measure_steps(steps, _Target(), reps=3)
    assert costs.v == (1.0, 1.5, 2.0)  # width 2 interpolated
    assert costs.c == pytest.approx(0.5) and costs.extra("level_one") == pytest.approx(0.25)
    assert costs.extra("missing") == 0.0 and costs.context_len == 10 and costs.repeats == 3


def _fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(book, "_MEMO", {})


def test_tree_drafters_measure_once_into_the_one_cache(tiny_dirs: dict[str, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_cache(tmp_path, monkeypatch)
    target = sd.load_model(tiny_dirs["llama"])
    medusa = MedusaDrafter.load(make_heads(tmp_path / "h", target.config.dim, target.vocab_size))
    medusa.prepare(target)  # measures (no costs given)
    costs, extra = tree_costs(target, medusa.cost_spec(target), DEFAULT_PRICER)
    # the passes' v(n) is the target's own, measured once for every drafter; the drafter times its steps
    shared = book.get_costs(target, book.target_spec(target))
    assert costs.v == shared.v and len(costs.v) == 16 and costs.c > 0 and extra >= 0.0
    assert costs.target_s[1:] == pytest.approx(tuple(costs.target_s[0] * v for v in shared.v[1:]))
    assert costs.key and {k for k, _ in costs.extras} == set()  # a tree step's extra: measured once, shared
    eagle = EagleDrafter.load(make_eagle(tmp_path / "e", target))
    eagle.prepare(target)
    got = eagle_costs(target, eagle.cost_spec(target), DEFAULT_PRICER)
    assert got.level == got.costs.c > 0 and got.ingest > 0 and got.level_one > 0 and got.tree_extra >= 0.0
    assert got.costs.v == shared.v
    files = sorted((tmp_path / "costs").glob("*.json"))
    # one cache directory: the target's passes, a tree step's extra, then one file per drafter shape
    assert len(files) == 4
    monkeypatch.setattr(book, "_MEMO", {})
    monkeypatch.setattr(book, "measure_steps", lambda *a, **k: pytest.fail("measured again despite the cache file"))
    assert tree_costs(target, medusa.cost_spec(target), DEFAULT_PRICER) == (costs, extra)
    assert eagle_costs(target, eagle.cost_spec(target), DEFAULT_PRICER) == got


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # the draft as one module call; the eager adapter step
def test_exit_adapter_step_is_timed_by_the_one_timer(arch: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from specdecode.drafters.exit_adapter import ExitAdapter, ExitAdapterConfig, ExitAdapterDrafter
    from specdecode.drafters.layerskip import LayerSkipDrafter
    from tiny import build_model

    _fresh_cache(tmp_path, monkeypatch)
    calls: list[tuple[str, ...]] = []
    timer = cm.time_steps

    def spy(widths: Mapping[int, Step], steps: Mapping[str, Step], *args: Any
            ) -> tuple[dict[int, float], dict[str, float]]:
        calls.append(tuple(steps))
        return timer(widths, steps, *args)

    monkeypatch.setattr("specdecode.drafters.exit_adapter.time_steps", spy)
    m = sd.load_model(build_model(tmp_path / arch, arch, seed=7, layers=4))
    adapter = ExitAdapter(ExitAdapterConfig.for_target(m, 2, 64, m.vocab_size), torch.arange(m.vocab_size),
                          m.max_seq_len)
    d = ExitAdapterDrafter(adapter, gamma="auto", quant=None)
    d.prepare_rows(m, 1, m.max_seq_len)
    plain = LayerSkipDrafter(exit_layer=2, gamma="auto")
    plain.prepare_rows(m, 1, m.max_seq_len)
    got, exit_only = d.costs_for(m), plain.costs_for(m)
    assert got is not None and exit_only is not None
    assert calls == [("ours", "plain")] and got.v == exit_only.v and got.c != exit_only.c and got.c >= 0.0
    assert d.runtime == ("dense" if arch == "llama" else "eager")  # which of the two steps was timed


def test_every_measurement_of_a_preparation_shares_one_prefill(tiny_dirs: dict[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The target's v(n), EAGLE's, Medusa's and a tree step's measurements prefill the synthetic context
    once between them (four prefills were 0.4 s of a cold server's first request), each hands the cache
    back at its length, and the core frees it once the drafter is prepared."""
    from specdecode.sizing import measure_context
    from specdecode.drafters.auto import AutoDrafter

    _fresh_cache(tmp_path, monkeypatch)
    target = sd.load_model(tiny_dirs["llama"])
    members = {"eagle": EagleDrafter.load(make_eagle(tmp_path / "e", target)),
               "medusa": MedusaDrafter.load(make_heads(tmp_path / "h", target.config.dim, target.vocab_size))}
    prefills: list[int] = []
    run = target.run

    def spy(tokens: torch.Tensor, cache: Any, *args: Any, **kwargs: Any) -> Any:
        if cache.length() == 0:  # into an empty cache: a prefill (the timed passes follow the context)
            prefills.append(tokens.shape[1])
        return run(tokens, cache, *args, **kwargs)

    monkeypatch.setattr(target, "run", spy)
    core = sd.DecodeCore(target, {"auto": AutoDrafter(members)}, max_rows=1, prepare=["auto"])
    # one, with EAGLE's hidden layers, of the context's first SEED tokens (the rest repeat them)
    assert prefills == [min(measure_context.SEED, len(measure_context.context_ids(target)))]
    assert len(list((tmp_path / "costs").glob("*.json"))) == 4  # and every figure measured
    assert measure_context._HELD.get(target) is None  # released by the core
    shared = measure_context.borrow(target, (0,))
    target.forward(shared.probe(5), shared.cache)  # a measurement that failed before rolling back
    again = measure_context.borrow(target)
    assert again is shared and again.cache.length() == len(again.ids) and 0 in again.layers
    n, seed = len(shared.ids), measure_context.SEED  # positions past the seed repeat it, states and entries
    assert n > seed and shared.hidden.shape[0] == shared.layers[0].shape[0] == n
    assert torch.equal(shared.hidden[seed:2 * seed], shared.hidden[:seed])
    assert torch.equal(shared.cache.k[:, 0, :, seed:n], shared.cache.k[:, 0, :, : n - seed])
    assert shared.cache.v[:, 0, :, n - 1].abs().sum() > 0
    wider = measure_context.borrow(target, (0, 1))  # a layer it lacks: prefilled again with both
    assert wider is not shared and set(wider.layers) == {0, 1} and len(prefills) == 3
    del core
