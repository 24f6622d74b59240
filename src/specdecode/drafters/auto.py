"""``--drafter auto``: one ``BatchDrafter`` that picks, per row and step, among the drafters available.

No single drafter wins every workload: a draft model on open-ended code, prompt lookup and suffix
drafting where text repeats, heads where they were trained. ``AutoDrafter`` holds the members
(whatever this run can build: a draft model with ``--draft``, Medusa/EAGLE with ``--heads``,
layer skip when calibrated, prompt lookup, suffix) and chooses per row and step by the cost model,
in tokens per second over plain decoding:

* cheap members (suffix, prompt lookup: deterministic drafts costing under ``CHEAP`` of a target
  pass) propose before the others; a draft is worth E / (c + v(length)), E its drafter's own
  prediction (``Draft.expected``: suffix's calibrated tree value) or E(α, length) from the member's
  running acceptance. Choosing among deterministic drafts by their content keeps verification
  exact (nothing sampled is selected by what it drew). A cheap member proposes on every row at
  every step: a lookup costs a few hundredths of a pass, and a repeat missed costs whole passes (a
  cheap member never sits a row out: suffix's matches come in runs that start without warning, and a
  sit-out misses their start); a chain
  without a prediction of its own (prompt lookup) is cut to its best-paying prefix first;
* a member with offline costs (``costs_for``: the draft model, layer skip) is worth
  max_γ E(α, γ) / (γ c + v(γ)), with α its running acceptance (``Acceptance``, remembered across
  requests) and γ that argmax;
* another self-sizing member (Medusa/EAGLE trees, measured dearer than ``CHEAP``) is worth its
  realised rate: the running mean of (accepted + 1) / (c + v(width)) over the steps it drafted. It
  is tried on the first step; while it loses it is probed again after ``PROBE_FIRST`` steps, then
  twice as long after every losing probe, up to ``PROBE_MAX`` (so exploring a weak member costs a
  few steps per thousand), and a probe weighs ``PROBE_WEIGHT`` in its rate so one that turned
  good is adopted at once.

The costly members are then called best first, each once per step for all the rows whose best so
far it beats (so a draft model still batches); a deterministic draft whose own prediction is below
the next member's rate leaves its row to that member (and is used if nothing better comes). A row
with nothing above the policy's margin over plain decoding decodes plainly.

Each draft carries its member's name (``Draft.source``); the decode core counts its drafted and accepted
tokens under that member in the request's stats (``GenerationStats.drafted_by``/``accepted_by``) and
records auto as the request's ``chooser``, never as a source beside its members.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..config import ConfigError
from ..sizing.book import target_spec
from ..sizing.costs import MAX_GAMMA, Costs, cost_clock, expected_tokens
from ..sizing.estimate import ProbeSchedule
from ..sizing.pricer import DEFAULT_PRICER, Pricer
from ..draft import Draft, DraftContext
from .base import Acceptance, BatchDrafter, Gamma, RowZeroAdapter
from ..sizing.live import Stored, live_v
from .auto_members import PROBE_WEIGHT, Member
from .plugin import BenchVariant, DrafterOptions, DrafterSpec

if TYPE_CHECKING:
    from ..models import Model

ROW_PROBES = (8, 2, 32)  # a row where nothing pays drafts one token after 8 plain steps, then 16, then every 32
log = logging.getLogger(__name__)


class AutoDrafter(RowZeroAdapter):
    """Chooses among ``members`` (name -> drafter, in order of preference on ties) per row and step."""

    sizes_itself = True  # each member sizes its draft (see BatchDrafter)

    def __init__(self, members: Mapping[str, BatchDrafter],
                 usable: Mapping[str, Callable[[BatchDrafter], bool]] | None = None,
                 fits: Mapping[str, Callable[[Model], bool]] | None = None) -> None:
        """``usable``: per member name, a check run after ``prepare_rows`` (e.g. layer skip only when
        calibrated for this target); ``fits``: one run before it (e.g. the int4 copy only of a wider
        target). A member failing either is dropped."""
        if not members:
            raise ConfigError("--drafter auto needs at least one drafter to choose from")
        self.members = [Member(n, d) for n, d in members.items()]
        self._pricer = DEFAULT_PRICER
        self._usable = dict(usable or {})
        self._fits = dict(fits or {})
        caps = [d.gamma for d in members.values() if isinstance(d.gamma, int)]
        self.gamma: Gamma = max(caps + [MAX_GAMMA])  # a cap: the members size their drafts
        self.acceptance = Acceptance()  # the core's evidence for the composite (reported, not planned with)
        self.wants_hidden = any(d.wants_hidden for d in members.values())
        self.hidden_layers: tuple[int, ...] = ()  # the layers EAGLE members read (set by prepare_rows)
        self._pending: dict[int, tuple[Member, int]] = {}  # row -> (member that drafted, draft width)
        # per row, when a row where no draft pays drafts one token anyway: the pass it verifies in is then timed,
        # so a cost cache that overstates wide passes (timed under load) is corrected by the live passes
        self._row_probes: defaultdict[int, ProbeSchedule] = defaultdict(lambda: ProbeSchedule(*ROW_PROBES))
        self._base: Costs | None = None
        self._stored = Stored(None)  # what the target's cost cache file holds
        self._clock: Callable[[], float] = time.perf_counter
        self._t1 = 0.0
        self._target: Model | None = None

    @property
    def pricer(self) -> Pricer:
        """The core's rule for whether a draft pays: auto weighs its members by it, and hands it to them."""
        return self._pricer

    @pricer.setter
    def pricer(self, pricer: Pricer) -> None:
        self._pricer = pricer
        for m in self.members:
            m.drafter.pricer = pricer

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def contributions(self) -> dict[str, int]:
        """Accepted draft tokens per member since this drafter was built."""
        return {m.name: m.accepted for m in self.members}

    # -- setup -------------------------------------------------------------------------------------
    def prepare_rows(self, target: Model, rows: int, max_len: int) -> None:
        """Prepare every member; one that cannot run with this target (no calibration, wrong heads)
        is dropped with a log line, as long as one remains."""
        kept = []
        for m in self.members:
            fit = self._fits.get(m.name)
            if fit is not None and not fit(target):
                log.info("auto: %s left out (it cannot pay on this target)", m.name)
                continue
            try:
                m.drafter.prepare_rows(target, rows, max_len)
                check = self._usable.get(m.name)
                if check is not None and not check(m.drafter):
                    raise ConfigError("no setting or calibration for this target says it pays")
                m.costs = m.drafter.costs_for(target)
            except ConfigError as e:
                log.info("auto: %s left out (%s)", m.name, e)
                continue
            kept.append(m)
        if not kept:
            raise ConfigError("--drafter auto: none of its drafters can run with this target; "
                              f"tried {', '.join(self.names)}")
        self.members = kept
        self.wants_hidden = any(m.drafter.wants_hidden for m in kept)
        # the core captures these layers for a hidden-state drafter that names them (EAGLE-3 features)
        self.hidden_layers = tuple(sorted({int(i) for m in kept if m.drafter.wants_hidden
                                           for i in m.drafter.hidden_layers}))
        if target is not self._target:
            self._target = target
            self._base = self._pricer.costs(target, target_spec(target))
            self._stored = Stored(self._base)
            self._clock = cost_clock(target)
            self._t1 = self._base.target_s[0] if self._base.target_s else 0.0

    def costs_for(self, target: Model) -> Costs | None:
        """None: auto sizes its members' drafts itself; the core's γ policy only caps them."""
        return None

    def refine_costs(self, passes: Mapping[int, float]) -> list[Costs]:
        """The target's v(n) (what auto weighs its members with) and each member's own figures following the
        live passes (``sizing/live.py``); returns the figures to write back to the cost cache (past ``DISAGREE``×)."""
        out: list[Costs] = []
        new = live_v(self._base, passes) if self._base is not None else None
        if new is not None:
            self._base, self._t1 = new, new.target_s[0]
            out += self._stored.changed(new)
        for m in self.members:
            out += m.drafter.refine_costs(passes)
            if m.costs is not None:  # a chain member's v(n), as the γ policy follows a chain drafter's
                m.costs = live_v(m.costs, passes) or m.costs
        return out

    def reset_row(self, row: int) -> None:
        self._pending.pop(row, None)
        self._row_probes.pop(row, None)
        for m in self.members:
            m.drop_row(row)
            m.drafter.reset_row(row)

    def move_row(self, src: int, dst: int) -> None:
        self._pending.pop(dst, None)
        if src in self._pending:
            self._pending[dst] = self._pending.pop(src)
        self._row_probes.pop(dst, None)
        if src in self._row_probes:
            self._row_probes[dst] = self._row_probes.pop(src)
        for m in self.members:
            m.move_row(src, dst)
            m.drafter.move_row(src, dst)

    def forget(self) -> None:
        """Drop what members remember across requests (a benchmark's next repetition)."""
        for m in self.members:
            forget = getattr(m.drafter, "forget", None)
            if callable(forget):
                forget()

    # -- evidence ------------------------------------------------------------------------------------
    def on_verified_row(self, row: int, n_accepted: int) -> None:
        got = self._pending.pop(row, None)
        if got is None:
            return
        m, width = got
        m.drafter.on_verified_row(row, n_accepted)
        m.drafter.acceptance.update(width, n_accepted)
        m.row_evidence(row).update(width, n_accepted)
        m.accepted += n_accepted
        if m.costs is None and self._base is not None:
            self._observe(m, row, (n_accepted + 1) / (m.c + self._base.v_at(width)))

    @staticmethod
    def _observe(m: Member, row: int, sample: float) -> None:
        """One step's realised speedup into a self-sizing member's running rate, across requests (the order
        members are asked in, probes) and in this row's request (whether its rows are asked)."""
        m.steps += 1
        share = PROBE_WEIGHT if m.probing else 0.0
        m.rates.add(sample, share=share)
        m.row_rates[row].add(sample, share=share)

    # -- drafting ------------------------------------------------------------------------------------
    def _call(self, m: Member, contexts: Mapping[int, DraftContext], g: int) -> dict[int, Draft]:
        """``m``'s drafts of at most ``g`` tokens for these rows, its cost measured per row."""
        asked = {r: dataclasses.replace(c, max_tokens=min(g, c.max_tokens)) for r, c in contexts.items()}
        depth = max(c.max_tokens for c in asked.values())
        if m.drafter.acceptance.mark(depth):
            for c in asked.values():
                c.probe = True
        t0 = self._clock()
        try:
            got = m.drafter.propose_rows(asked)
        except ConfigError as e:  # it cannot run here after all (found only when drafting): drop it
            log.warning("auto: dropping %s (%s)", m.name, e)
            self.members.remove(m)
            return {}
        if self._t1 > 0:
            m.timings.add((self._clock() - t0) / (self._t1 * len(asked)))
            m.c = m.timings.estimate
        for r, d in got.items():
            if len(d.tokens) > asked[r].max_tokens:
                raise RuntimeError(f"drafter {m.name!r} proposed {len(d.tokens)} tokens but at most "
                                   f"{asked[r].max_tokens} were allowed")
        return {r: d for r, d in got.items() if d.tokens}

    def _value(self, m: Member, d: Draft, row: int) -> float:
        """Predicted speedup of one deterministic draft: its own E when it gives one, else E(α, depth)
        (a tree's longest path; α is path-shaped, the core's evidence for trees), over c + v(nodes)."""
        assert self._base is not None
        n = len(d.tokens)
        e = d.expected
        if e is None:
            depth = n
            if d.parents is not None:
                level: list[int] = []
                for p in d.parents:
                    level.append(1 if p < 0 else level[p] + 1)
                depth = max(level)
            e = expected_tokens(m.row_evidence(row).alpha, depth)
        return e / (m.c + self._base.v_at(n))

    def _best_prefix(self, m: Member, d: Draft, row: int) -> Draft:
        """A chain with no prediction of its own (prompt lookup's fixed-length copies) cut to the prefix
        worth most by E(α, k) / (c + v(k)): on a CPU where v(10) is 3.7 passes (AVX2 int4) a 10-token copy is
        worth 0.64 of plain decoding at α 0.75 and was never chosen, not even where it would have been
        accepted whole for 100 steps running, while its best prefix is worth 1.9."""
        if d.expected is not None or d.parents is not None or d.probs is not None or len(d.tokens) < 2:
            return d
        base = self._base
        assert base is not None
        alpha = m.row_evidence(row).alpha
        k = max(range(1, len(d.tokens) + 1), key=lambda n: expected_tokens(alpha, n) / (m.c + base.v_at(n)))
        return d if k == len(d.tokens) else dataclasses.replace(d, tokens=d.tokens[:k])

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        """Two phases. Cheap self-sizing members (suffix, lookup: measured cost under ``CHEAP`` of a
        pass, deterministic drafts) propose for every row, and each row keeps its best draft by
        ``_value``. Then the other members, best predicted first
        (a member due for a probe first of all), draft (batched) for the rows whose best so far
        they beat. A row with nothing above the margin decodes plainly."""
        if self._base is None:
            raise RuntimeError("AutoDrafter.prepare_rows(target, ...) must be called before proposing")
        for m in self.members:
            m.drafter.acceptance.fade()
            m.probes.plain()
            m.probing = False
        for r in contexts:
            self._pending.pop(r, None)
        out = {r: Draft() for r in contexts}
        if not contexts:
            return out
        best: dict[int, tuple[float, Member | None]] = {r: (self._pricer.margin, None) for r in contexts}
        cap = max(c.max_tokens for c in contexts.values())
        cheap = [m for m in self.members if m.cheap]  # decided once: a member is in one phase per step
        fallback: dict[int, tuple[Member, Draft]] = {}  # a cheap member's draft, for a row's probe
        for m in cheap:
            g = m.drafter.gamma
            got = self._call(m, contexts, min(cap, g if isinstance(g, int) else cap))
            if any(d.probs is not None for d in got.values()):
                # a sampled draft may not be chosen by its content: the member is judged like a model from now on
                m.sampled = True
                continue
            for r, d in got.items():
                fallback.setdefault(r, (m, d))
                d = self._best_prefix(m, d, r)
                v = self._value(m, d, r)
                if v > best[r][0]:
                    best[r], out[r] = (v, m), d
        ranked = sorted(((m.worth(cap), i, m) for i, m in enumerate(self.members) if m not in cheap),
                        key=lambda x: (not x[2].probe_due, -x[0][0], x[1]))
        spare: dict[int, tuple[float, Member, Draft]] = {}  # weak deterministic drafts, kept in case none follows
        for k, (_, _, m) in enumerate(ranked):
            probe = m.probe_due
            worth = {r: m.worth(min(cap, c.max_tokens), r) for r, c in contexts.items()}
            rows = {r: dataclasses.replace(c, max_tokens=worth[r][1]) for r, c in contexts.items()
                    if worth[r][1] > 0 and (worth[r][0] > best[r][0] or (probe and best[r][1] is None))}
            if not rows:
                continue
            longest = max(c.max_tokens for c in rows.values())
            if probe:  # a losing member's probe (asked, whether it then drafts or declines): the next waits longer
                m.probing = True
                m.probes.grow()
            elif m.costs is None:
                m.probes.restart()  # chosen on its own merit
            after = max((x[0][0] for x in ranked[k + 1:] if x[0][1] > 0), default=0.0)
            got = self._call(m, rows, longest)
            if m.costs is None:
                # asked and declined (its own planner found nothing worth drafting): the step cost its c for
                # nothing, so its rate says so. Counting only the steps it drafted ranked EAGLE on SmolLM2's
                # AVX2 int4 path at 1.2 while it declined most calls, and auto fell 3-4% behind suffix alone
                for r in set(rows) - set(got):
                    self._observe(m, r, 1.0 / (m.c + 1.0))
            for r, d in got.items():
                if not probe and d.probs is None and d.expected is not None and self._value(m, d, r) < after:
                    v = self._value(m, d, r)  # its own prediction says a later member does better: let it try
                    if v > self._pricer.margin and v > spare.get(r, (0.0,))[0]:
                        spare[r] = (v, m, d)
                    continue
                # a probe's draft stands (its evidence is the point); another's must be beaten by later members
                best[r], out[r] = (float("inf") if probe else max(worth[r][0], best[r][0]), m), d
        for r, (v, m, d) in spare.items():
            if best[r][1] is None:
                best[r], out[r] = (v, m), d
        self._probe_rows(contexts, best, out, fallback)
        for r, (_, winner) in best.items():
            if winner is not None:
                out[r].source = winner.name
                winner.probes.drafted()
                self._pending[r] = (winner, len(out[r].tokens))
        return out

    def _probe_rows(self, contexts: Mapping[int, DraftContext], best: dict[int, tuple[float, Member | None]],
                    out: dict[int, Draft], fallback: Mapping[int, tuple[Member, Draft]]) -> None:
        """Rows where no draft pays draft one token on their probe schedule: a cheap member's first token when
        one proposed, else the best-ranked member with costs of its own asked for one. Nothing else times a
        pass wider than one token while nothing pays, so a cache that overstates them would hold for good."""
        for r in contexts:
            sched = self._row_probes[r]
            if best[r][1] is not None:
                sched.drafted()
                continue
            sched.plain()
            if not sched.due():
                continue
            sched.drafted(probe=True)
            got = fallback.get(r)
            if got is None:
                chain = next((m for m in self.members if m.costs is not None), None)
                d = self._call(chain, {r: contexts[r]}, 1).get(r) if chain is not None else None
                got = (chain, d) if chain is not None and d is not None else None
            if got is not None:
                m, d = got
                best[r], out[r] = (0.0, m), dataclasses.replace(d, tokens=d.tokens[:1], parents=None,
                                                                  probs=None if d.probs is None else d.probs[:1])


def _build(o: DrafterOptions) -> AutoDrafter:
    """Every registered member this run can build (a draft model only with one, heads only with them),
    preferred by their declared rank on ties; each member sizes its own drafts."""
    from .registry import REGISTRY, build_drafter  # lazy: auto composes the registry's own drafters

    members: dict[str, BatchDrafter] = {}
    usable: dict[str, Callable[[BatchDrafter], bool]] = {}
    fits: dict[str, Callable[[Model], bool]] = {}
    with_draft_model = False
    for spec in sorted((s for s in REGISTRY.values() if s.auto is not None), key=lambda s: s.auto.rank):  # type: ignore[union-attr]
        role = spec.auto
        assert role is not None
        if role.only_without_draft_model and with_draft_model:
            continue
        try:  # each member sizes its own drafts; the request's gamma still caps them
            d = build_drafter(spec.name, dataclasses.replace(o, gamma="auto"))
        except (ConfigError, OSError, ValueError, KeyError):  # it lacks what it needs
            continue
        if d is None:
            continue
        members[spec.name] = d
        with_draft_model = with_draft_model or spec.needs_draft_model
        check = role.usable
        if check is not None:
            usable[spec.name] = lambda member, check=check: check(member, o)  # type: ignore[misc]
        if role.fits is not None:
            fits[spec.name] = role.fits
    return AutoDrafter(members, usable=usable, fits=fits)


SPECS = (DrafterSpec(
    "auto", "choose per request and step among the drafters available (draft model, heads, calibrated layer skip, "
    "the target's int4 copy when there is no draft model, suffix, prompt lookup) by the cost model; plain when "
    "none pays", _build, uses_draft_model=True,
    bench=(BenchVariant("auto", "--drafter auto: per step, the member the cost model ranks first (draft model with "
                        "--draft, heads with --heads, calibrated layer skip, suffix, lookup); plain when none pays",
                        history=True),)),)
