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

The adapter module and its directory: ``exit_adapter_model.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union, cast

import torch
from torch import nn

from ..cache import KVCache
from ..config import ConfigError
from ..sizing.book import CostSpec
from ..sizing.costs import Costs, Step, cost_clock, time_steps
from ..kernels.quant import QUANT_FORMATS, QuantUnavailableError, quantize, quantized_kernels
from ..models.llama import LlamaBlock, rope_tables
from .base import Gamma
from .exit_adapter_model import (BLOCK_WEIGHTS, CONFIG_FILE, FORMAT_VERSION, WEIGHTS_FILE, ExitAdapter,
                                 ExitAdapterConfig, ExitAdapterError, check_fits, final_norm, full_vocab_logits,
                                 is_exit_adapter_dir, load_adapter, proposal_head, save_adapter)
from .layerskip import DraftLayers, LayerSkipDrafter
from .vocab import DraftVocab
from .plugin import Artifact, BenchVariant, DrafterOptions, DrafterSpec

if TYPE_CHECKING:
    from ..models import Model
    from ..models.llama import LlamaModel

QUANT = "int4"  # the draft's matrices at run time on a dense CPU target (drafts only: exactness unaffected)
log = logging.getLogger(__name__)

# -- the drafter ---------------------------------------------------------------------------------
class ExitAdapterDrafter(LayerSkipDrafter):
    """A layer-skip early exit whose residual passes through a trained exit adapter (a ``BatchDrafter``).

    Everything else is ``LayerSkipDrafter``'s: the draft runs the target's first ``exit_layer`` layers
    on the target's own KV entries, the adapter's layer on a cache layer of its own (caught up with
    the verified tokens like a skip set's own layers), and verification is the core's, so the output
    is exact whatever the adapter computes."""

    def __init__(self, adapter: ExitAdapter, gamma: Gamma = "auto", where: Union[str, Path] = "the exit adapter",
                 share_cache: bool = True, quant: Optional[str] = QUANT) -> None:
        super().__init__(exit_layer=adapter.cfg.exit_layer, gamma=gamma, share_cache=share_cache,
                         draft_vocab="full")  # its own head decides what it proposes
        if quant is not None and quant not in QUANT_FORMATS:
            raise ConfigError(f"quant (the exit draft's run-time weights) must be None or one of "
                              f"{', '.join(QUANT_FORMATS)}, got {quant!r}")
        self.adapter, self.where, self.quant = adapter, str(where), quant
        self.runtime = "eager"  # how the draft's matrices run, once prepared (see ``_draft_stack``)
        # target, the adapter there, its proposal head, and (llama family) the whole draft as one module call
        self._ready: Optional[tuple["Model", ExitAdapter, torch.Tensor, Optional[_DraftStack]]] = None

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
        module = cast("LlamaModel", target.module)  # the llama family's module
        mine = self.adapter
        n = min(mine.rope_cos.shape[0], module.rope_cos.shape[0])
        if not (torch.allclose(mine.rope_cos[:n].to(target.device), module.rope_cos[:n].float(), atol=1e-5)
                and torch.allclose(mine.rope_sin[:n].to(target.device), module.rope_sin[:n].float(), atol=1e-5)):
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
        own = cast("LlamaBlock", module.layers[0])
        # the dtype of the target's dense matrices (a GGUF target packed as stored has none: its compute dtype)
        dense = next((p.dtype for p in target.module.parameters() if p.dim() == 2 and p.dtype.is_floating_point),
                     target.dtype)

        def stored(w: torch.Tensor, like: torch.dtype) -> nn.Parameter:
            w = w.detach().to(target.device)
            packed = quantize(w, fmt) if fmt is not None and w.dim() == 2 else w.to(like)
            return nn.Parameter(packed.contiguous(), requires_grad=False)

        block = LlamaBlock(self.config.block_config(), layer=self.config.n_layers)
        with torch.no_grad():
            for name, p in mine.block.named_parameters():
                setattr(block, name, stored(p, dense if p.dim() == 2 else getattr(own, name).dtype))
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
        out = target.run(ids, view, rows, head=target.stand_in_head(), hidden_layers=(layers[-1],), layers=layers)
        view.lengths[lo:hi] = starts  # the adapter layer writes the same slots, then the lengths advance again
        meta = view.prepare(ids.shape[1], rows)
        x = adapter(out.layers[layers[-1]], meta.positions, meta, view)
        view.commit(meta)
        if last_only:
            x = x[:, -1:]
        logits = target.kernels.linear(final_norm(target, x), head).float()
        return full_vocab_logits(logits, adapter.vocab_ids, target.vocab_size)

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """The layer-skip drafter's costs (``cost_spec``), once the adapter's layers are chosen for ``target``."""
        if self.gamma != "auto":
            return None
        if target is not self._target:
            self.prepare_rows(target, 1, target.max_seq_len)
        if self.plan is None:
            return None
        return super().costs_for(target)

    def cost_spec(self, target: "Model", plan: DraftLayers, cut: Optional[DraftVocab]) -> CostSpec:
        """The early exit's steps with the adapter's step (timed apart) added to c, and the output layer's
        saving over the proposal vocabulary taken off; under a key of their own (the adapter's files and
        run-time format), so the γ policy's corrections of them never rewrite the plain early exit's figures."""
        plain = super().cost_spec(target, plan, cut)

        def with_adapter(costs: Costs) -> Costs:
            return dataclasses.replace(costs, c=max(0.0, costs.c + self._adapter_seconds(target) / costs.target_s[0]))

        return CostSpec(f"{plain.what}|{self._stamp()}", plain.models, base=plain, adjust=with_adapter)

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
        step on one token over a 128-token adapter cache (layer, final norm, proposal head) minus that
        of the full output layer the partial model's forward would run, both timed by the cost model
        (``time_steps``). A llama-family draft is one module call: timed against the plain exit."""
        adapter, head, stack = self._prepared(target)
        assert self.plan is not None
        cfg, layers = self.config, self.plan.layers
        cache = KVCache(cfg.n_layers + 1, 1, cfg.n_kv_heads, 160, cfg.head_dim, target.dtype, target.device)
        cache.lengths[0] = 128
        full = target.output_matrix()
        ids = torch.ones(1, 1, dtype=torch.long, device=target.device)
        h = torch.randn(1, 1, cfg.dim, device=target.device) if stack is None else ids  # an adapter input

        def rewind() -> None:
            cache.lengths[0] = 128

        def adapter_step() -> None:
            meta = cache.prepare(1)
            x = adapter(h, meta.positions, meta, cache)
            float(target.kernels.linear(final_norm(target, x), head)[0, 0, 0])

        def stack_step() -> None:
            assert stack is not None
            meta = cache.prepare(1)
            float(stack.module(ids, meta, cache, last_only=True, head=stack.head, layers=stack.layers,
                               blocks=(stack.block,))[0, 0, 0])

        if stack is not None:  # the exit layers with the full output layer: what the measured c already holds
            ours = Step(stack_step, rewind)
            plain = Step(lambda: float(target.forward(ids, cache, last_only=True, layers=layers)[0, 0, 0]), rewind)
        else:
            ours = Step(adapter_step, rewind)
            plain = Step(lambda: float(target.kernels.linear(final_norm(target, h), full)[0, 0, 0]))
        _, got = time_steps({}, {"ours": ours, "plain": plain}, cost_clock(target), target.device, reps, min)
        return got["ours"] - got["plain"]


@dataclass
class _DraftStack:
    """The exit draft as one module call, ``module(ids, meta, view, head=head, layers=layers,
    blocks=(block,))``; ``label`` names how its matrices are stored."""

    module: nn.Module
    layers: Optional[tuple[int, ...]]
    block: LlamaBlock
    head: torch.Tensor
    label: str


__all__ = ["BLOCK_WEIGHTS", "CONFIG_FILE", "FORMAT_VERSION", "WEIGHTS_FILE", "ExitAdapter", "ExitAdapterConfig",
           "ExitAdapterDrafter",
           "ExitAdapterError", "check_fits", "final_norm", "full_vocab_logits", "is_exit_adapter_dir",
           "load_adapter", "proposal_head", "save_adapter"]


EXIT_ADAPTER = Artifact("exit-adapter", "an exit adapter directory", "an exit adapter directory",
                        "specdecode distill --method early-exit --target TARGET --out DIR",
                        lambda p: is_exit_adapter_dir(p), "--exit-adapter", bundled="code-exit-adapter")


def _build(o: DrafterOptions) -> ExitAdapterDrafter:
    path = o.artifact(EXIT_ADAPTER.name)
    assert path is not None
    return ExitAdapterDrafter.load(path, gamma=o.gamma)


SPECS = (DrafterSpec(
    "layerskip-adapter", "self-speculation: the target's first layers plus a trained exit adapter (--heads DIR from "
    "`specdecode distill --method early-exit`; the bundled target's by default)", _build, artifacts=(EXIT_ADAPTER,),
    bench=(BenchVariant("layerskip-adapter", "layer-skip early exit through a trained exit adapter, γ from --gammas",
                        sweep="gammas"),)),)
