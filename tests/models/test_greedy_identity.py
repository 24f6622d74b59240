"""Greedy speculative output is token-identical to plain decoding and to transformers' greedy generate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import specdecode as sd

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
NEW = 24


@pytest.fixture(scope="module")
def references(tiny_dirs: dict[str, Path]) -> dict[str, list[int]]:
    out = {}
    for arch in ("llama", "qwen2", "gpt2"):
        model = sd.load_model(tiny_dirs[arch])
        ids = model.encode(PROMPT)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs[arch], dtype=torch.float32).eval()
        with torch.no_grad():
            gen = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
        out[arch] = gen[0, len(ids):].tolist()
    return out


def drafters(arch: str, dirs: dict[str, Path], gamma: int) -> list[sd.Drafter]:
    target = sd.load_model(dirs[arch])
    own = "gpt2_draft" if arch == "gpt2" else "draft"
    return [
        sd.DraftModelDrafter(target, gamma),  # self-speculation: everything accepted
        (sd.DraftModelDrafter(sd.load_model(dirs[own]), gamma) if arch != "qwen2"
         else sd.DraftModelDrafter(target, gamma)),
        sd.PromptLookupDrafter(num_draft_tokens=gamma),
    ]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_identity(tiny_dirs: dict[str, Path], references: dict[str, list[int]], arch: str, gamma: int) -> None:
    # an fp32 KV cache, as transformers' fp32 run (the default fp16 cache: tests/unit/test_kv_dtype.py)
    target = sd.load_model(tiny_dirs[arch], kv_dtype="fp32")
    plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    assert plain.token_ids == references[arch]
    for drafter in drafters(arch, tiny_dirs, gamma):
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=NEW, ignore_eos=True)
        assert r.token_ids == plain.token_ids, type(drafter).__name__
        assert r.text == plain.text


def test_self_speculation_accepts_everything(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    r = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(target, 4), max_new_tokens=20, ignore_eos=True)
    assert r.stats.alpha == 1.0
    assert r.stats.target_passes == 4  # 5 tokens per pass: 4 accepted + 1 bonus
    assert r.stats.acceptance_by_position == [1.0, 1.0, 1.0, 1.0]
    assert all(r.from_draft[i] == (i % 5 != 4) for i in range(20))


def test_sampled_self_speculation_accepts_everything(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    r = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(target, 3), max_new_tokens=16, temperature=0.9,
                    top_p=0.9, seed=3, ignore_eos=True)
    assert r.stats.alpha == 1.0


def test_seed_reproduces_sampled_run(tiny_dirs: dict[str, Path]) -> None:
    target, draft = sd.load_model(tiny_dirs["llama"]), sd.load_model(tiny_dirs["draft"])
    runs = [sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, 3), max_new_tokens=16, temperature=1.0,
                        seed=123, ignore_eos=True).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_eos_and_stop_strings(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    eos_id = next(iter(target.eos_token_ids))
    # force the EOS: a prompt-lookup drafter proposes it whenever it follows the same n-gram
    r = sd.generate(target, PROMPT, max_new_tokens=NEW)
    if eos_id in plain.token_ids:
        assert r.token_ids == plain.token_ids[: plain.token_ids.index(eos_id) + 1] and r.finish_reason == "stop"
    else:
        assert r.token_ids == plain.token_ids and r.finish_reason == "length"
    stop = plain.text[5:8]
    s = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(target, 3), max_new_tokens=NEW, ignore_eos=True,
                    stop=[stop])
    assert s.finish_reason == "stop"
    assert s.text == plain.text[: plain.text.index(stop)]


@pytest.mark.parametrize("isa", ["avx2", "avx512bf16", "amx"])
def test_greedy_identity_bf16_weights_per_kernel_path(tiny_dirs: dict[str, Path], isa: str) -> None:
    """bf16 weights on the bf16-dot kernel, on each code path this CPU has: the AMX path's tiles (K = 64
    here, a multiple of 32) must give every row of a verification pass the bits a one-token pass gives it,
    chains and trees alike."""
    from specdecode import kernels

    if not kernels.fast_linear_available() or isa not in kernels.supported_isas():
        pytest.skip(f"this CPU has no {isa} path for the kernel")
    previous = kernels.set_kernel_isa(isa)
    try:
        target = sd.load_model(tiny_dirs["llama"], weight_dtype="bf16")
        assert target.kernels.mode == "bf16_dot"
        plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
        own = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(target, 8), max_new_tokens=NEW, ignore_eos=True)
        assert own.token_ids == plain.token_ids and own.stats.alpha == 1.0  # 9-row passes = one-row passes
        for drafter in [sd.DraftModelDrafter(sd.load_model(tiny_dirs["draft"]), 5),
                        sd.PromptLookupDrafter(num_draft_tokens=6), sd.SuffixDrafter()]:
            r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=NEW, ignore_eos=True)
            assert r.token_ids == plain.token_ids, type(drafter).__name__
    finally:
        kernels.set_kernel_isa(previous)
