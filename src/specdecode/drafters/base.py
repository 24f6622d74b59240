"""The drafter protocol: every way of proposing tokens implements it, for one row or a batch.

Two shapes of the same idea:

* ``Drafter`` — one sequence at a time (``prepare``/``propose``/``on_verified``/``reset``). The
  simplest thing to write; a user's own drafter usually is one.
* ``BatchDrafter`` — every row of a batch in one call (``propose_rows``), with per-row state
  that the decode core moves and resets as requests come and go. What the core runs.

``as_batch_drafter`` turns a ``Drafter`` into a ``BatchDrafter`` (one instance per row), so a
drafter is written once and works in ``generate``, the server and the bench alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Optional, Protocol, Union, runtime_checkable

import torch

from ..config import ConfigError
from ..draft import Draft, DraftContext
from ..sizing.estimate import Estimate, judged
from ..sizing.gamma import Gamma
from ..sizing.pricer import DEFAULT_PRICER, Pricer

if TYPE_CHECKING:
    from ..sizing.costs import Costs
    from ..models import Model

class VocabularyMismatchError(ValueError):
    """Draft and target do not share a vocabulary, so draft tokens mean nothing to the target."""


def check_gamma(gamma: object, what: str = "gamma (draft length)") -> Gamma:
    """``gamma`` if it is a positive int or "auto", else a ConfigError naming the fix."""
    if gamma != "auto" and (not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1):
        raise ConfigError(f"{what} must be a positive integer or 'auto', got {gamma!r}")
    return gamma


class Acceptance:
    """A drafter's running acceptance evidence: the α the γ policy plans with.

    α is estimated as accepted / evaluated, where evaluated counts the accepted tokens plus
    the one rejected token per step (later draft tokens were never judged): the
    maximum-likelihood estimate for i.i.d. acceptance, over about the last ``memory`` judged
    tokens, so a change of workload shows within a few steps. A weak prior keeps the first
    steps sane. The evidence describes the drafter, not a sequence, so it lives with the
    drafter and carries over from one request to the next; ``fade`` (once per target pass)
    lets it lose weight with a half-life of ``half_life`` passes, which is what brings a
    switched-off drafter back for a probe now and then.
    """

    def __init__(self, prior_alpha: float = 0.7, prior_weight: float = 2.0, memory: float = 100.0,
                 half_life: float = 4096.0) -> None:
        if memory <= 0 or half_life <= 0:
            raise ValueError("memory and half_life must be positive")
        self.estimate = Estimate(prior_alpha, prior_weight, memory)  # a kept prior: a floor of sanity
        self._fade = 0.5 ** (1.0 / half_life)
        self._last = 1  # the previous step's draft length (a drafter's first step counts as drafting)

    def mark(self, length: int) -> bool:
        """Record this step's draft length; True when it drafts right after plain steps (a probe)."""
        resuming = length > 0 and self._last == 0
        self._last = length
        return resuming

    @property
    def alpha(self) -> float:
        return self.estimate.mean

    @property
    def accepted(self) -> float:
        return self.estimate.hits

    @property
    def evaluated(self) -> float:
        return self.estimate.trials

    @property
    def memory(self) -> float:
        return self.estimate.memory

    def fade(self) -> None:
        self.estimate.fade(self._fade)

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted:
            self.estimate.add(n_accepted, judged(n_drafted, n_accepted))


@runtime_checkable
class Drafter(Protocol):
    """One row: ``prepare`` once per target (checks + allocation), then ``propose``/``on_verified`` per step."""

    def prepare(self, target: "Model") -> None: ...

    def propose(self, ctx: DraftContext) -> Draft: ...

    def on_verified(self, n_accepted: int) -> None: ...

    def reset(self) -> None: ...


@runtime_checkable
class BatchDrafter(Protocol):
    """Every row of a batch at once; what the decode core runs, and all that it calls.

    ``gamma`` is the drafter's own γ: its cap, or "auto" for ``DEFAULT_CAP``; what a request without a
    γ of its own gets (``gamma.resolve_gamma``).
    ``acceptance`` is the drafter's evidence for that policy. ``wants_hidden`` asks the core
    for the target's hidden states (``DraftContext.hidden``), ``hidden_layers`` for the residuals after
    those layers too (EAGLE-3: ``DraftContext.layers``). ``on_verified_row`` gets how many
    draft tokens the target accepted (for a tree: the accepted path's length). ``reset_row`` and
    ``move_row`` follow the core's rows as requests come and go. A drafter that plans its own draft
    sizes from its own cost model (trees) sets ``sizes_itself``: under the server's ``--speculation
    auto`` the γ policy then only switches its rows between drafting up to the cap and plain steps
    (load), and never shortens the draft. ``refine_costs(passes)`` gets the live single-row pass
    seconds by width after each finished request; the core writes back to the cost cache what it
    returns (``sizing/live.py``). ``pricer`` is the γ policy's rule for whether a draft pays, which the
    core hands over before ``prepare_rows``; a drafter that sizes its own drafts asks it rather than
    pricing itself. ``BatchDrafterBase`` holds the defaults of everything past
    ``prepare_rows``/``propose_rows``, so a drafter states only what it does differently."""

    gamma: Gamma
    acceptance: Acceptance
    wants_hidden: bool
    hidden_layers: tuple[int, ...]
    sizes_itself: bool
    pricer: Pricer

    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None: ...

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]: ...

    def on_verified_row(self, row: int, n_accepted: int) -> None: ...

    def reset_row(self, row: int) -> None: ...

    def move_row(self, src: int, dst: int) -> None: ...

    def costs_for(self, target: "Model") -> Optional["Costs"]: ...

    def refine_costs(self, passes: Mapping[int, float]) -> list["Costs"]: ...


class BatchDrafterBase:
    """``BatchDrafter``'s defaults, declared once: a drafter that reads no hidden states, keeps no
    per-row state (so moving or resetting a row is nothing to it, and the core's job alone), rolls
    nothing back after a verdict, leaves sizing to the γ policy and has no costs of its own."""

    gamma: Gamma
    acceptance: Acceptance
    wants_hidden: bool = False
    hidden_layers: tuple[int, ...] = ()
    sizes_itself: bool = False
    pricer: Pricer = DEFAULT_PRICER  # until a core hands its policy's (sizing/pricer.py)

    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        raise NotImplementedError

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        raise NotImplementedError

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Nothing to roll back: the next proposal reads the sequence itself."""

    def reset_row(self, row: int) -> None:
        """No per-row state to clear."""

    def move_row(self, src: int, dst: int) -> None:
        """No per-row state to move."""

    def costs_for(self, target: "Model") -> Optional["Costs"]:
        """None: no offline costs, so the γ policy prices this drafter from its defaults."""
        return None

    def refine_costs(self, passes: Mapping[int, float]) -> list["Costs"]:
        """Nothing to refine: no cost figures of its own."""
        return []


BATCH_MEMBERS = ("gamma", "acceptance", "wants_hidden", "hidden_layers", "sizes_itself", "pricer", "prepare_rows",
                 "propose_rows", "on_verified_row", "reset_row", "move_row", "costs_for", "refine_costs")


class RowZeroAdapter(BatchDrafterBase):
    """The single-row ``Drafter`` protocol for a ``BatchDrafter``: every call goes to row 0.

    Mixed into the batching drafters so ``prepare``/``propose``/``on_verified``/``reset`` keep
    one meaning everywhere instead of four copies drifting apart."""

    def prepare(self, target: "Model") -> None:
        self.prepare_rows(target, 1, target.max_seq_len)
        self.reset_row(0)

    def propose(self, ctx: DraftContext) -> Draft:
        return self.propose_rows({0: ctx})[0]

    def on_verified(self, n_accepted: int) -> None:
        self.on_verified_row(0, n_accepted)

    def reset(self) -> None:
        self.reset_row(0)


class PerRowDrafters(BatchDrafterBase):
    """A ``BatchDrafter`` made of one single-row ``Drafter`` per row (from ``factory``).

    For drafters with nothing to share between rows (prompt lookup) or that cannot batch (a
    user's own). ``propose_rows`` calls each row's drafter in turn."""

    def __init__(self, factory: Callable[[], Drafter], gamma: Gamma, max_rows: Optional[int] = None) -> None:
        self.factory = factory
        self.gamma = gamma
        self.max_rows = max_rows
        self.acceptance = Acceptance()
        self._rows: list[Optional[Drafter]] = []
        self._target: Optional["Model"] = None

    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        if self.max_rows is not None and rows > self.max_rows:
            raise ConfigError(f"this drafter serves at most {self.max_rows} row(s) at a time, not {rows}; "
                              "register a factory (drafters.registry) to give every row its own")
        self._target = target
        if len(self._rows) < rows:
            self._rows.extend([None] * (rows - len(self._rows)))

    def row(self, row: int) -> Drafter:
        d = self._rows[row]
        if d is None:
            if self._target is None:
                raise RuntimeError("prepare_rows(target, ...) must be called before proposing")
            d = self._rows[row] = self.factory()
            d.prepare(self._target)
        return d

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        return {r: self.row(r).propose(ctx) for r, ctx in contexts.items()}

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        self.row(row).on_verified(n_accepted)

    def reset_row(self, row: int) -> None:
        d = self._rows[row]
        if d is not None:
            d.reset()

    def move_row(self, src: int, dst: int) -> None:
        self._rows[dst], self._rows[src] = self._rows[src], self._rows[dst]
        self.reset_row(src)


PickFn = Callable[[torch.Tensor, DraftContext, list[torch.Tensor], int], int]  # (logits, ctx, laws, index)


def draft_rows(want: Mapping[int, int], contexts: Mapping[int, DraftContext], logits: Mapping[int, torch.Tensor],
               forward: Callable[[dict[int, list[int]]], Mapping[int, torch.Tensor]], pick: PickFn
               ) -> tuple[dict[int, list[int]], dict[int, list[torch.Tensor]]]:
    """Autoregressive drafting for many rows at once: ``want[r]`` tokens for row r, starting from its
    last ``logits[r]``; each round picks one token per row that still drafts and feeds all of them
    back in one batched ``forward`` (row -> tokens, returning row -> last logits). ``pick`` gets the
    token's index in the draft (for ``draw_token``) and appends the law it drew from to the row's
    list when it samples. Returns tokens and laws per row."""
    tokens: dict[int, list[int]] = {r: [] for r in want}
    probs: dict[int, list[torch.Tensor]] = {r: [] for r in want}
    for i in range(max(want.values(), default=0)):
        nxt: dict[int, list[int]] = {}
        for r, g in want.items():
            if i < g:
                t = pick(logits[r], contexts[r], probs[r], i)
                tokens[r].append(t)
                if i < g - 1:
                    nxt[r] = [t]
        if nxt:
            logits = forward(nxt)
    return tokens, probs


def as_batch_drafter(drafter: Union[Drafter, BatchDrafter]) -> BatchDrafter:
    """The drafter itself when it batches, else one wrapping it for a single row (row 0).

    A single-row drafter given by a user is used as is (not copied), so its state (a cache,
    a counter) is what the user sees; it can only serve one row at a time."""
    if isinstance(drafter, BatchDrafter):
        return drafter
    if not isinstance(drafter, Drafter):
        missing = [m for m in BATCH_MEMBERS if not hasattr(drafter, m)]
        batched = (f" (missing here: {', '.join(missing)}; subclass specdecode.BatchDrafterBase for the defaults)"
                   if hasattr(drafter, "propose_rows") else "")
        raise ConfigError(f"{type(drafter).__name__} is not a drafter: it needs prepare/propose/on_verified/reset "
                          f"(specdecode.Drafter) or the batched protocol (specdecode.BatchDrafter){batched}")
    # its own ``gamma`` if it has one (prompt lookup's num_draft_tokens); else it decides, up to 64 tokens
    gamma = getattr(drafter, "gamma", None)
    fixed: Gamma = gamma if isinstance(gamma, int) and not isinstance(gamma, bool) and gamma > 0 else 64
    return PerRowDrafters(lambda: drafter, fixed, max_rows=1)
