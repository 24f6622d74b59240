"""`specdecode export --format vllm|sglang`: the files, tensor names, shapes and config keys of the
EAGLE-3 layout the engines load (as in the reference checkpoint yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
and the engines' llama_eagle3.py loaders), and the export re-imported into our runtime gives the same
draft logits and the same exact generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdecode import generate
from specdecode.cli import main as cli_main
from specdecode.config import ConfigError
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.eagle_model import input_embedding, load_eagle
from specdecode.models import load_model
from specdecode.train.export_engines import export_eagle

from eagle_util import FLAT, make_eagle

pytestmark = pytest.mark.slow  # full tier: make test-full


def documented_layout(h: int, heads: int, kv: int, hd: int, ffn: int, n_draft: int, vocab: int) -> dict:
    """The reference EAGLE-3 checkpoint's tensors, written out from its published shapes (for Llama-3.1-8B:
    hidden 4096, 32 / 8 heads of 128, FFN 14336, draft vocabulary 32000 of 128256)."""
    return {"fc.weight": (h, 3 * h), "midlayer.hidden_norm.weight": (h,), "midlayer.input_layernorm.weight": (h,),
            "midlayer.post_attention_layernorm.weight": (h,), "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
            "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h), "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
            "midlayer.self_attn.o_proj.weight": (h, heads * hd), "midlayer.mlp.gate_proj.weight": (ffn, h),
            "midlayer.mlp.up_proj.weight": (ffn, h), "midlayer.mlp.down_proj.weight": (h, ffn), "norm.weight": (h,),
            "lm_head.weight": (n_draft, h), "d2t": (n_draft,), "t2d": (vocab,)}


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_export_layout_and_reimport(fmt: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    target = load_model(tiny_dirs["llama"])
    # a 2-layer target: the engines capture the input of layer 1 at most, i.e. the output of layer 0
    src = make_eagle(tmp_path / "eagle", target, seed=7, draft_vocab=200, aux_layers=(0, 0, 0))
    out = tmp_path / fmt
    assert cli_main(["export", "--format", fmt, "--eagle", str(src), "--target", str(tiny_dirs["llama"]),
                     "--out", str(out), "--dtype", "fp32"]) == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "serving.json", "README.md"}
    cfg = json.loads((out / "config.json").read_text())
    c = target.config
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"], cfg["draft_vocab_size"]) == \
        (1, c.dim, c.vocab_size, 200)
    for key in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                "max_position_embeddings", "hidden_act", "torch_dtype"):
        assert key in cfg
    aux = [0, 0, 0]  # as "output of layer i"
    if fmt == "vllm":  # top level, counting inputs of layers (transformers' hidden_states[i])
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in aux]
        assert "eagle_aux_hidden_state_layer_ids" not in cfg["eagle_config"]
    else:  # SGLang: eagle_config, counting outputs of layers
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == aux
        assert "eagle_aux_hidden_state_layer_ids" not in cfg
    sd = load_file(str(out / "model.safetensors"))
    want = documented_layout(c.dim, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                             cfg["intermediate_size"], 200, c.vocab_size)
    assert {k: tuple(v.shape) for k, v in sd.items()} == want  # no embed_tokens: the engines share the target's
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool and int(sd["t2d"].sum()) == 200
    ids = torch.arange(200) + sd["d2t"]
    assert bool(sd["t2d"][ids].all()) and bool((ids[1:] > ids[:-1]).all())
    serving = json.loads((out / "serving.json").read_text())
    if fmt == "vllm":
        assert serving["speculative_config"]["method"] == "eagle3"
    else:
        assert serving["server_args"]["speculative-algorithm"] == "EAGLE3"

    # re-import: the same draft logits through every training-time-test step, and exact generation
    a, b = load_eagle(src), load_eagle(out, target_layers=c.n_layers)
    assert a.cfg.aux_layers == b.cfg.aux_layers and torch.equal(a.draft_ids, b.draft_ids)
    torch.manual_seed(0)
    aux_in = torch.randn(2, 12, 3 * c.dim)
    emb = input_embedding(target).float()[torch.randint(0, c.vocab_size, (2, 12))]
    for ha, hb in zip(a.unroll(aux_in, emb, 3), b.unroll(aux_in, emb, 3)):
        assert torch.equal(a.logits(ha), b.logits(hb))
    prompt = "def add(a, b):\n    return"
    ref = generate(target, prompt, max_new_tokens=24, ignore_eos=True)
    got = generate(target, prompt, EagleDrafter.load(out, costs=FLAT, gamma=8), max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == ref.token_ids and got.stats.drafted > 0


def test_export_refuses_what_engines_cannot_serve(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    gpt2 = load_model(tiny_dirs["gpt2"])
    src = make_eagle(tmp_path / "eagle", gpt2)
    with pytest.raises(ConfigError, match="GPT2LMHeadModel"):
        export_eagle(str(src), str(tiny_dirs["gpt2"]), str(tmp_path / "o"), "vllm")
    with pytest.raises(ConfigError, match="--format"):
        export_eagle(str(src), str(tiny_dirs["gpt2"]), str(tmp_path / "o"), "tensorrt")
    # the default hooks of a 2-layer target include the input of layer 2, which no engine captures
    llama = load_model(tiny_dirs["llama"])
    deep = make_eagle(tmp_path / "deep", llama)
    assert load_eagle(deep).cfg.aux_layers == (0, 0, 1)
    with pytest.raises(ConfigError, match=r"outputs of layers 0\.\.0 only.*--eagle-layers"):
        export_eagle(str(deep), str(tiny_dirs["llama"]), str(tmp_path / "o2"), "sglang")
    assert cli_main(["export", "--format", "vllm", "--target", str(tiny_dirs["llama"]), "--out",
                     str(tmp_path / "o")]) == 2  # no --eagle: a one-line error naming the flag


def test_the_launch_command_names_a_catalogued_target_by_its_hub_repository(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines load a model's safetensors from the hub; our copy of a catalogued model is a GGUF file,
    and its name is no path they could open."""
    from specdecode.train.export_engines import engine_target

    monkeypatch.chdir(tmp_path)
    assert engine_target("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "mine").mkdir()
    assert engine_target("mine") == str((tmp_path / "mine").resolve())  # a directory stays a path
