"""Layer-skip self-speculation: the target drafts for itself with a subset of its own layers.

No second model and no training (Draft & Verify, arXiv:2309.08168; SWIFT, arXiv:2410.06916;
LayerSkip, arXiv:2404.16710): the draft is the target's module run over some of its layers,
then its final norm and output layer, autoregressively for γ tokens. Two shapes:

* an **early exit**: the first L layers (``DraftLayers.exit(L, n)``);
* a **skip set**: every layer but some (``DraftLayers.skip({...}, n)``).

**Cache sharing.** The draft's layers before its first skipped layer are computed exactly as
the target computes them (same weights, same inputs), so their keys and values at verified
positions *are* the target's. The draft attends over the target's own cache rows for those
layers (``DraftContext.target_cache``, viewed with ``KVCache.over_layers``) and writes its
speculative entries into the slots past the row's length, which the target's next pass
overwrites before it reads them. An early exit therefore keeps no cache and no per-row state
at all, and never re-feeds a token: each step feeds the pending token, then its own drafts.
A skip set keeps its own entries only for the layers after its first skipped one (their inputs
differ from the target's); catching those up after a fully accepted draft feeds one verified
token through the shared layers too, which would overwrite the target's entry at that slot, so
those few slots are saved and restored bit for bit. The target's cache ends every step exactly
as it would without the drafter (``tests/unit/test_layerskip.py`` compares it).

The draft's law (greedy argmax, or the filtered law a token is drawn from, in ``Draft.probs``)
is whatever these layers compute; verification is the core's, so the output is exact either way.
Which layers to run comes from ``specdecode calibrate`` (``layerskip.json`` beside the
checkpoint, or in the cache directory), an explicit ``exit_layer``/``skip_layers``, or an
uncalibrated default (with a log line); ``layerskip_layers.py`` holds the layer sets and their
calibration files (re-exported here).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import torch

from ..cache import KVCache
from ..config import ConfigError
from ..sizing.book import CostSpec, chain_spec
from ..sizing.costs import Costs
from ..ops import argmax_list
from ..sampling import probs_from_logits
from ..draft import Draft, DraftContext, draw_token
from .base import Acceptance, BatchDrafter, BatchDrafterBase, Gamma, check_gamma, draft_rows
from .layerskip_layers import (CALIBRATION_FILE, CALIBRATION_VERSION, SUPPORTED_FAMILIES, DraftLayers,
                               cached_calibration_path, calibration_paths, check_family, load_calibration,
                               save_calibration, weights_stamp)
from .plugin import Artifact, AutoMember, BenchVariant, DrafterOptions, DrafterSpec, Option
from .vocab import DraftVocab, VocabSpec, parse_vocab_spec, self_draft_ids

if TYPE_CHECKING:
    from ..models import Model

log = logging.getLogger(__name__)

# -- the drafter ---------------------------------------------------------------------------------
class LayerSkipDrafter(BatchDrafterBase):
    """Drafts γ tokens per row with a subset of the target's own layers (a ``BatchDrafter``).

    ``exit_layer`` (the first L layers) or ``skip_layers`` (layers to leave out) override the
    calibration; with neither, ``layerskip.json`` decides (in ``calibration_dir``, the ``layerskip``
    artifact, else beside the checkpoint or in the cache), else ``DraftLayers.default``.
    ``gamma``: draft length or "auto" (the core's γ policy, from the measured c of the partial
    model: it switches speculation off when it does not pay). ``share_cache=False`` keeps a
    separate draft cache for every draft layer (the reference the sharing is tested against).
    ``draft_vocab``: the tokens the draft may propose (``vocab.self_draft_ids``): on a target whose output
    matrix dominates a pass, a draft over a cut of it costs a fraction of one over every token.
    """

    wants_hidden = False

    def __init__(self, exit_layer: Optional[int] = None, skip_layers: Optional[Sequence[int]] = None,
                 gamma: Gamma = "auto", share_cache: bool = True, calibration_dir: Optional[str] = None,
                 draft_vocab: VocabSpec = "auto") -> None:
        if exit_layer is not None and skip_layers is not None:
            raise ConfigError("give an exit layer or skip layers, not both")
        self.gamma = check_gamma(gamma)
        self.exit_layer, self.skip_layers = exit_layer, tuple(skip_layers) if skip_layers is not None else None
        self.share_cache = share_cache
        self.calibration_dir = calibration_dir
        self.draft_vocab = parse_vocab_spec(draft_vocab)
        self.cut: Optional[DraftVocab] = None  # the proposable tokens and their output rows (None: all)
        self.acceptance = Acceptance()
        self.plan: Optional[DraftLayers] = None
        self.calibration: Optional[dict[str, Any]] = None  # the stored record the plan came from, if any
        self._target: Optional["Model"] = None
        self._rows, self._max_len = 0, 0
        self._viewed: Optional[KVCache] = None  # the target cache the view shares (None: not sharing)
        self._seen: Optional[KVCache] = None  # the target cache of the core the view was made for
        self._view: Optional[KVCache] = None  # layer i -> the target's (shared) or our own entries
        self._own: Optional[KVCache] = None  # entries of the layers we cannot share
        self._shared = 0  # leading draft layers read from the target's cache
        self._n_cached: list[int] = []  # per row: sequence tokens the own layers hold (0.._n_cached-1)
        self._base: list[int] = []  # per row: sequence length when its last draft started
        self._drafted: list[int] = []
        self._costs: Optional[tuple["Model", tuple[int, ...], Costs]] = None
        self._unusable: Optional[str] = None  # why this drafter cannot serve the prepared target

    # -- setup ------------------------------------------------------------------------------------
    def resolve(self, target: "Model") -> DraftLayers:
        """The layers this drafter runs on ``target`` (explicit, calibrated, or the default)."""
        check_family(target)
        n = target.config.n_layers
        self.calibration = None
        if self.exit_layer is not None:
            return DraftLayers.exit(self.exit_layer, n)
        if self.skip_layers is not None:
            return DraftLayers.skip(self.skip_layers, n)
        found = load_calibration(target.path, n, self.calibration_dir)
        if found is not None:
            plan, self.calibration, path = found
            speedup = self.calibration.get("measured_speedup")
            # say it once here when the calibration found no paying layers, so auto leaving it out reads as a
            # consequence, not a contradiction
            verdict = ", so it does not pay here" if self.calibration.get("speculation_pays") is False else ""
            log.info("layerskip: calibrated for this target (%s): %s%s%s", path, plan.describe(),
                     f", measured at {speedup:.2f}x plain decoding" if isinstance(speedup, (int, float)) else "",
                     verdict)
            return plan
        plan = DraftLayers.default(n)
        log.info("layerskip: uncalibrated for this target, so the default: %s; run `specdecode calibrate "
                 "--target %s` to search for the fastest layers on your prompts", plan.describe(), target.path)
        return plan

    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        """Choose the layers once per target. A target this drafter cannot serve (one layer, another
        family) fails at the first proposal, not here: the server loads every registered drafter."""
        if target is not self._target:
            try:
                self.plan, self._unusable = self.resolve(target), None
                self.cut = self.make_cut(target)
            except ConfigError as e:
                self.plan, self.cut, self._unusable = None, None, str(e)
            self._target = target
            self._viewed = self._seen = self._view = self._own = None
            self._n_cached, self._base, self._drafted = [], [], []
        self._rows, self._max_len = max(self._rows, rows), max(self._max_len, max_len)
        grow = self._rows - len(self._n_cached)
        for xs in (self._n_cached, self._base, self._drafted):
            xs.extend([0] * grow)

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """c of the partial model and v(k) of the target, measured once per machine and layer set (for
        the γ policy; None for a fixed γ)."""
        if self.gamma != "auto" or (target is self._target and self.plan is None):
            return None
        plan = self.plan if target is self._target and self.plan is not None else self.resolve(target)
        cut = self.cut if target is self._target else self.make_cut(target)
        if self._costs is None or self._costs[0] is not target or self._costs[1] != plan.layers:
            self._costs = (target, plan.layers, self.pricer.costs(target, self.cost_spec(target, plan, cut)))
        return self._costs[2]

    def cost_spec(self, target: "Model", plan: DraftLayers, cut: Optional[DraftVocab]) -> CostSpec:
        """What the cost book times for this drafter: ``plan``'s layers of the target as the draft step."""
        return chain_spec(target, target, draft_head=cut.head if cut is not None else None, draft_layers=plan.layers,
                          label="the layer-skip exit's")

    def make_cut(self, target: "Model") -> Optional[DraftVocab]:
        """The draft's restricted output on ``target`` (None: every token)."""
        ids = self_draft_ids(target, self.draft_vocab)
        if ids is None:
            return None
        ids = ids.to(target.device)
        return DraftVocab(ids, self.cut_rows(target, ids), target.vocab_size)

    def cut_rows(self, target: "Model", ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the output matrix as the draft multiplies by them: packed like the target's own
        (its rounding moves what is proposed, never what is accepted), else as stored."""
        from ..kernels.quant import quantize

        rows = target.output_rows(ids)
        if target.quant is None:
            return rows.contiguous()
        return quantize(rows, "int8" if target.quant.head.dtype == torch.int8 else "int4")

    def _setup(self, target_cache: Optional[KVCache]) -> KVCache:
        """The cache the draft runs on: a view of the target's cache for the shared layers plus our own
        for the rest (or our own for all, without a target cache or with ``share_cache=False``)."""
        if self._view is not None and target_cache is self._seen:
            return self._view
        target, plan = self._target, self.plan
        if self._unusable is not None:
            raise ConfigError(self._unusable)
        if target is None or plan is None:
            raise RuntimeError("LayerSkipDrafter.prepare_rows(target, ...) must be called before proposing")
        share = target_cache is not None and self.share_cache
        self._shared = plan.shared if share else 0
        extra = self.extra_cache_layers()
        own_layers = plan.layers[self._shared:] + tuple(range(target.config.n_layers, target.config.n_layers + extra))
        cfg = target.config
        if share:
            assert target_cache is not None
            rows, max_len = target_cache.batch_size, target_cache.max_len
        else:
            rows, max_len = self._rows, min(self._max_len, target.max_seq_len)
        k: list[Optional[torch.Tensor]] = [None] * (cfg.n_layers + extra)
        v: list[Optional[torch.Tensor]] = [None] * (cfg.n_layers + extra)
        if share:
            assert target_cache is not None
            for i in plan.layers[: self._shared]:
                k[i], v[i] = target_cache.k_layer(i), target_cache.v_layer(i)
        if own_layers:
            own = self._own
            if own is None or (len(own.k_layers()), own.batch_size, own.max_len) != (len(own_layers), rows, max_len):
                own = self._own = KVCache(len(own_layers), rows, cfg.n_kv_heads, max_len, cfg.head_dim,
                                          target.kv_dtype, target.device)  # stored as the target's own
            for j, i in enumerate(own_layers):
                k[i], v[i] = own.k_layer(j), own.v_layer(j)
        else:
            self._own = None
        self._view = KVCache.over_layers(k, v)
        self._viewed = target_cache if share else None
        self._seen = target_cache
        self._n_cached = [0] * len(self._n_cached)  # a new cache: nothing of ours is in it
        return self._view

    def extra_cache_layers(self) -> int:
        """Cache layers the draft keeps after the target's own (an exit adapter's layer): none here."""
        return 0

    def reset_row(self, row: int) -> None:
        if row < len(self._n_cached):
            self._n_cached[row] = self._base[row] = self._drafted[row] = 0

    def move_row(self, src: int, dst: int) -> None:
        """Row ``src`` becomes row ``dst``: the shared layers moved with the target's cache; ours move here."""
        if self._own is not None and self._n_cached[src] > 0:
            self._own.lengths[src] = self._n_cached[src]
            self._own.move_row(src, dst)
        for xs in (self._n_cached, self._base, self._drafted):
            xs[dst] = xs[src]
        self.reset_row(src)

    # -- drafting ---------------------------------------------------------------------------------
    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        """Draft up to ``ctx.max_tokens`` tokens for each row in ``contexts`` (row -> context)."""
        drafts = {r: Draft() for r in contexts}
        if not contexts:
            return drafts
        view = self._setup(next(iter(contexts.values())).target_cache)
        want: dict[int, int] = {}
        for r, ctx in contexts.items():
            g = min(ctx.max_tokens, view.max_len - len(ctx.tokens))
            if self.gamma != "auto":
                g = min(g, self.gamma)
            self._base[r], self._drafted[r] = len(ctx.tokens), 0
            if g > 0:
                want[r] = g
        if not want:
            return drafts
        own = self._own is not None  # layers of ours to catch up with the verified tokens
        target_cache = self._viewed
        feeds: dict[int, list[int]] = {}
        saved: list[tuple[int, slice, list[torch.Tensor]]] = []  # (row, slots, the target's K/V there)
        with torch.inference_mode():
            for r in want:
                n = len(contexts[r].tokens)
                if target_cache is not None and target_cache.lengths[r] != n - 1:
                    raise RuntimeError(f"row {r}: the target's cache holds {target_cache.lengths[r]} tokens, "
                                       f"expected {n - 1} (every token but the pending one)")
                start = min(self._n_cached[r], n - 1) if own else n - 1
                if target_cache is not None and start < n - 1 and self._shared:
                    # verified tokens re-fed through the shared layers: keep the target's entries there
                    slots = slice(start, n - 1)
                    saved.append((r, slots, [c[r, :, slots].clone() for c in self._shared_layers(target_cache)]))
                view.lengths[r] = start
                feeds[r] = contexts[r].tokens[start:]
            try:
                tokens, probs = self._draft(view, want, feeds, contexts)
            finally:
                for r, slots, entries in saved:
                    assert target_cache is not None
                    for c, e in zip(self._shared_layers(target_cache), entries):
                        c[r, :, slots] = e
        for r, g in want.items():
            self._drafted[r] = g
            drafts[r] = Draft(tokens[r], torch.stack(probs[r]) if probs[r] else None)
        return drafts

    def _shared_layers(self, cache: KVCache) -> list[torch.Tensor]:
        """The target's K and V tensors of the shared layers."""
        return [c for i in range(self._shared) for c in (cache.k_layer(i), cache.v_layer(i))]

    def _draft(self, view: KVCache, want: dict[int, int], feeds: dict[int, list[int]],
               contexts: Mapping[int, DraftContext]) -> tuple[dict[int, list[int]], dict[int, list[torch.Tensor]]]:
        """γ forwards for every drafting row: the unseen tokens, then one draft token at a time."""
        return draft_rows(want, contexts, self._forward(view, feeds), lambda nxt: self._forward(view, nxt), self._pick)

    @staticmethod
    def _pick(logits: torch.Tensor, ctx: DraftContext, probs: list[torch.Tensor], index: int) -> int:
        """Draft token ``index`` from a row's last logits (greedy, or drawn from the filtered law)."""
        if ctx.sampling.greedy:
            return argmax_list(logits)[0]
        q = probs_from_logits(logits.unsqueeze(0), ctx.sampling)
        probs.append(q[0])
        return draw_token(q, ctx, index)

    def _forward(self, view: KVCache, feeds: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append each row's tokens to the view (rows between them get padding, dropped after) and
        return each fed row's last logits. Padding lands past a row's length: scratch slots."""
        assert self._target is not None
        device = self._target.device
        if len(feeds) == 1:
            (r, f), = feeds.items()
            ids = torch.tensor([f], dtype=torch.long, device=device)
            return {r: self._full(self._partial_logits(ids, view, slice(r, r + 1), True)[0, -1])}
        lo, hi = min(feeds), max(feeds) + 1
        width = max(len(f) for f in feeds.values())
        for r in range(lo, hi):
            if r not in feeds:  # a row not drafting: write padding past what anyone reads
                view.lengths[r] = self._viewed.lengths[r] if self._viewed is not None else self._n_cached[r]
        if max(view.lengths[lo:hi]) + width > view.max_len:
            out: dict[int, torch.Tensor] = {}  # padding would overflow a nearly full row: one row at a time
            for r, f in feeds.items():
                out.update(self._forward(view, {r: f}))
            return out
        real = [view.lengths[r] + len(feeds.get(r, ())) for r in range(lo, hi)]
        ids = torch.tensor([feeds.get(r, []) + [0] * (width - len(feeds.get(r, ()))) for r in range(lo, hi)],
                           dtype=torch.long, device=device)
        logits = self._partial_logits(ids, view, slice(lo, hi), False)
        for r, n in zip(range(lo, hi), real):
            view.lengths[r] = n
        return {r: self._full(logits[r - lo, len(f) - 1]) for r, f in feeds.items()}

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """A row's logits over the whole vocabulary (-inf outside a cut: the draft's law is zero there)."""
        return logits if self.cut is None else self.cut.expand(logits)

    @property
    def cut_head(self) -> Optional[torch.Tensor]:
        return self.cut.head if self.cut is not None else None

    def _partial_logits(self, ids: torch.Tensor, view: KVCache, rows: slice, last_only: bool) -> torch.Tensor:
        """Logits of the draft's layers over ``ids`` appended to ``view`` (an exit adapter overrides this)."""
        assert self._target is not None and self.plan is not None
        return self._target.forward(ids, view, rows=rows, last_only=last_only, head=self.cut_head,
                                    layers=self.plan.layers)

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Our own layers keep the sequence plus the accepted draft tokens they hold (at most g - 1)."""
        g = self._drafted[row]
        if g:
            self._n_cached[row] = self._base[row] + min(n_accepted, g - 1)
            self._drafted[row] = 0


def parse_layer_list(text: str) -> tuple[int, ...]:
    """'1,5' -> (1, 5): the layers a skip set leaves out."""
    import argparse

    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer numbers like 1,5, got {text!r}") from None


CALIBRATION = Artifact("layerskip", "a layer-skip calibration directory (holding layerskip.json)",
                       "a layer-skip calibration", "specdecode calibrate --target TARGET",
                       lambda p: (p / CALIBRATION_FILE).is_file(), "--layerskip-calibration", required=False)


def _build(o: DrafterOptions) -> LayerSkipDrafter:
    exit_layer, skip = o.options["exit_layer"], o.options["skip_layers"]
    return LayerSkipDrafter(exit_layer=exit_layer if isinstance(exit_layer, int) else None,
                            skip_layers=tuple(skip) if isinstance(skip, tuple) else None, gamma=o.gamma,
                            calibration_dir=o.artifact(CALIBRATION.name), draft_vocab=o.vocab)


def _usable(d: BatchDrafter, o: DrafterOptions) -> bool:
    """In auto: layer skip only with an explicit layer choice or a calibration for this target that
    found a paying set (one that did not would cost a first request its cost measurement for nothing)."""
    explicit = o.options.get("exit_layer") is not None or o.options.get("skip_layers") is not None
    calibration = getattr(d, "calibration", None)
    return explicit or (calibration is not None and calibration.get("speculation_pays", True) is not False)


SPECS = (DrafterSpec(
    "layerskip", "self-speculation: the target's own first layers (or all but a skip set) draft; "
    "`specdecode calibrate` picks them", _build,
    options=(Option("exit_layer", int, None, "layerskip: draft with the target's first N layers (overrides "
                    "`specdecode calibrate`'s choice)", metavar="N"),
             Option("skip_layers", parse_layer_list, None, "layerskip: draft with every layer but these, e.g. 1,5 "
                    "(overrides the calibration)", metavar="LAYERS")),
    artifacts=(CALIBRATION,), auto=AutoMember(3, usable=_usable),
    bench=(BenchVariant("layerskip", "layer-skip self-speculation (the target's calibrated layers, `specdecode "
                        "calibrate`), γ from --gammas", sweep="gammas"),)),)


__all__ = ["CALIBRATION", "CALIBRATION_FILE", "CALIBRATION_VERSION", "SPECS", "SUPPORTED_FAMILIES", "DraftLayers",
           "LayerSkipDrafter",
           "cached_calibration_path", "calibration_paths", "check_family", "load_calibration", "parse_layer_list",
           "save_calibration", "weights_stamp"]
