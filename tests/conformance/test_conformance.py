"""What every registered drafter must pass, parametrised over the registry (the table in ``kit.py``
says what each is built from):

* greedy identity: generate() with the drafter emits plain decoding's tokens;
* batch rows: three requests in one decode core, finishing at different steps (so the last row is
  moved into a freed one, ``move_row``), each equal to its plain decoding;
* a streaming server request equals plain decoding;
* its bench methods run and match the baseline exactly;
* without its draft model or artifact: its own error in the library, the server and the bench;
* output law (full tier; one drafter in the fast tier): sampled, the first 3 tokens follow the target's
  exact law by chi-square, and the same samples reject another model's law (the test has power).

Per-drafter tests elsewhere keep only what is specific to one drafter.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest
import torch

import specdecode as sd
from specdecode.config import ConfigError, SamplingConfig
from specdecode.core import DecodeCore
from specdecode.drafters import DrafterOptions
from specdecode.drafters.registry import PLAIN, REGISTRY, build_drafter, get_spec
from specdecode.sampling import probs_from_logits
from specdecode.server.config import ServerConfig
from specdecode.server.state import make_state
from specdecode.sizing.policy import GammaPolicy
from tiny import build_model
from core_rows import run_rows

from exactness.chi2 import gof_pvalue
from server_helpers import RunningServer, start_server

from kit import FREE, TABLE, Needs

NAMES = list(REGISTRY)
PROMPTS = ["def fib(n):\n", "class Point:\n    def __init__(self", "def add(a, b):\n    return a"]


@pytest.fixture(scope="module", autouse=True)
def own_cost_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Measured costs of these random models go to a scratch cache, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDECODE_CACHE", str(tmp_path_factory.mktemp("costs")))
        yield


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, device: str,
          dtype: str) -> tuple[sd.Model, sd.Model, dict[str, Needs]]:
    """A tiny 3-layer target with a tokenizer, a draft sharing it, and every drafter's needs, on ``--device``
    in ``--dtype`` (the artifacts are made from the CPU copy, as training writes them)."""
    root = tmp_path_factory.mktemp("conformance")
    t = build_model(root / "t", "llama", seed=0, layers=3)
    target = sd.load_model(t, device=device, dtype=dtype)
    draft = sd.load_model(build_model(root / "d", "llama", seed=4, layers=1, hidden=32), device=device, dtype=dtype)
    maker = target if device == "cpu" else sd.load_model(t)
    return target, draft, {name: kit(maker, root / name) for name, kit in TABLE.items()}


def runs_here(target: sd.Model, needs: Needs, name: str) -> None:
    """A drafter for the CPU's fp32 path with a target elsewhere (``--device cuda``, ``--dtype bf16``): its own
    error, then the test is skipped."""
    if needs.cpu_fp32_only and (target.device.type != "cpu" or target.dtype != torch.float32):
        with pytest.raises(ConfigError, match="CPU only|fp32 activations"):
            sd.generate(target, PROMPTS[0], drafter=build_drafter(name, needs.options_for(None)),  # type: ignore[arg-type]
                        max_new_tokens=2, ignore_eos=True)
        pytest.skip(f"{name} runs on the CPU in fp32 only (its error on {target.device}, {target.dtype} was checked)")


def _drafter(setup: tuple[sd.Model, sd.Model, dict[str, Needs]], name: str) -> object:
    """The drafter built by the registry from the table's needs."""
    target, draft, needs = setup
    runs_here(target, needs[name], name)
    return build_drafter(name, needs[name].options_for(draft))


def test_the_table_lists_every_registered_drafter() -> None:
    assert set(TABLE) == set(REGISTRY), "add the drafter's line to tests/conformance/kit.py"


@pytest.mark.parametrize("name", NAMES)
def test_greedy_identity(setup: tuple[sd.Model, sd.Model, dict[str, Needs]], name: str) -> None:
    target, pricer = setup[0], setup[2][name].pricer
    drafter = _drafter(setup, name)
    drafted = accepted = 0
    for prompt in PROMPTS:
        plain = sd.generate(target, prompt, max_new_tokens=24, ignore_eos=True)
        out = sd.generate(target, prompt, drafter=drafter, max_new_tokens=24, ignore_eos=True,  # type: ignore[arg-type]
                          pricer=pricer)
        assert out.token_ids == plain.token_ids, name
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    print(f"{name}: {drafted} drafted, {accepted} accepted")
    assert drafted > 0 or name == PLAIN, f"{name} never drafted: the identity is vacuous"


@pytest.mark.parametrize("name", NAMES)
def test_batch_rows_and_move_row(setup: tuple[sd.Model, sd.Model, dict[str, Needs]], name: str) -> None:
    """Three rows added at different steps; the middle one finishes first, so the last row moves into it."""
    target = setup[0]
    budgets = [30, 12, 22]
    ref = [sd.generate(target, p, max_new_tokens=n, ignore_eos=True).token_ids for p, n in zip(PROMPTS, budgets)]
    drafter = _drafter(setup, name)
    core = DecodeCore(target, {name: drafter} if drafter is not None else {}, max_rows=3,  # type: ignore[dict-item]
                      policy=GammaPolicy(setup[2][name].pricer))
    assert run_rows(core, target, PROMPTS, budgets, name if drafter is not None else None) == ref, name


@pytest.fixture(scope="module")
def server(setup: tuple[sd.Model, sd.Model, dict[str, Needs]]) -> Iterator[RunningServer]:
    """One server offering every registered drafter, each from the table's artifacts and options."""
    target, draft, needs = setup
    artifacts = {k: str(v) for n in needs.values() for k, v in n.artifacts.items()}
    options = {k: v for n in needs.values() for k, v in n.options.items()}
    state = make_state(target, draft, ServerConfig(max_batch_size=4, request_timeout=120),
                       default_drafter=PLAIN, options=options, artifacts=artifacts, pricer=FREE)
    running = start_server(state)  # FREE for every drafter: it prepares each at its first request
    try:
        yield running
    finally:
        running.stop()


def _stream(server: RunningServer, prompt: str, drafter: str) -> str:
    body = {"model": server.state.model_name, "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True,
            "drafter": drafter}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


@pytest.mark.parametrize("name", NAMES)
def test_streaming_server_request(setup: tuple[sd.Model, sd.Model, dict[str, Needs]], server: RunningServer,
                                  name: str) -> None:
    runs_here(setup[0], setup[2][name], name)
    assert name in server.state.scheduler.drafters or name == PLAIN
    assert _stream(server, PROMPTS[0], name) == _stream(server, PROMPTS[0], PLAIN)


@pytest.mark.parametrize("name", NAMES)
def test_bench_methods(setup: tuple[sd.Model, sd.Model, dict[str, Needs]], name: str) -> None:
    from specdecode.bench.ours import baseline_family, bench_families
    from specdecode.bench.runners import BenchContext, build_methods

    target, draft, needs = setup
    runs_here(target, needs[name], name)
    n = needs[name]
    spec = get_spec(name)
    ctx = BenchContext(target, draft, str(target.path), str(draft.path), options=n.options,
                       artifacts={k: str(v) for k, v in n.artifacts.items()}, pricer=n.pricer)
    families = [baseline_family()] + [b.family for b in bench_families() if b.drafter == name and not b.eager]
    methods, skipped = build_methods(ctx, families, {"gammas": [2], "lookup_tokens": [3], "peer_gammas": [2]})
    assert all("--temperature" in s.reason for s in skipped), skipped  # only the sampled-only families
    assert len(methods) > 1 or spec.name == PLAIN
    prompt = target.encode(PROMPTS[2])
    runs = [m.run(prompt, 16) for m in methods]
    assert all(r.token_ids == runs[0].token_ids for r in runs), [m.name for m in methods]


@pytest.mark.parametrize("name", [n for n, s in REGISTRY.items()
                                  if any(a.required for a in s.artifacts) or s.needs_draft_model])
def test_its_error_without_what_it_needs(setup: tuple[sd.Model, sd.Model, dict[str, Needs]], name: str) -> None:
    from specdecode.bench.ours import bench_families
    from specdecode.bench.runners import BenchContext, build_methods

    target = setup[0]
    spec = get_spec(name)
    required = [a for a in spec.artifacts if a.required]
    hint = required[0].train if required else "--draft DIR"
    with pytest.raises(ConfigError) as e:
        build_drafter(name, DrafterOptions())
    assert f"drafter {name!r} needs" in str(e.value) and hint in str(e.value)
    with pytest.raises(ConfigError, match=f"default drafter {name!r} needs"):
        make_state(target, None, ServerConfig(), default_drafter=name)
    ctx = BenchContext(target, None, str(target.path), None)
    methods, skipped = build_methods(ctx, [b.family for b in bench_families() if b.drafter == name], {"gammas": [2]})
    assert not methods and skipped, skipped
    assert all(any(w in s.reason for w in ("--draft", hint, "--temperature")) for s in skipped), skipped


# -- output law (full tier) ----------------------------------------------------------------------
V, N, LAW_PROMPT = 8, 2500, [1, 2, 3, 1, 2]


def exact_law(model: sd.Model, cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    """All V^3 continuations of LAW_PROMPT, each the product of its filtered conditionals (one pass)."""
    seqs = list(itertools.product(range(V), repeat=3))
    ids = torch.tensor([LAW_PROMPT + list(s) for s in seqs], device=model.device)
    with torch.inference_mode():
        logits = model.module(ids).float()
    n = len(LAW_PROMPT)
    law = {}
    for row, s in enumerate(seqs):
        probs = probs_from_logits(logits[row, n - 1: n + 2], cfg)
        law[s] = float(probs[0, s[0]] * probs[1, s[1]] * probs[2, s[2]])
    return law


@pytest.fixture(scope="module")
def law_setup(tmp_path_factory: pytest.TempPathFactory, device: str, dtype: str
              ) -> tuple[sd.Model, sd.Model, Optional[sd.Model], Path]:
    from exactness.test_crosstok_law import _write_tokenizer

    root = tmp_path_factory.mktemp("law")
    t = build_model(root / "t", "llama", vocab_size=V, tokenizer=False, layers=3, seed=31)
    _write_tokenizer(t, [], special=False)  # one character a..h per token: a draft may re-tokenize its text
    target = sd.load_model(t, device=device, dtype=dtype)
    other = sd.load_model(build_model(root / "o", "llama", vocab_size=V, tokenizer=False, layers=3, seed=12),
                          device=device, dtype=dtype)
    draft = sd.load_model(build_model(root / "d", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1,
                                      seed=13), device=device, dtype=dtype)
    return target, other, draft, root


@pytest.mark.parametrize("name", [n for n in NAMES if n != PLAIN])  # fast tier: one case (tests/conftest.py)
def test_output_law(law_setup: tuple[sd.Model, sd.Model, sd.Model, Path], name: str) -> None:
    target, other, draft, root = law_setup
    needs = TABLE[name](target if target.device.type == "cpu" else sd.load_model(target.path), root / name)
    runs_here(target, needs, name)
    if needs.law_draft is not None:
        draft = sd.load_model(needs.law_draft(root / name / "draft"), device=target.device.type, dtype=target.dtype)
    drafter = build_drafter(name, needs.options_for(draft))
    cfg = SamplingConfig(temperature=1.0)
    samples, accepted = [], 0
    for seed in range(N):
        r = sd.generate(target, LAW_PROMPT, drafter=drafter, max_new_tokens=3, temperature=cfg.temperature,  # type: ignore[arg-type]
                        seed=seed, ignore_eos=True, accept_rule="rejection", pricer=needs.pricer)
        samples.append(tuple(r.token_ids))
        accepted += sum(r.from_draft)
    least = N // 50 if needs.min_accepted is None else needs.min_accepted
    assert accepted >= least, (name, accepted)  # drafts were really proposed and accepted: not vacuous
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3, name
    assert gof_pvalue(samples, exact_law(other, cfg)) < 1e-6, name  # power: another model's law is rejected
