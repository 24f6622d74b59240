"""Draft length is decided in one place (issue 48): drafters propose, ``specdecode.sizing`` decides.

A drafter never imports the γ policy (its constants would make a second decision-maker that must agree with
the first); it asks the pricer the core hands it. The cost book has one key function and one cache, which
only ``sizing/book.py`` touches.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specdecode as sd
from specdecode.drafters.auto import AutoDrafter
from specdecode.drafters.suffix import SuffixDrafter
from specdecode.sizing.costs import Costs
from specdecode.sizing.policy import GammaPolicy
from specdecode.sizing.pricer import DEFAULT_PRICER, Pricer

SRC = Path(sd.__file__).parent
DRAFTERS = sorted((SRC / "drafters").glob("*.py"))
POLICY_NAMES = {"SPECULATION_MARGIN", "MIN_DELTA_C", "DISAGREE", "TRUST", "GammaPolicy", "RowPlan"}


def imports(path: Path) -> list[tuple[str, set[str]]]:
    """(module, names) of every import in a file, relative imports resolved against its package."""
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append((module, {a.name for a in node.names}))
        elif isinstance(node, ast.Import):
            out += [(a.name, set()) for a in node.names]
    return out


@pytest.mark.parametrize("path", DRAFTERS, ids=lambda p: p.name)
def test_no_drafter_imports_the_policy_or_its_constants(path: Path) -> None:
    for module, names in imports(path):
        assert module not in ("specdecode.sizing.policy", "specdecode.costmodel", "specdecode.policy"), \
            f"{path.name} imports {module}: ask the pricer the core hands it (sizing/pricer.py)"
        assert not names & POLICY_NAMES, f"{path.name} imports {sorted(names & POLICY_NAMES)} from {module}"
        # costs come through the pricer too, so a caller (or a test) hands figures without patching a module
        assert not names & {"get_costs", "cached_costs"}, f"{path.name} fetches costs itself: use self.pricer.costs"
        # a drafter reaches the sizing layer through its drafter-facing modules only
        if module.startswith("specdecode.sizing."):
            assert module.rsplit(".", 1)[1] in {"book", "costs", "estimate", "gamma", "live", "measure_context",
                                                "pricer"}, f"{path.name} imports {module}"


def test_only_the_book_keys_and_caches_costs() -> None:
    """One key function, one cache: nothing else hashes a cost key or reads the cache's memory."""
    for path in SRC.rglob("*.py"):
        if path.name == "book.py" and path.parent.name == "sizing":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & {"cost_key", "cached_costs", "store_costs", "get_costs"}, path
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert "_MEMO" not in used, path


def test_the_core_hands_its_policys_pricer_to_every_drafter_auto_to_its_members(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    suffix = SuffixDrafter(costs=Costs(c=0.0, v=tuple([1.0] * 16)))
    inner = SuffixDrafter(costs=Costs(c=0.0, v=tuple([1.0] * 16)))
    auto = AutoDrafter({"suffix": inner})
    assert suffix.pricer is DEFAULT_PRICER and auto.pricer is DEFAULT_PRICER
    policy = GammaPolicy(Pricer(3.0))
    sd.DecodeCore(target, {"suffix": suffix, "auto": auto}, policy=policy)
    assert suffix.pricer is policy.pricer and suffix.pricer.margin == 3.0
    assert auto.pricer is policy.pricer and inner.pricer is policy.pricer


def test_a_self_sizing_drafter_sizes_by_the_pricer_it_is_handed(tiny_dirs: dict[str, Path]) -> None:
    """Suffix drafting on text that repeats: at the policy's margin it drafts, at a margin no draft can beat it
    drafts nothing, and the tokens are plain decoding's either way."""
    from specdecode.config import GenerationConfig
    from specdecode.rows import Request

    target = sd.load_model(tiny_dirs["llama"])
    prompt = target.encode("def add(a, b):\n    return a + b\n" * 6)
    plain = sd.generate(target, prompt, max_new_tokens=24, ignore_eos=True).token_ids

    def drafted(margin: float) -> tuple[int, list[int]]:
        drafter = SuffixDrafter(costs=Costs(c=0.0, v=tuple([1.0] * 16)))
        core = sd.DecodeCore(target, {"suffix": drafter}, policy=GammaPolicy(Pricer(margin)))
        core.add(Request(prompt, generation=GenerationConfig(max_new_tokens=24, ignore_eos=True), drafter="suffix"))
        tokens: list[int] = []
        n = 0
        while core.rows:
            for _, ev in core.step():
                if isinstance(ev, sd.StepEvent):
                    tokens += ev.token_ids
                    n += ev.drafted
        return n, tokens

    cheap, expensive = drafted(1.0), drafted(Pricer().margin * 1000)
    assert cheap[0] > 0 and expensive[0] == 0
    assert cheap[1] == expensive[1] == plain


def test_every_drafter_fetches_its_costs_through_the_pricer_it_is_handed(tiny_dirs: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    """The core's pricer is the one cost source: each drafter's specs reach its book, and the figures it
    hands back are the ones the drafter and the policy then size with (no module patched)."""
    from specdecode.drafters.registry import build_drafter
    from specdecode.drafters import DrafterOptions
    from medusa_util import make_heads
    from eagle_util import make_eagle

    target = sd.load_model(tiny_dirs["llama"])
    draft = sd.load_model(tiny_dirs["llama"])
    figures = Costs(c=0.01, v=tuple(1.0 + 0.01 * k for k in range(64)))
    asked: list[str] = []

    def book(model: sd.Model, spec: object) -> Costs:
        asked.append(getattr(spec, "label"))
        return figures

    artifacts = {"medusa": str(make_heads(tmp_path / "heads", target.config.dim, target.vocab_size)),
                 "eagle": str(make_eagle(tmp_path / "eagle", target))}
    for name in ("model", "layerskip", "quant", "medusa", "eagle", "suffix", "auto"):
        asked.clear()
        drafter = build_drafter(name, DrafterOptions(draft=draft, gamma="auto", artifacts=artifacts,
                                                     options={"exit_layer": 1}))
        policy = GammaPolicy(Pricer(book=book))
        sd.DecodeCore(target, {name: drafter}, policy=policy)  # type: ignore[dict-item]
        assert asked, f"{name} fetched no costs through its pricer"
        got = policy.offline(name)
        assert got is None or got.v[:4] == figures.v[:4], (name, got)
