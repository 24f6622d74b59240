"""Qwen 3 and Gemma 3 on the fast CPU path give a token's row the same bits whatever the pass's width: the
property exact speculation rests on (a verify pass of k tokens against k one-token decode steps). torch's
SDPA does not promise it, and a greedy Gemma 3 270M answer once changed under layer skip; these blocks now
run on the fused ops layer by layer (``llama_fused.forward_blocks``)."""

from __future__ import annotations


import pytest
import torch

import specdecode as sd
from tiny import build_model

GEMMA = dict(layers=3, sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"])


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> sd.Model:
    pytest.importorskip("transformers")
    kw = GEMMA if request.param == "gemma3" else {}
    path = build_model(tmp_path_factory.mktemp(request.param) / "m", request.param, seed=3, intermediate_size=128,
                       **kw)  # type: ignore[arg-type]
    m = sd.load_model(path)
    if m.kernels.fused is None:
        pytest.skip("the fused CPU ops are unavailable here")
    return m


def test_a_wide_pass_equals_one_token_passes_bit_for_bit(model: sd.Model) -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (1, 30))
    wide, narrow = model.new_cache(1, 64), model.new_cache(1, 64)
    model.forward(ids[:, :14], wide)
    model.forward(ids[:, :14], narrow)
    for a in (14, 20):  # the second pass starts past the sliding window
        block = model.forward(ids[:, a:a + 6], wide)
        steps = torch.cat([model.forward(ids[:, i:i + 1], narrow) for i in range(a, a + 6)], dim=1)
        assert torch.equal(block, steps)


def test_greedy_speculation_equals_plain_decoding(model: sd.Model) -> None:
    prompt = [5, 9, 13, 2, 7, 5, 9, 13]
    plain = sd.generate(model, prompt, max_new_tokens=40, ignore_eos=True).token_ids
    for name in ("layerskip", "ngram", "quant"):
        drafter = sd.build_drafter(name, sd.DrafterOptions(gamma="auto"))
        assert sd.generate(model, prompt, drafter=drafter, max_new_tokens=40, ignore_eos=True).token_ids == plain


def test_the_one_call_stack_equals_the_layer_loop_bit_for_bit(model: sd.Model) -> None:
    """``blocks_forward`` (one C++ call for the whole stack) against ``forward_blocks``' Python loop over the same
    fused ops: the same logits to the bit, for a prefill, one-token steps, a wide pass past the window and a tree."""
    from dataclasses import replace

    from specdecode.kernels import install_kernels

    if model.kernels.native is None:
        pytest.skip("the fast linear kernel is unavailable here")
    torch.manual_seed(1)
    ids = torch.randint(0, model.vocab_size, (1, 30))
    tree = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])  # a root, two children

    def passes() -> list[torch.Tensor]:
        cache = model.new_cache(1, 64)
        out = [model.forward(ids[:, :12], cache)]
        out += [model.forward(ids[:, i:i + 1], cache) for i in range(12, 16)]
        out.append(model.forward(ids[:, 16:22], cache))
        out.append(model.forward(ids[:, 22:25], cache, tree_mask=tree.unsqueeze(0)))
        return out

    one_call = passes()
    kernels = model.kernels
    install_kernels(model.module, replace(kernels, native=None))
    try:
        loop = passes()
    finally:
        install_kernels(model.module, kernels)
    assert len(one_call) == len(loop) and all(torch.equal(a, b) for a, b in zip(one_call, loop))
