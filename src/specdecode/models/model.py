"""A loaded model as the engine calls it: ``Model`` (the module plus tokenizer, EOS, dtypes, kernels)
and its one model call, ``Model.run`` (``Model.forward``: the same call, logits only).
``loading.py`` builds it from a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, cast

import torch
from tokenizers import Tokenizer
from torch import nn

from ..cache import KVCache
from ..kernels import Kernels, install_kernels
from .config import ModelConfig
from .graphs import PassGraphs


@dataclass
class QuantState:
    """A model whose layer matrices are packed ``fmt`` blocks (``kernels/quant.py``).

    ``head``: the output matrix, packed, which forward multiplies by when no ``head`` is passed
    (the dense table stays for the embedding lookup and for drafters that take rows of it).
    ``logical``: each packed parameter's weight count, for ``num_parameters``."""

    fmt: str
    head: torch.Tensor
    logical: dict[str, int] = field(default_factory=dict)


@dataclass
class ForwardOutput:
    """What ``Model.run`` returns: logits, and the hidden states a draft head reads."""

    logits: torch.Tensor  # float32 [B, T (or 1 with last_only), V]
    hidden: Optional[torch.Tensor] = None  # final normed hidden [B, T or 1, dim] (the lm_head input)
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # residual stream after layer i


class Model:
    """A loaded checkpoint: the module plus what the engine needs around it."""

    def __init__(self, module: nn.Module, config: ModelConfig, tokenizer: Optional[Tokenizer],
                 eos_token_ids: Sequence[int], path: str, max_seq_len: int, dtype: torch.dtype,
                 quant: Optional[QuantState] = None, *, kv_dtype: Optional[torch.dtype] = None) -> None:
        self.module = module
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.path = path
        self.max_seq_len = max_seq_len
        self.device = next(module.parameters()).device
        self.dtype = dtype  # compute (activation) dtype
        # KV-cache storage dtype of ``new_cache`` (load_model's kv_dtype; see resolve_kv_dtype)
        self.kv_dtype = kv_dtype if kv_dtype is not None else dtype
        # storage dtype of the dense matrices (with quantized weights: the embedding table's)
        # (the compute dtype when every matrix is packed or kept as stored)
        self.weight_dtype = next((p.dtype for p in module.parameters() if p.dim() == 2 and p.dtype.is_floating_point),
                                 dtype)
        self.quant = quant
        # decode passes of up to this many new tokens run padded to exactly this many rows, attending over the
        # cache's whole capacity, so a row's numbers never depend on the pass's width: batch invariance for
        # kernels that lack it (load_model's fixed_rows; see resolve_fixed_rows). None: passes as they come
        self.fixed_rows: Optional[int] = None
        # whether a tree's rows get the arithmetic of the chain through them: the CPU's fp32 kernels only
        # (load_model; see with_pass_settings). False: the core verifies a greedy row's tree as its first path
        self.exact_trees = True
        # those passes replayed as CUDA graphs (load_model's cuda_graphs); None: run eagerly
        self.graphs: Optional[PassGraphs] = None
        # the checkpoint's chat template (GGUF metadata, or tokenizer_config.json / chat_template.jinja),
        # None when it has none; bos/eos texts are what templates may print
        self.chat_template: Optional[str] = None
        self.bos_token = ""
        self.eos_token = ""
        # the tokenizer's own scores of its tokens where the file states them (a SentencePiece vocabulary's, from
        # GGUF), higher = more common: ``token_ranking`` reads them
        self.token_scores: Optional[torch.Tensor] = None

    @property
    def weight_format(self) -> str:
        """How the layer matrices are stored: "int8", "int4" (quantized blocks) or the dense dtype's name."""
        return self.quant.fmt if self.quant is not None else str(self.weight_dtype).replace("torch.", "")

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def kernels(self) -> Kernels:
        """What this model computes with (chosen by ``load_model``; see ``specdecode.kernels.Kernels``)."""
        return cast(Kernels, self.module.kernels)

    @kernels.setter
    def kernels(self, kernels: Kernels) -> None:
        if self.quant is not None and not kernels.mode.startswith(self.quant.fmt):
            raise ValueError(f"{self.name} holds {self.quant.fmt} weights: only the quantized kernels can run it")
        install_kernels(self.module, kernels)

    @property
    def fast(self) -> bool:
        """Whether this model runs the small-M CPU kernel (else eager PyTorch)."""
        return self.kernels.fast

    @property
    def name(self) -> str:
        return Path(self.path).name or self.path

    def num_parameters(self) -> int:
        if self.quant is not None:  # packed matrices count their weights, not their bytes
            return sum(self.quant.logical.get(n, p.numel()) for n, p in self.module.named_parameters())
        return sum(p.numel() for p in self.module.parameters())

    def output_matrix(self) -> torch.Tensor:
        """The [V, dim] matrix that maps the final hidden state to logits (tied or not)."""
        return cast(torch.Tensor, self.module.output_matrix())  # type: ignore[operator]

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (1-D) of ``output_matrix()``, decoding only those of a table kept as stored."""
        return cast(torch.Tensor, self.module.output_rows(ids))  # type: ignore[operator]

    def stand_in_head(self) -> torch.Tensor:
        """One output row: the head of a pass that wants hidden states, not logits."""
        return self.output_rows(torch.zeros(1, dtype=torch.long, device=self.device))

    def token_ranking(self) -> torch.Tensor:
        """Token ids, likeliest first, as far as the tokenizer tells: by its scores when it has them, else by id
        (a BPE vocabulary's ids follow its merges, which follow frequency). A prior for vocabulary cuts."""
        if self.token_scores is not None and self.token_scores.numel() == self.vocab_size:
            return torch.argsort(-self.token_scores, stable=True)
        return torch.arange(self.vocab_size)

    def embedding_matrix(self) -> torch.Tensor:
        """The [V, dim] input embedding (a new fp32 copy when kept as stored)."""
        return cast(torch.Tensor, self.module.embedding_matrix())  # type: ignore[operator]

    def new_cache(self, batch_size: int = 1, max_len: Optional[int] = None) -> KVCache:
        """A KV cache for ``batch_size`` rows of ``max_len`` tokens; with CUDA graphs, on storage the graphs lend."""
        c = self.config
        length = max_len or self.max_seq_len

        def make(storage: Optional[torch.Tensor] = None) -> KVCache:
            return KVCache(c.n_layers, batch_size, c.n_kv_heads, length, c.head_dim, self.kv_dtype, self.device,
                           storage)
        if self.graphs is None:
            return make()
        shape = (2, c.n_layers, batch_size, c.n_kv_heads, length, c.head_dim)
        return self.graphs.lend_cache(make, shape, self.kv_dtype, self.device)

    def forward(self, tokens: torch.Tensor, cache: KVCache, rows: Optional[slice] = None,
                last_only: bool = False, head: Optional[torch.Tensor] = None, *,
                positions: Optional[torch.Tensor] = None, tree_mask: Optional[torch.Tensor] = None,
                layers: Optional[tuple[int, ...]] = None) -> torch.Tensor:
        """Append ``tokens`` [B, T] to the cache rows and return float32 logits [B, T or 1, V].

        ``head`` replaces the output matrix (rows of ``output_matrix()``: a draft's restricted
        vocabulary), and the logits then have one column per row of it. ``positions`` and
        ``tree_mask``: see ``run``. ``layers`` (a tuple of increasing layer numbers, checked by
        ``check_layers``): run only those layers, then the final norm and the output layer (a
        layer-skip draft); layer i still uses cache layer i and the others are left untouched."""
        return self.run(tokens, cache, rows, last_only=last_only, head=head, positions=positions, tree_mask=tree_mask,
                        layers=layers).logits

    def check_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        """``layers`` as ``forward(..., layers=)`` takes it, or a ValueError saying what is wrong."""
        n = self.config.n_layers
        out = tuple(int(i) for i in layers)
        if not out or any(not 0 <= i < n for i in out) or list(out) != sorted(set(out)):
            raise ValueError(f"layers must be distinct increasing layer numbers in 0..{n - 1} ({self.name} has "
                             f"{n} layers), got {list(out)}")
        return out

    def run(self, tokens: torch.Tensor, cache: KVCache, rows: Optional[slice] = None, *, last_only: bool = False,
            head: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
            tree_mask: Optional[torch.Tensor] = None, return_hidden: bool = False,
            hidden_layers: Sequence[int] = (), layers: Optional[tuple[int, ...]] = None) -> ForwardOutput:
        """The one model call: the logits plus, on request, hidden states (``forward`` is its logits).

        ``tree_mask`` ([B, T, T] or [T, T] bool): ``[b, i, j]`` True iff new token j is token i or one
        of its ancestors in the draft tree; new token i then attends to every key the row held before
        this pass plus those j (None: the causal chain). The tokens still take cache slots
        start .. start + T - 1 of each row; after verification ``cache.keep(indices, row)`` packs the
        accepted path. ``positions`` ([B, T] int64): RoPE / learned positions; by default
        start + arange(T), or start + depth under a tree mask (depth = number of ancestors).
        ``return_hidden``: also return the final normed hidden state (the input of the output
        projection, at no extra cost); ``hidden_layers``: the residual stream after each of these
        layers (0-based; transformers' ``hidden_states[i + 1]``). Both follow ``last_only``.
        The fused CPU path takes tree masks of at most 64 new tokens. ``layers``: see ``forward``
        (``hidden_layers`` then names layers among them).
        """
        if head is None and self.quant is not None:
            head = self.quant.head
        captured = tuple(int(i) for i in hidden_layers)
        bad = [i for i in captured if not 0 <= i < self.config.n_layers]
        if bad:
            raise ValueError(f"hidden_layers {bad} outside 0..{self.config.n_layers - 1}")
        if torch.is_inference_mode_enabled():
            return self._run(tokens, cache, rows, last_only, head, positions, tree_mask, return_hidden, captured,
                             layers)
        with torch.inference_mode():
            return self._run(tokens, cache, rows, last_only, head, positions, tree_mask, return_hidden, captured,
                             layers)

    def _run(self, tokens: torch.Tensor, cache: KVCache, rows: Optional[slice], last_only: bool,
             head: Optional[torch.Tensor], positions: Optional[torch.Tensor], tree_mask: Optional[torch.Tensor],
             return_hidden: bool, captured: tuple[int, ...], layers: Optional[tuple[int, ...]]) -> ForwardOutput:
        meta = cache.prepare(tokens.shape[1], rows, positions, tree_mask)
        if return_hidden or captured:
            meta.capture = captured
        t = tokens.shape[1]
        if self.fixed_rows is not None and t <= self.fixed_rows:  # one shape for every decode pass
            meta.fixed = self.fixed_rows
            tokens = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], self.fixed_rows - t)], 1)
            last_only, real_last = False, last_only
        logits = None
        if self.graphs is not None and meta.fixed is not None:
            logits = self.graphs.run(self.module, tokens, meta, cache, head, layers)
        if logits is None and layers is None:
            logits = self.module(tokens, meta, cache, last_only=last_only, head=head)
        elif logits is None:
            logits = self.module(tokens, meta, cache, last_only=last_only, head=head, layers=layers)
        cache.commit(meta)
        if meta.fixed is not None:  # back to the real rows
            keep = slice(t - 1, t) if real_last else slice(0, t)
            logits = logits[:, keep]
            meta.hidden = meta.hidden[:, keep] if meta.hidden is not None else None
            meta.layer_states = {i: h[:, keep] for i, h in (meta.layer_states or {}).items()}
        return ForwardOutput(logits.float(), meta.hidden if return_hidden else None, dict(meta.layer_states or {}))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok().encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok().decode(list(ids), skip_special_tokens=True)

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{self.path} has no tokenizer.json; pass the prompt as a list of token ids")
        return self.tokenizer
