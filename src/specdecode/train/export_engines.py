"""``specdecode export --format vllm|sglang``: hand a trained EAGLE draft to a serving engine.

At scale users serve with vLLM or SGLang (tensor/pipeline parallel, many GPUs). Both load an
EAGLE-3 draft as the reference checkpoints lay it out (e.g. ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``;
loaders: vLLM ``vllm/model_executor/models/llama_eagle3.py``, SGLang
``python/sglang/srt/models/llama_eagle3.py``): a one-layer Llama ``config.json`` with
``architectures: ["LlamaForCausalLMEagle3"]`` and ``draft_vocab_size``, and ``model.safetensors`` with
``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t`` and ``t2d`` (no
``embed_tokens``: both engines then share the target's). Our own directory already is that layout
(``drafters/eagle_model.py``), so the export checks the draft against the target, rewrites the
config with the engine's key for the fused target layers, stores the weights in the serving dtype,
and writes the engine's launch settings beside them (``serving.json``, ``README.md``):

* vLLM reads ``eagle_aux_hidden_state_layer_ids`` at the top level of the draft's config, counting
  "input of layer i" (transformers' ``hidden_states[i]``);
* SGLang reads ``eagle_config.eagle_aux_hidden_state_layer_ids``, counting "output of layer i".

A distilled draft model needs no export: it is already a plain Hugging Face checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..config import ConfigError
from ..drafters.eagle_model import check_fits, load_eagle, save_eagle
from ..models import load_model
from ..models.catalog import CATALOG

FORMATS = ("vllm", "sglang")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SERVING_FILE = "serving.json"
# target architectures whose vLLM and SGLang implementations capture EAGLE-3's auxiliary hidden states
EAGLE3_TARGETS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def serving_settings(fmt: str, target: str, draft: str, num_steps: int = 5, topk: int = 4,
                     draft_tokens: int = 16) -> dict[str, Any]:
    """The engine's launch settings for this draft (what docs/scale-out.md shows)."""
    if fmt == "vllm":
        spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": num_steps,
                "draft_tensor_parallel_size": 1}
        return {"engine": "vllm", "target": target, "speculative_config": spec,
                "command": f"vllm serve {target} --speculative-config '{json.dumps(spec)}'"}
    args = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": draft,
            "speculative-num-steps": num_steps, "speculative-eagle-topk": topk,
            "speculative-num-draft-tokens": draft_tokens}
    flags = " ".join(f"--{k} {v}" for k, v in args.items())
    return {"engine": "sglang", "target": target, "server_args": args,
            "command": f"python -m sglang.launch_server --model-path {target} {flags}"}


def engine_target(target: str) -> str:
    """What the engine's launch command names as the target: a catalogued model's Hugging Face repository
    (the engines load its safetensors; our copy is a GGUF file), else the directory or file, resolved."""
    entry = CATALOG.get(target)
    if entry is not None and entry.hub_id and not Path(target).exists():
        return entry.hub_id
    return str(Path(target).resolve())


def export_eagle(eagle: str, target: str, out: str, fmt: str, dtype: str = "bf16") -> Path:
    """Write ``eagle`` (an EAGLE-3 directory for ``target``) to ``out`` in ``fmt``'s layout."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if dtype not in _DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    tgt = load_model(target)
    arch = tgt.config.architecture
    if arch not in EAGLE3_TARGETS:
        raise ConfigError(f"{fmt} serves EAGLE-3 drafts only for targets whose model captures auxiliary hidden "
                          f"states ({', '.join(EAGLE3_TARGETS)}); {tgt.name} is {arch}")
    net = load_eagle(eagle, target_layers=tgt.config.n_layers)
    check_fits(net.cfg, tgt, eagle)
    n = tgt.config.n_layers
    if max(net.cfg.aux_layers) > n - 2:  # the engines capture a layer's input inside their layer loop
        raise ConfigError(f"{fmt} captures the target's hidden state before each of its {n} layers, so a draft can "
                          f"read outputs of layers 0..{n - 2} only; {eagle} reads layers {list(net.cfg.aux_layers)}: "
                          f"retrain it with --eagle-layers whose highest is at most {n - 2}")
    root = Path(out)
    if root.resolve() == Path(eagle).resolve():
        raise ConfigError("--out must differ from --eagle (the export rewrites config.json)")
    save_eagle(root, net, _DTYPES[dtype], aux_keys=fmt, extras=False)
    settings = serving_settings(fmt, engine_target(target), str(root.resolve()))
    (root / SERVING_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    (root / "README.md").write_text(
        f"# EAGLE-3 draft for {tgt.name}, exported for {fmt}\n\n"
        f"Exported by `specdecode export --format {fmt}` from `{eagle}`. The draft shares the target's token "
        f"embedding (no `embed_tokens` tensor): serve it with that target only.\n\n"
        f"```bash\n{settings['command']}\n```\n")
    return root


def _run_export(args: argparse.Namespace, argv: Optional[Sequence[str]] = None) -> int:
    if args.eagle is None:
        raise ConfigError("export needs --eagle DIR (an EAGLE-3 directory from `specdecode distill --method "
                          "eagle`); a distilled draft model is already a Hugging Face checkpoint and needs no export")
    out = export_eagle(args.eagle, args.target, args.out, args.format, args.dtype)
    print(f"wrote {args.format} EAGLE-3 draft to {out}; launch: "
          f"{json.loads((out / SERVING_FILE).read_text())['command']}")
    return 0


def add_export(sub) -> None:
    p = sub.add_parser("export", help="write a trained EAGLE draft in the layout vLLM or SGLang load (EAGLE-3)",
                       description="Write an EAGLE-3 draft trained by `specdecode distill --method eagle` as the "
                                   "serving engine loads it for its EAGLE-3 method (config.json keys and tensor "
                                   "names of the reference checkpoints), with the engine's launch settings in "
                                   "serving.json. See docs/scale-out.md.")
    p.add_argument("--format", required=True, choices=FORMATS, help="the serving engine")
    p.add_argument("--eagle", default=None, metavar="DIR", help="the EAGLE-3 directory to export")
    p.add_argument("--target", default="models/code-target",
                   help="the target it was trained for (default: %(default)s)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--dtype", default="bf16", choices=tuple(_DTYPES), help="weights' dtype (default: %(default)s)")
    p.set_defaults(func=_run_export, _parser=p)


__all__ = ["EAGLE3_TARGETS", "FORMATS", "add_export", "engine_target", "export_eagle", "serving_settings"]
