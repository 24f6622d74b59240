"""An exit adapter: a light trained decoder layer that makes an early exit of the target a good draft.

A training-free early exit (``drafters/layerskip.py``) reads the residual stream after layer k
through the target's final norm and output layer, which were trained for the stream after the
*last* layer: on the bundled 8-layer target, exiting after 4 layers agrees with the target only 28%
of the time, and a residual MLP on the exit (tried first) reached only 0.54-0.67. The adapter is one
Llama decoder layer (attention with RoPE, then a SiLU-gated MLP of ``width``) on that stream, trained
by self-distillation (forward KL to the target's next-token law, ``specdecode distill --method
early-exit``; Kangaroo, arXiv:2404.18911, trains such an adapter on a shallow exit), then the
target's own final norm and (tied) output matrix, frozen, restricted to the ``vocab_ids`` the target
writes most (the proposal vocabulary; a token outside it has draft probability 0, which verification
handles exactly). Its W_o and W_2 start at zero, so an untrained adapter is the training-free exit.

**Cache.** The adapter's input at position t is the target's own residual after layer k (those
layers are the target's computation on the target's cache), so its keys and values at accepted
positions are what the target's context gives: the draft keeps them in one cache layer of its own
(index ``n_layers`` of the draft's view), caught up like a skip set's own layers
(``LayerSkipDrafter``). The target's cache ends every step exactly as without the drafter.

An adapter directory holds ``exit_adapter.json`` (the exit layer, the shape, the target it was
trained for, the recipe, held-out α and τ) and ``exit_adapter.safetensors`` (the layer's
``wqkv``, ``wo``, ``w13``, ``w2``, ``attn_norm``, ``mlp_norm`` and ``vocab_ids``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..cache import KVCache
from ..config import ConfigError
from ..costmodel import Costs, cached_costs, cost_clock, costs_key, store_costs
from ..kernels import Kernels
from ..kernels.quant import QUANT_FORMATS, QuantUnavailableError, quantize, quantized_kernels
from ..models.config import ModelConfig
from ..models.llama import LlamaBlock, rope_tables
from ..ops import rms_norm
from .base import Gamma
from .layerskip import DraftLayers, LayerSkipDrafter, check_family
from .medusa_heads import target_fingerprint

if TYPE_CHECKING:
    from ..models import Model

CONFIG_FILE = "exit_adapter.json"
WEIGHTS_FILE = "exit_adapter.safetensors"
FORMAT_VERSION = 2
QUANT = "int4"  # the draft's matrices at run time on a dense CPU target (drafts only: exactness unaffected)
BLOCK_WEIGHTS = ("wqkv", "wo", "w13", "w2", "attn_norm", "mlp_norm")
log = logging.getLogger(__name__)

_TRAIN_HINT = "`specdecode distill --method early-exit --target TARGET --out DIR`"


class ExitAdapterError(ConfigError):
    """The adapter directory is missing, malformed, or does not fit the target; the message says the fix."""


@dataclass
class ExitAdapterConfig:
    """What ``exit_adapter.json`` records."""

    exit_layer: int  # the draft runs the target's layers 0 .. exit_layer - 1, then the adapter
    dim: int
    width: int  # the adapter layer's MLP width
    n_layers: int  # the target's layer count
    vocab_size: int  # the target's vocabulary
    n_heads: int
    n_kv_heads: int
    head_dim: int
    draft_vocab: int  # proposal vocabulary: the first ``draft_vocab`` of the tokens the target writes most
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    target: dict[str, Any] = field(default_factory=dict)  # path, name, fingerprint, architecture, layers
    recipe: dict[str, Any] = field(default_factory=dict)  # the training command's settings and time
    alpha: Optional[float] = None  # held-out greedy acceptance of one draft token (top-1 agreement)
    alpha_training_free: Optional[float] = None  # the same exit without the adapter, same positions
    format_version: int = FORMAT_VERSION

    @classmethod
    def for_target(cls, target: "Model", exit_layer: int, width: int, draft_vocab: int) -> "ExitAdapterConfig":
        """The adapter's attention has the target's head shape: its cache layer sits beside the target's."""
        c = target.config
        return cls(exit_layer=exit_layer, dim=c.dim, width=width, n_layers=c.n_layers, vocab_size=c.vocab_size,
                   n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, draft_vocab=draft_vocab,
                   norm_eps=c.norm_eps, rope_theta=c.rope_theta)

    def block_config(self) -> ModelConfig:
        """The adapter layer's shape as a one-layer Llama config (its module is ``LlamaBlock``)."""
        return ModelConfig(architecture="ExitAdapter", family="llama", vocab_size=self.vocab_size, dim=self.dim,
                           n_layers=1, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
                           intermediate_size=self.width, max_position_embeddings=0, norm_eps=self.norm_eps,
                           tie_embeddings=True, rope_theta=self.rope_theta)


class ExitAdapter(nn.Module):
    """One Llama decoder layer on the residual after the exit layer; it keeps cache layer ``n_layers``."""

    def __init__(self, cfg: ExitAdapterConfig, vocab_ids: torch.Tensor, max_len: int) -> None:
        super().__init__()
        if cfg.dim < 1 or cfg.width < 1:
            raise ValueError(f"an exit adapter needs a positive dim and width, got {cfg.dim} and {cfg.width}")
        self.cfg = cfg
        self.block = LlamaBlock(cfg.block_config(), layer=cfg.n_layers)
        with torch.no_grad():  # zero output projections: an untrained adapter is the identity (the plain exit)
            for name, p in self.block.named_parameters():
                if name in ("wo", "w2"):
                    p.zero_()
                elif p.dim() == 2:
                    p.normal_(0.0, 0.02)
                else:
                    p.fill_(1.0)
        cos, sin = rope_tables(cfg.block_config(), max_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("vocab_ids", vocab_ids.to(torch.long).clone(), persistent=False)

    def use_kernels(self, kernels: Kernels) -> None:
        """Run the layer's matrices with the target's kernels (its fast CPU linear) instead of eager."""
        self.block.kernels = kernels

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: Any = None,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        """h [B, T, dim] at ``positions`` [B, T] -> the adapted residual; without a cache, causal attention
        over ``h`` itself (training and evaluation), with one, over the cache's adapter layer too."""
        cos = self.rope_cos[positions].unsqueeze(1).to(h.dtype)
        sin = self.rope_sin[positions].unsqueeze(1).to(h.dtype)
        return self.block(h, cos, sin, meta, cache)


def final_norm(target: "Model", x: torch.Tensor) -> torch.Tensor:
    """The target's own final norm (RMSNorm for the llama family, LayerNorm for gpt2)."""
    m, cfg = target.module, target.config
    if cfg.family == "gpt2":
        return torch.nn.functional.layer_norm(x, (cfg.dim,), m.lnf_w, m.lnf_b, cfg.norm_eps)
    return rms_norm(x, m.norm, cfg.norm_eps)


def proposal_head(target: "Model", vocab_ids: torch.Tensor) -> torch.Tensor:
    """The target's output rows of the proposal vocabulary (all of it: the matrix itself)."""
    w = target.output_matrix()
    if len(vocab_ids) == w.shape[0]:
        return w
    return w.index_select(0, vocab_ids.to(w.device)).contiguous()


def full_vocab_logits(restricted: torch.Tensor, vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over the proposal vocabulary -> over the whole vocabulary (-inf elsewhere: probability 0)."""
    if restricted.shape[-1] == vocab_size:
        return restricted
    out = restricted.new_full((*restricted.shape[:-1], vocab_size), float("-inf"))
    out[..., vocab_ids] = restricted
    return out


# -- the directory -----------------------------------------------------------------------------
def is_exit_adapter_dir(path: Union[str, Path, None]) -> bool:
    return path is not None and (Path(path) / CONFIG_FILE).is_file()


def save_adapter(out: Union[str, Path], adapter: ExitAdapter, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the adapter directory (matrices in ``dtype``, norms in fp32; ``adapter.cfg`` as JSON)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {name: p.detach().to(dtype if p.dim() == 2 else torch.float32).contiguous().cpu()
          for name, p in adapter.block.named_parameters() if p is not None}
    sd["vocab_ids"] = adapter.vocab_ids.detach().to(torch.int64).contiguous().cpu()
    save_file(sd, str(out / WEIGHTS_FILE), metadata={"format": "specdecode-exit-adapter", "version": str(FORMAT_VERSION)})
    (out / CONFIG_FILE).write_text(json.dumps(asdict(adapter.cfg), indent=2, default=str) + "\n")
    return out


def load_adapter(path: Union[str, Path], max_len: int = 4096) -> ExitAdapter:
    """The adapter directory's module (fp32, eval mode), with errors that name the fix."""
    root = Path(path)
    if not root.is_dir():
        raise ExitAdapterError(f"exit adapter directory {root} does not exist; train one with {_TRAIN_HINT} "
                               "or pass the directory that holds exit_adapter.json")
    cfg_file, w_file = root / CONFIG_FILE, root / WEIGHTS_FILE
    if not cfg_file.is_file() or not w_file.is_file():
        raise ExitAdapterError(f"{root} is not an exit adapter directory (it needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                               f"write one with {_TRAIN_HINT}")
    try:
        raw = json.loads(cfg_file.read_text())
        if raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format version {raw.get('format_version')}, this specdecode reads {FORMAT_VERSION}")
        known = set(ExitAdapterConfig.__dataclass_fields__)
        cfg = ExitAdapterConfig(**{k: v for k, v in raw.items() if k in known})
        for name in ("exit_layer", "dim", "width", "n_layers", "vocab_size", "n_heads", "n_kv_heads", "head_dim",
                     "draft_vocab"):
            if int(getattr(cfg, name)) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    except (OSError, ValueError, TypeError) as e:
        raise ExitAdapterError(f"{cfg_file} is malformed ({e}); retrain the adapter with {_TRAIN_HINT}") from e
    try:
        sd = load_file(str(w_file))
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise ExitAdapterError(f"{w_file} is unreadable ({e}); retrain the adapter with {_TRAIN_HINT}") from e
    ids = sd.pop("vocab_ids", None)
    if ids is None or tuple(ids.shape) != (cfg.draft_vocab,) or int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ExitAdapterError(f"{w_file}: 'vocab_ids' must hold {cfg.draft_vocab} token ids below {cfg.vocab_size} "
                               f"(from {CONFIG_FILE}); the directory is inconsistent, retrain the adapter with {_TRAIN_HINT}")
    adapter = ExitAdapter(cfg, ids, max_len)
    want = {name: tuple(p.shape) for name, p in adapter.block.named_parameters()}
    for name, shape in want.items():
        if name not in sd or tuple(sd[name].shape) != shape:
            got = tuple(sd[name].shape) if name in sd else "missing"
            raise ExitAdapterError(f"{w_file}: tensor {name!r} is {got}, expected {shape} from {CONFIG_FILE}; the "
                                   f"directory is inconsistent, retrain the adapter with {_TRAIN_HINT}")
    adapter.block.load_state_dict({k: v.float() for k, v in sd.items() if k in want})
    return adapter.eval().requires_grad_(False)


def check_fits(cfg: ExitAdapterConfig, target: "Model", where: Union[str, Path]) -> None:
    """Raise unless the adapter can run on ``target`` (layers, hidden size, vocabulary); warn when it was
    trained for other weights of the same shape."""
    check_family(target)
    c = target.config
    trained = cfg.target.get("path") or "another model"
    fix = f"use an adapter trained for this target, or train one: `specdecode distill --method early-exit " \
          f"--target {target.path} --out DIR`"
    for what, mine, theirs in (("layers", cfg.n_layers, c.n_layers), ("hidden size", cfg.dim, c.dim),
                               ("vocabulary", cfg.vocab_size, c.vocab_size), ("KV heads", cfg.n_kv_heads, c.n_kv_heads),
                               ("head size", cfg.head_dim, c.head_dim)):
        if mine != theirs:
            raise ExitAdapterError(f"the exit adapter in {where} was trained for a target with {what} {mine} "
                                   f"({trained}) but {target.name} has {theirs}; {fix}")
    if not 1 <= cfg.exit_layer < c.n_layers:
        raise ExitAdapterError(f"the exit adapter in {where} exits after layer {cfg.exit_layer}, outside "
                               f"1..{c.n_layers - 1}; retrain it with {_TRAIN_HINT} --exit-layer K")
    fp = cfg.target.get("fingerprint")
    if fp and fp != target_fingerprint(target):
        log.warning("the exit adapter in %s was trained for %s, whose output matrix differs from %s's: outputs stay "
                    "exact, but acceptance may be low", where, trained, target.path)


# -- the drafter ---------------------------------------------------------------------------------
class ExitAdapterDrafter(LayerSkipDrafter):
    """A layer-skip early exit whose residual passes through a trained exit adapter (a ``BatchDrafter``).

    Everything else is ``LayerSkipDrafter``'s: the draft runs the target's first ``exit_layer`` layers
    on the target's own KV entries, the adapter's layer on a cache layer of its own (caught up with
    the verified tokens like a skip set's own layers), and verification is the core's, so the output
    is exact whatever the adapter computes."""

    def __init__(self, adapter: ExitAdapter, gamma: Gamma = "auto", where: Union[str, Path] = "the exit adapter",
                 share_cache: bool = True, quant: Optional[str] = QUANT) -> None:
        super().__init__(exit_layer=adapter.cfg.exit_layer, gamma=gamma, share_cache=share_cache)
        if quant is not None and quant not in QUANT_FORMATS:
            raise ConfigError(f"quant (the exit draft's run-time weights) must be None or one of "
                              f"{', '.join(QUANT_FORMATS)}, got {quant!r}")
        self.adapter, self.where, self.quant = adapter, str(where), quant
        self.runtime = "eager"  # how the draft's matrices run, once prepared (see ``_draft_stack``)
        # target, the adapter there, its proposal head, and (llama family) the whole draft as one module call
        self._ready: Optional[tuple["Model", ExitAdapter, torch.Tensor, Optional[_DraftStack]]] = None
        self._extra_s: Optional[tuple["Model", float]] = None  # the adapter's step time, measured once per target

    @property
    def config(self) -> ExitAdapterConfig:
        return self.adapter.cfg

    @classmethod
    def load(cls, path: Union[str, Path], gamma: Gamma = "auto", quant: Optional[str] = QUANT) -> "ExitAdapterDrafter":
        return cls(load_adapter(path), gamma=gamma, where=path, quant=quant)

    def resolve(self, target: "Model") -> DraftLayers:
        check_fits(self.config, target, self.where)
        self.calibration = None
        return DraftLayers.exit(self.config.exit_layer, target.config.n_layers)

    def extra_cache_layers(self) -> int:
        return 1  # the adapter's own attention layer

    def _prepared(self, target: "Model") -> tuple[ExitAdapter, torch.Tensor, Optional[_DraftStack]]:
        """The adapter on the target's device with its kernels and positions, the proposal head, and for a
        llama-family target the whole draft as one module call (``_DraftStack``)."""
        if self._ready is None or self._ready[0] is not target:
            adapter = self.adapter.to(target.device)
            if adapter.rope_cos.shape[0] < target.max_seq_len:
                cos, sin = rope_tables(self.config.block_config(), target.max_seq_len)
                adapter.rope_cos, adapter.rope_sin = cos.to(target.device), sin.to(target.device)
            adapter.use_kernels(target.kernels)
            head = proposal_head(target, adapter.vocab_ids)
            stack = self._draft_stack(target, head)
            self._ready = (target, adapter, head, stack)
            self.runtime = stack.label if stack is not None else "eager"
        return self._ready[1], self._ready[2], self._ready[3]

    def _draft_stack(self, target: "Model", head: torch.Tensor) -> Optional[_DraftStack]:
        """The draft (exit layers, adapter layer, final norm, proposal head) as one call of a llama-family
        module, or None where it cannot be (gpt2; RoPE other than the adapter's own): the eager path.

        With ``quant`` and a dense CPU target, the module is a packed copy of the exit layers only,
        sharing the target's embedding, norms and RoPE tables, with the adapter's layer and the head
        packed alike: a draft step reads about half the bytes (drafts only: exactness is the
        verifier's). Otherwise the target's own module runs its exit layers and the adapter's layer,
        stored as its own layers are (a packed target's: in its format)."""
        if target.config.family != "llama":
            return None
        mine = self.adapter
        n = min(mine.rope_cos.shape[0], target.module.rope_cos.shape[0])
        if not (torch.allclose(mine.rope_cos[:n].to(target.device), target.module.rope_cos[:n].float(), atol=1e-5)
                and torch.allclose(mine.rope_sin[:n].to(target.device), target.module.rope_sin[:n].float(), atol=1e-5)):
            return None
        fmt = target.quant.fmt if target.quant is not None else self.quant
        kernels = target.kernels
        if target.quant is None and fmt is not None:
            try:
                if target.device.type != "cpu" or target.dtype != torch.float32:
                    raise QuantUnavailableError("packed drafts run on the CPU with fp32 activations")
                kernels = quantized_kernels(target.kernels, fmt)
            except QuantUnavailableError as e:
                log.warning("layerskip-adapter: the draft keeps %s weights (%s)", target.weight_dtype, e)
                fmt, kernels = None, target.kernels
        own = target.module.layers[0]
        dense = next(p for p in target.module.parameters() if p.dim() == 2 and p.dtype.is_floating_point)

        def stored(w: torch.Tensor, like: torch.Tensor) -> nn.Parameter:
            w = w.detach().to(target.device)
            packed = quantize(w, fmt) if fmt is not None and w.dim() == 2 else w.to(like.dtype)
            return nn.Parameter(packed.contiguous(), requires_grad=False)

        block = LlamaBlock(self.config.block_config(), layer=self.config.n_layers)
        with torch.no_grad():
            for name, p in mine.block.named_parameters():
                setattr(block, name, stored(p, dense if p.dim() == 2 else getattr(own, name)))
        block.kernels = kernels
        packed_head = quantize(head, fmt) if fmt is not None else head
        if target.quant is not None or fmt is None:  # the target's own module and layers
            return _DraftStack(target.module, self.plan.layers if self.plan is not None else None, block,
                               packed_head, target.quant.fmt if target.quant is not None else "dense")
        from ..models.loading import quantized_copy

        copy = quantized_copy(target, fmt, n_layers=self.config.exit_layer)  # the exit layers only
        return _DraftStack(copy.module, None, block, packed_head, f"{fmt}-draft")

    def _partial_logits(self, ids: torch.Tensor, view: KVCache, rows: slice, last_only: bool) -> torch.Tensor:
        """The exit layers on the view, then the adapter layer on the view's adapter layer, the final norm
        and the proposal head. Llama family: one module call; else the exit layers (their own output
        layer asked for one row only: unused), then the adapter at the same slots."""
        assert self._target is not None and self.plan is not None
        target, layers = self._target, self.plan.layers
        adapter, head, stack = self._prepared(target)
        if stack is not None:
            meta = view.prepare(ids.shape[1], rows)
            logits = stack.module(ids, meta, view, last_only=last_only, head=stack.head, layers=stack.layers,
                                  blocks=(stack.block,))
            view.commit(meta)
            return full_vocab_logits(logits.float(), adapter.vocab_ids, target.vocab_size)
        lo, hi, _ = rows.indices(view.batch_size)
        starts = view.lengths[lo:hi]
        out = target.run(ids, view, rows, head=target.output_matrix()[:1], hidden_layers=(layers[-1],), layers=layers)
        view.lengths[lo:hi] = starts  # the adapter layer writes the same slots, then the lengths advance again
        meta = view.prepare(ids.shape[1], rows)
        x = adapter(out.layers[layers[-1]], meta.positions, meta, view)
        view.commit(meta)
        if last_only:
            x = x[:, -1:]
        logits = target.kernels.linear(final_norm(target, x), head).float()
        return full_vocab_logits(logits, adapter.vocab_ids, target.vocab_size)

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """The early exit's measured costs with the adapter's step (timed here) added to c, and the
        output layer's saving over the proposal vocabulary taken off; cached under a key of their
        own (with the adapter's files and run-time format), so the γ policy's corrections of them
        never rewrite the plain early exit's figures."""
        if self.gamma != "auto":
            return None
        if target is not self._target:
            self.prepare_rows(target, 1, target.max_seq_len)
        if self.plan is None:
            return None
        key = costs_key(target, target, draft_layers=self.plan.layers, extra=self._stamp())
        cached = cached_costs(key)
        if cached is not None:
            return cached
        costs = super().costs_for(target)
        if costs is None or costs.target_s == ():
            return costs
        if self._extra_s is None or self._extra_s[0] is not target:
            self._extra_s = (target, self._adapter_seconds(target))
        out = dataclasses.replace(costs, c=max(0.0, costs.c + self._extra_s[1] / costs.target_s[0]), key=key)
        store_costs(out)
        return out

    def _stamp(self) -> str:
        """What identifies this adapter's draft step for the cost cache: its files and run-time format."""
        w = Path(self.where) / WEIGHTS_FILE
        try:
            files = f"{w.resolve()}:{w.stat().st_size}:{int(w.stat().st_mtime)}"
        except OSError:  # built in memory (tests): its shape stands in
            files = json.dumps(asdict(self.config), sort_keys=True, default=str)
        return f"exit-adapter={files}|quant={self.quant}"

    def _adapter_seconds(self, target: "Model", reps: int = 8) -> float:
        """Least time (load only adds time; the γ policy refines c from the live passes) of an adapter
        step on one token over a 128-token adapter cache (layer, final norm,
        proposal head) minus that of the full output layer the partial model's forward would run."""
        adapter, head, stack = self._prepared(target)
        if stack is not None:  # the whole draft is one module call: time it against the plain exit
            return self._stack_seconds(target, stack, reps)
        cfg = self.config
        cache = KVCache(cfg.n_layers + 1, 1, cfg.n_kv_heads, 160, cfg.head_dim, target.dtype, target.device)
        cache.lengths[0] = 128
        h = torch.randn(1, 1, cfg.dim, device=target.device)
        clock, full = cost_clock(target), target.output_matrix()
        with_adapter, head_only = [], []
        with torch.inference_mode():
            for _ in range(reps):
                t0 = clock()
                meta = cache.prepare(1)
                x = adapter(h, meta.positions, meta, cache)
                float(target.kernels.linear(final_norm(target, x), head)[0, 0, 0])
                t1 = clock()
                float(target.kernels.linear(final_norm(target, h), full)[0, 0, 0])
                t2 = clock()
                with_adapter.append(t1 - t0)
                head_only.append(t2 - t1)
        return min(with_adapter) - min(head_only)

    def _stack_seconds(self, target: "Model", stack: _DraftStack, reps: int) -> float:
        """Least time of the draft's one-token step (``stack``: one module call) minus that of the exit
        layers with the full output layer, which the partial model's measured c already holds."""
        assert self.plan is not None
        cfg, layers = self.config, self.plan.layers
        cache = KVCache(cfg.n_layers + 1, 1, cfg.n_kv_heads, 160, cfg.head_dim, target.dtype, target.device)
        ids = torch.ones(1, 1, dtype=torch.long, device=target.device)
        clock = cost_clock(target)
        ours, plain = [], []
        with torch.inference_mode():
            for _ in range(reps):
                cache.lengths[0] = 128
                t0 = clock()
                meta = cache.prepare(1)
                float(stack.module(ids, meta, cache, last_only=True, head=stack.head, layers=stack.layers,
                                   blocks=(stack.block,))[0, 0, 0])
                t1 = clock()
                float(target.forward(ids, cache, last_only=True, layers=layers)[0, 0, 0])
                t2 = clock()
                ours.append(t1 - t0)
                plain.append(t2 - t1)
                cache.lengths[0] = 128
        return min(ours) - min(plain)


@dataclass
class _DraftStack:
    """The exit draft as one module call, ``module(ids, meta, view, head=head, layers=layers,
    blocks=(block,))``; ``label`` names how its matrices are stored."""

    module: nn.Module
    layers: Optional[tuple[int, ...]]
    block: LlamaBlock
    head: torch.Tensor
    label: str


__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "ExitAdapter", "ExitAdapterConfig", "ExitAdapterDrafter",
           "ExitAdapterError", "check_fits", "final_norm", "full_vocab_logits", "is_exit_adapter_dir",
           "load_adapter", "proposal_head", "save_adapter"]
