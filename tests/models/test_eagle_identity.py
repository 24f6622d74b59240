"""EAGLE drafts (dynamic trees) give exactly plain greedy decoding's tokens on llama, qwen2 and gpt2,
through the Python API, the registry (``--drafter eagle``) and batched rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode import generate
from specdecode.config import ConfigError, GenerationConfig
from specdecode.core import DecodeCore
from specdecode.rows import Request
from specdecode.drafters import DrafterOptions, build_drafter
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.eagle_model import EagleError
from specdecode.models import load_model

from eagle_util import FLAT, make_eagle

PROMPTS = ["def add(a, b):\n    return", "class Point:\n    def __init__(self", "fib(n - 1) +"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_eagle_greedy_equals_plain(arch: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    target = load_model(tiny_dirs[arch])
    drafter = EagleDrafter.load(make_eagle(tmp_path / "eagle", target, seed=len(arch), draft_vocab=200),
                                costs=FLAT, gamma=12)
    drafted = 0
    for prompt in PROMPTS:
        plain = generate(target, prompt, max_new_tokens=40, ignore_eos=True)
        spec = generate(target, prompt, drafter, max_new_tokens=40, ignore_eos=True)
        assert spec.token_ids == plain.token_ids, (arch, prompt)
        drafted += spec.stats.drafted
        assert drafter.last_sizes[1] >= 1
    assert drafted > 0


def test_eagle_on_the_eager_path_and_in_a_batch(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Eager weights (fast=False), and three rows in one core: each row's tokens are plain decoding's."""
    target = load_model(tiny_dirs["llama"], fast=False)
    eagle = make_eagle(tmp_path / "eagle", target)
    drafter = build_drafter("eagle", DrafterOptions(artifacts={"eagle": str(eagle)}, gamma=8))
    assert isinstance(drafter, EagleDrafter)
    drafter._costs, drafter._level, drafter._tree_extra = FLAT, 0.0, 0.0  # drafts whatever it finds
    core = DecodeCore(target, {"eagle": drafter}, max_rows=3)
    gen = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    rows = [core.add(Request(target.encode(p), generation=gen, drafter="eagle")) for p in PROMPTS]
    done: dict[int, list[int]] = {}
    while core.rows:
        for row, ev in core.step():
            if type(ev).__name__ == "FinishEvent":
                done[rows.index(row)] = ev.token_ids
    for i, p in enumerate(PROMPTS):
        assert done[i] == generate(target, p, max_new_tokens=16, ignore_eos=True).token_ids


def test_eagle_errors_name_the_fix(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--method eagle"):
        build_drafter("eagle", DrafterOptions())
    with pytest.raises(EagleError, match="does not exist"):
        EagleDrafter.load(tmp_path / "missing")
    other = load_model(tiny_dirs["draft"])  # hidden size 32, not the llama target's 64
    eagle = make_eagle(tmp_path / "eagle", load_model(tiny_dirs["llama"]))
    with pytest.raises(EagleError, match="hidden states of size 64"):
        generate(other, "x", EagleDrafter.load(eagle, costs=FLAT), max_new_tokens=2)
