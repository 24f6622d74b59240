"""The quantized path: greedy speculative output is token-identical to plain decoding of the same
(quantized) model, and the int4 self-draft (``--drafter quant``) drafts for dense and int8 targets."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdecode as sd
from specdecode.drafters.quant import QuantDrafter
from specdecode.drafters.registry import DrafterOptions, build_drafter

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
NEW = 24


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("weight_dtype", ["int8", "int4"])
def test_quantized_target_greedy_identity(tiny_dirs: dict[str, Path], arch: str, weight_dtype: str) -> None:
    target = sd.load_model(tiny_dirs[arch], weight_dtype=weight_dtype)
    assert target.weight_format == weight_dtype
    plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    # self-speculation with the quantized model itself: rows are batch-invariant, so every draft token
    # is accepted (a batch-dependent kernel would reject some)
    own = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(target, 4), max_new_tokens=NEW, ignore_eos=True)
    assert own.token_ids == plain.token_ids
    assert own.stats.alpha == 1.0
    for gamma in (1, 3):
        r = sd.generate(target, PROMPT, drafter=QuantDrafter(gamma), max_new_tokens=NEW, ignore_eos=True)
        assert r.token_ids == plain.token_ids and r.text == plain.text


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_quant_drafter_on_a_dense_target(tiny_dirs: dict[str, Path], arch: str) -> None:
    target = sd.load_model(tiny_dirs[arch])
    plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    drafter = build_drafter("quant", DrafterOptions(gamma=3))
    r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=NEW, ignore_eos=True)
    assert r.token_ids == plain.token_ids
    assert r.stats.drafted > 0
    copy = drafter.model
    assert copy is not None and copy.weight_format == "int4" and target.weight_format != "int4"
    assert copy.module.output_matrix() is target.module.output_matrix()  # shared, not copied


def test_quantized_logits_stay_close_to_dense(tiny_dirs: dict[str, Path]) -> None:
    dense = sd.load_model(tiny_dirs["llama"])
    q8 = sd.load_model(tiny_dirs["llama"], weight_dtype="int8")
    ids = dense.encode(PROMPT)
    import torch

    a = dense.forward(torch.tensor([ids]), dense.new_cache(1, 64))
    b = q8.forward(torch.tensor([ids]), q8.new_cache(1, 64))
    rel = ((a - b).pow(2).mean() / a.pow(2).mean()).sqrt().item()
    # ~0.7% per product (int8 weights and activations), amplified by this random model's wide weights
    # (std 0.3) to ~7%; wrong scales or layouts give ~100%
    assert rel < 0.2, rel
    assert not torch.equal(a, b)  # it really ran the quantized weights


def test_quant_drafter_on_an_unsupported_target_fails_at_the_first_proposal(tiny_dirs: dict[str, Path]) -> None:
    # bf16 compute: no quantized copy. Preparing must not raise (the server prepares every drafter);
    # drafting says why.
    target = sd.load_model(tiny_dirs["llama"], dtype="bf16")
    drafter = QuantDrafter(2)
    drafter.prepare_rows(target, 1, 64)
    assert drafter.costs_for(target) is None
    with pytest.raises(sd.ConfigError, match="drafter 'quant'.*fp32 activations"):
        sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=4, ignore_eos=True)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("share", [True, False], ids=["shared-cache", "own-cache"])
def test_quant_drafter_batched_rows_on_the_target_cache(tiny_dirs: dict[str, Path], arch: str, share: bool) -> None:
    """Three rows through one core, joining at different steps, one plain: the copy drafts on the
    target's own cache (or, as the reference, on a cache of its own) and every row is plain decoding's."""
    from specdecode.config import GenerationConfig
    from specdecode.core import DecodeCore
    from specdecode.rows import Request

    target = sd.load_model(tiny_dirs[arch])
    prompts = [PROMPT, "class Point:\n    def __init__(self", "def add(a, b):\n    return a"]
    budgets = [31, 17, 25]
    ref = {i: sd.generate(target, p, max_new_tokens=n, ignore_eos=True).token_ids
           for i, (p, n) in enumerate(zip(prompts, budgets))}
    drafter = QuantDrafter(3, share_cache=share)
    core = DecodeCore(target, {"q": drafter}, max_rows=3)
    out: dict[int, list[int]] = {}
    rows: dict[int, int] = {}
    pending, step, drafted = list(range(len(prompts))), 0, 0
    while pending or core.rows:
        if pending and step % 2 == 0:
            i = pending.pop(0)
            req = Request(target.encode(prompts[i]), generation=GenerationConfig(max_new_tokens=budgets[i],
                                                                                 ignore_eos=True),
                          drafter=None if i == 1 else "q", gamma=3)
            rows[id(core.add(req))] = i
        for row, ev in core.step():
            if isinstance(ev, sd.FinishEvent):
                out[rows[id(row)]] = ev.token_ids
                drafted += ev.stats.drafted
        step += 1
    assert out == ref
    assert drafted > 0
    assert (drafter._own is None) == share  # shared: no cache of the copy's own
