"""Bad input gets a clear error that names the problem and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import specdecode as sd
from tiny import build_model


def test_unknown_architecture_names_it_and_the_supported_ones(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(tiny_dirs["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(sd.UnsupportedModelError,
                       match="unsupported architecture 'FalconForCausalLM'.*GPT2LMHeadModel.*LlamaForCausalLM"):
        sd.load_model(d)


def test_missing_path_says_no_download(tmp_path: Path) -> None:
    with pytest.raises(sd.ModelNotFoundError, match="not a local directory and not in the Hugging Face cache"):
        sd.load_model(tmp_path / "nope")
    with pytest.raises(sd.ModelNotFoundError, match="'some-org/some-model' not found"):
        sd.load_model("some-org/some-model")


def test_hub_id_found_in_local_cache(tiny_dirs: dict[str, Path], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny_dirs["llama"], snap)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert sd.load_model("acme/tiny").path == str(snap)


def test_bin_only_checkpoint_asks_for_safetensors(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(tiny_dirs["llama"], d)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(sd.ModelNotFoundError, match="convert them to safetensors"):
        sd.load_model(d)


def test_vocab_mismatch_between_draft_and_target(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    other = sd.load_model(build_model(tmp_path / "other", "llama", vocab_size=16, tokenizer=False))
    target = sd.load_model(tiny_dirs["llama"])
    with pytest.raises(sd.VocabularyMismatchError, match="vocab mismatch.*must share the target's tokenizer"):
        sd.generate(target, "def", drafter=sd.DraftModelDrafter(other, 2))


def test_vocab_mismatch_same_size_different_tokens(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    d = tmp_path / "m"
    shutil.copytree(tiny_dirs["draft"], d)
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    Tokenizer.from_file(str(d / "tokenizer.json"))  # still a valid tokenizer
    with pytest.raises(sd.VocabularyMismatchError, match="2 entries differ|4 entries differ"):
        sd.generate(sd.load_model(tiny_dirs["llama"]), "def", drafter=sd.DraftModelDrafter(sd.load_model(d), 2))


def test_prompt_longer_than_context(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])  # 256-token context
    with pytest.raises(sd.ContextLengthError, match="prompt has 300 tokens but the context window .* is 256"):
        sd.generate(target, [1] * 300)


def test_generation_stops_at_context_window(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    r = sd.generate(target, [1] * 250, drafter=sd.DraftModelDrafter(target, 4), max_new_tokens=50, ignore_eos=True)
    assert len(r.token_ids) == 6 and r.finish_reason == "length"


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
    (dict(temperature=-1.0), "temperature must be"),
    (dict(top_p=2.0), "top_p must be in"),
    (dict(stop=[""]), "stop strings must be non-empty"),
])
def test_invalid_generation_values(tiny_dirs: dict[str, Path], kwargs: dict, message: str) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    with pytest.raises(sd.ConfigError, match=message):
        sd.generate(target, "def", **kwargs)


def test_bad_prompts(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    with pytest.raises(sd.ConfigError, match="prompt is empty"):
        sd.generate(target, "")
    with pytest.raises(sd.ConfigError, match=r"outside the vocabulary \[0, 300\)"):
        sd.generate(target, [5, 1000])


def test_bad_drafter_settings() -> None:
    with pytest.raises(sd.ConfigError, match="gamma .* must be a positive integer"):
        sd.DraftModelDrafter(None, 0)  # type: ignore[arg-type]
    with pytest.raises(sd.ConfigError, match="min_ngram <= max_ngram"):
        sd.PromptLookupDrafter(max_ngram=1, min_ngram=3)


def test_cuda_requested_without_gpu(tiny_dirs: dict[str, Path]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="no CUDA GPU is available; use --device cpu"):
        sd.load_model(tiny_dirs["llama"], device="cuda")
