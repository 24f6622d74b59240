"""Verification of a draft against the target: pure functions, no model, no state.

Rules (each exact: the emitted sequence follows the target's law; each has a chi-square test in
``tests/exactness``):

* ``greedy_verify`` / ``greedy_verify_tree``: temperature 0, the target's argmax.
* ``rejection_sample`` (chain, token by token): the modified rejection sampling of Leviathan et
  al. (arXiv:2211.17192) and Chen et al. (arXiv:2302.01318): accept draft token x with
  probability min(1, p(x)/q(x)); at the first rejection draw the recovered token from
  norm(max(0, p - q)); if every token is accepted draw a bonus token from the target's next law.
* ``block_verify`` (chain, the whole block at once): Sun et al., "Block Verification Accelerates
  Speculative Decoding" (arXiv:2403.10444), Algorithm 2. Never accepts fewer tokens than
  ``rejection_sample`` in expectation; the default sampled chain rule (``CHAIN_RULES``).
* ``rejection_sample_tree`` (tree, per node): multi-draft speculative sampling (SpecInfer,
  arXiv:2305.09781) in the recursive form of Jeon et al. (arXiv:2402.14160), with deterministic
  candidates (top-k heads) as one-hot draft laws.
* ``verify_draft``: the dispatch the core runs per row (chain or tree; greedy, coupled or sampled).
* ``coupled_verify`` / ``coupled_verify_tree``: drafter-invariant sampling by the Gumbel-max
  coupling (Daliri, Musco & Suresh, arXiv:2408.07978): the target's token at each position is its
  own seeded draw (``sampling.CoupledNoise``), and a draft token is kept exactly when it equals it;
  the greedy rules applied to those draws. The output is plain decoding's with the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from .sampling import CoupledNoise, coupled_draws, draw, probs_from_logits

if TYPE_CHECKING:
    from .config import SamplingConfig
    from .draft import Draft

# Below this total residual mass, p and q agree up to float32 rounding at the
# rejected position; a rejection there had probability ~0, so p itself is the
# only sensible law to draw from.
_RESIDUAL_EPS = 1e-12


@dataclass(frozen=True)
class VerifyResult:
    n_accepted: int  # draft tokens kept (the accepted prefix)
    next_token: int  # recovered token after a rejection, or the bonus token
    bonus: bool  # True when every draft token was accepted
    path: Optional[tuple[int, ...]] = None  # tree drafts: indices of the accepted nodes, root to leaf


def greedy_verify(target_argmax: Sequence[int], draft_tokens: Sequence[int]) -> VerifyResult:
    """Greedy rule: keep the longest prefix equal to the target's argmax, then take its argmax.

    ``target_argmax`` has one more entry than ``draft_tokens``: the target's
    choice after each prefix, the last one after the whole draft.
    """
    n = 0
    for d, t in zip(draft_tokens, target_argmax):
        if d != t:
            break
        n += 1
    return VerifyResult(n, int(target_argmax[n]), n == len(draft_tokens))


def greedy_verify_tree(target_argmax: Sequence[int], draft_tokens: Sequence[int],
                       parents: Sequence[int]) -> VerifyResult:
    """Greedy rule on a tree: from the root, follow the child equal to the target's argmax while
    there is one; the accepted path is exactly the tokens plain greedy decoding would produce.

    ``target_argmax[0]`` is the target's choice after the pending token, ``target_argmax[k + 1]``
    its choice after draft node k (scored with a tree mask, so along node k's own path).
    ``parents[k]`` is node k's parent (-1: the root)."""
    children: dict[int, dict[int, int]] = {}
    for k, (tok, par) in enumerate(zip(draft_tokens, parents)):
        children.setdefault(par, {}).setdefault(int(tok), k)  # the first of equal siblings wins
    path: list[int] = []
    node = -1
    while True:
        want = int(target_argmax[node + 1])
        nxt = children.get(node, {}).get(want)
        if nxt is None:
            return VerifyResult(len(path), want, node >= 0 and node not in children, tuple(path))
        path.append(nxt)
        node = nxt


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    generator: Optional[torch.Generator] = None,
) -> VerifyResult:
    """Leviathan/Chen verification.

    target_probs: [γ+1, V] filtered target law after each prefix (float32).
    draft_tokens: [γ] int64 tokens the drafter proposed.
    draft_probs: [γ, V] filtered law each token was drawn from, or None for a
        deterministic drafter (q is one-hot at the proposed token).
    """
    g = draft_tokens.shape[0]
    if g == 0:
        return VerifyResult(0, int(draw(target_probs[:1], generator)[0]), True)
    p = target_probs[:g].float()
    idx = draft_tokens.view(g, 1)
    p_x = p.gather(1, idx).squeeze(1)
    q_x = draft_probs[:g].float().gather(1, idx).squeeze(1) if draft_probs is not None else torch.ones_like(p_x)
    u = torch.rand(g, generator=generator, device=p.device)
    accepted = (u * q_x < p_x).tolist()  # u < p/q without dividing by q
    n = accepted.index(False) if False in accepted else g
    if n == g:
        return VerifyResult(g, int(draw(target_probs[g : g + 1], generator)[0]), True)
    if draft_probs is not None:
        residual = (p[n] - draft_probs[n].float()).clamp_min(0.0)
    else:
        residual = p[n].clone()
        residual[draft_tokens[n]] = 0.0
    mass = residual.sum()
    if float(mass) <= _RESIDUAL_EPS:
        residual = p[n]
    return VerifyResult(n, int(draw(residual.unsqueeze(0), generator)[0]), False)


def block_verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    generator: Optional[torch.Generator] = None,
) -> VerifyResult:
    """Block verification (Sun et al., arXiv:2403.10444, Algorithm 2): judge the draft as a block.

    Same inputs as ``rejection_sample``. With p the target, q the draft and X_1..X_γ the draft:

        w_0 = 1,  w_i = min(1, w_{i-1} p(X_i | X_<i) / q(X_i | X_<i))        (i = 1..γ)
        S_i = Σ_x max(0, w_i p(x | X_≤i) - q(x | X_≤i))                      (i = 1..γ-1)
        h_i = S_i / (S_i + 1 - w_i)  (i < γ),   h_γ = w_γ
        τ   = the largest i with η_i < h_i (η_i ~ U[0, 1) independent), else 0
        keep X_1..X_τ, then draw the next token from p(· | X_≤γ) if τ = γ,
        else from norm(max(0, w_τ p(· | X_≤τ) - q(· | X_≤τ))).

    Why: token-by-token verification stops at the first token whose ratio p/q is unlucky even
    when later tokens would have made up for it; w_i carries the leftover likelihood ratio of
    the whole prefix forward, so a block is kept whenever the prefix as a whole is likely
    enough under p. The paper proves the output law is the target's and that the expected
    number of accepted tokens is at least token-by-token's (and optimal among valid rules that
    verify a draft block). For a deterministic drafter (q one-hot) the accepted length has the same law as
    ``rejection_sample``'s. It draws as many uniforms as ``rejection_sample`` (γ, then one draw).
    """
    g = draft_tokens.shape[0]
    if g == 0:
        return VerifyResult(0, int(draw(target_probs[:1], generator)[0]), True)
    p = target_probs[: g + 1].float()
    idx = draft_tokens.view(g, 1)
    p_x = p[:g].gather(1, idx).squeeze(1).tolist()
    q = draft_probs[:g].float() if draft_probs is not None else None
    q_x = q.gather(1, idx).squeeze(1).tolist() if q is not None else [1.0] * g
    eta = torch.rand(g, generator=generator, device=p.device).tolist()
    w = [1.0]
    for a, b in zip(p_x, q_x):
        ratio = a / b if b > 0.0 else (float("inf") if a > 0.0 else 0.0)
        w.append(min(1.0, w[-1] * ratio) if w[-1] > 0.0 else 0.0)
    # S_i for i = 1..γ-1: the residual mass at the position after X_i (one [γ-1, V] op)
    if g == 1:
        s_mass: list[float] = []
    elif q is None:  # q one-hot at X_{i+1}: Σ max(0, w p - δ) = w (1 - p(X_{i+1})) since w p <= 1
        s_mass = [w[i] * (1.0 - p_x[i]) for i in range(1, g)]
    else:
        weights = torch.tensor(w[1:g], dtype=p.dtype, device=p.device).unsqueeze(1)
        s_mass = (weights * p[1:g] - q[1:g]).clamp_min(0.0).sum(dim=1).tolist()
    tau = 0
    if eta[g - 1] < w[g]:  # η ~ U[0, 1): P(η < h) = h, and h = 0 never passes
        tau = g
    else:
        for i in range(g - 1, 0, -1):
            s = s_mass[i - 1]
            denom = s + 1.0 - w[i]
            if eta[i - 1] * denom < s:  # η_i < h_i without dividing (s = 0: never)
                tau = i
                break
    if tau == g:
        return VerifyResult(g, int(draw(p[g : g + 1], generator)[0]), True)
    if q is not None:
        residual = (w[tau] * p[tau] - q[tau]).clamp_min(0.0)
    else:
        residual = p[tau] * w[tau]
        residual[draft_tokens[tau]] = 0.0
    if float(residual.sum()) <= _RESIDUAL_EPS:  # reachable only by rounding: p and q agree here
        residual = p[tau]
    return VerifyResult(tau, int(draw(residual.unsqueeze(0), generator)[0]), False)


ChainRule = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Generator]], VerifyResult]

# Sampled chain rules by name (``VerifyConfig.chain_rule``; config.CHAIN_RULES lists the same names).
CHAIN_RULES: dict[str, ChainRule] = {"block": block_verify, "token": rejection_sample}


def rejection_sample_tree(
    target_probs: torch.Tensor,
    draft_tokens: Sequence[int],
    parents: Sequence[int],
    draft_probs: Optional[torch.Tensor],
    generator: Optional[torch.Generator] = None,
) -> VerifyResult:
    """Sampled verification of a token tree, one node at a time from the root.

    target_probs: [n+1, V] filtered target law after the pending token (row 0) and after each
        node k along its own path (row k+1), as the tree-masked target pass scores them.
    draft_tokens, parents: the tree (``Draft.tokens``/``Draft.parents``; parents[k] = -1: a root
        child; parents before children).
    draft_probs: [n, V], row k the law node k was drawn from given its path and its earlier
        siblings; None: every node is a deterministic candidate (a one-hot law).

    At the current node, with residual r = the target's law there, try its children c in order:
    accept c (move to it) with probability min(1, r(x_c) / q_c(x_c)); on rejection set
    r = norm(max(0, r - q_c)) and try the next. If every child is rejected, draw the next token
    from r; at a leaf, draw the bonus token from the target's law there.

    * Sampled children: SpecInfer's multi-step speculative sampling (Miao et al.,
      arXiv:2305.09781, Algorithm 2 / Theorem 4.2) for children drawn independently (i.i.d. from
      the draft's law, or one per drafter). Exact more generally whenever child c's token, given
      everything drawn before it, has law q_c: the recursive rejection sampling of Jeon et al.
      (arXiv:2402.14160), e.g. siblings drawn without replacement with q_c renormalised over the
      tokens not yet drawn. Why it is exact: conditioned on any history, one step with target r
      and draft q_c emits r exactly (min(r, q_c) + max(0, r - q_c) = r), by induction over the
      siblings, and each accepted child continues with the target's conditional law.
    * Deterministic candidates (``draft_probs`` None, e.g. Medusa's top-k): q_c one-hot, so the
      same rule reads: accept x with probability r(x); on rejection set r(x) = 0 and renormalise.
      A sibling may be a one-hot row inside ``draft_probs`` too (mixed siblings), with the same
      condition: a deterministic token must not depend on its sampled earlier siblings' draws.
      (This rule is exact for any children drawn independently of the verifier's uniforms, sampled
      ones included; with their laws the multi-draft rule accepts more: for one child
      Σ min(p, q) >= Σ p q.)
    """
    n = len(draft_tokens)
    children: dict[int, list[int]] = {}
    for k, par in enumerate(parents):
        children.setdefault(int(par), []).append(k)
    u = torch.rand(n, generator=generator, device=target_probs.device).tolist() if n else []
    path: list[int] = []
    node = -1
    while True:
        law = target_probs[node + 1].float()
        kids = children.get(node)
        if not kids:  # a leaf (or no draft at all): the bonus token from the target's law here
            return VerifyResult(len(path), int(draw(law.unsqueeze(0), generator)[0]), node >= 0, tuple(path))
        r, mass = law, 1.0  # r / mass is the residual law; r is copied before its first change
        accepted = -1
        for c in kids:
            x = int(draft_tokens[c])
            r_x = float(r[x])
            if draft_probs is None:
                if u[c] * mass < r_x:
                    accepted = c
                    break
                if r_x > 0.0:
                    r = r.clone() if r is law else r
                    r[x] = 0.0
                    mass = float(r.sum())
            else:
                q_c = draft_probs[c].float()
                if u[c] * float(q_c[x]) * mass < r_x:  # u < (r(x)/mass) / q(x) without dividing
                    accepted = c
                    break
                nxt = (r / mass - q_c).clamp_min(0.0)
                m = float(nxt.sum())
                if m > _RESIDUAL_EPS:  # else the rejection had probability ~0: keep r
                    r, mass = nxt, m
        if accepted < 0:
            if mass <= _RESIDUAL_EPS:  # the candidates covered the law up to rounding
                r = law
            return VerifyResult(len(path), int(draw(r.unsqueeze(0), generator)[0]), False, tuple(path))
        path.append(accepted)
        node = accepted


def coupled_verify(target_probs: torch.Tensor, draft_tokens: Sequence[int], rates: torch.Tensor) -> VerifyResult:
    """Gumbel-max coupled verification of a chain (``sampling.CoupledNoise``).

    target_probs: [γ+1, V] filtered target law after each prefix; rates: [γ+1, V] the noise rates
    of the positions those laws are for (row j: the position of draft token j, the last row the
    bonus position). The target's token at each position is ``argmax p * rate``, its draw with this
    seed whatever was drafted; the draft is kept while it equals those draws and the first
    differing draw (or the bonus draw) comes next, so the output law is the target's and the
    tokens are plain decoding's. How the draft was made (sampled with the same noise, or
    deterministic) only changes how many are kept."""
    g = len(draft_tokens)
    return greedy_verify(coupled_draws(target_probs[: g + 1], rates[: g + 1]), draft_tokens)


def tree_levels(parents: Sequence[int]) -> int:
    """How many tokens deep a tree is (a chain of n nodes: n); parents come before children."""
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    return max(depth, default=0)


def coupled_verify_tree(target_probs: torch.Tensor, draft_tokens: Sequence[int], parents: Sequence[int],
                        rates: torch.Tensor) -> VerifyResult:
    """Gumbel-max coupled verification of a tree: from the root, follow the child equal to the
    target's draw while there is one (the walk of ``greedy_verify_tree``, on the draws).

    target_probs: [n+1, V] as for ``rejection_sample_tree`` (row 0 after the pending token, row k+1
    after node k along its path). rates: [``tree_levels(parents)`` + 1, V], row d the rates of the
    position d tokens after the pending one (row 0 is scored at d = 0, node k's row at k's depth
    + 1). Draws are made along the walk only: a wide tree costs no more than its accepted path."""
    children: dict[int, dict[int, int]] = {}
    for k, (tok, par) in enumerate(zip(draft_tokens, parents)):
        children.setdefault(int(par), {}).setdefault(int(tok), k)  # the first of equal siblings wins
    path: list[int] = []
    node = -1
    while True:
        d = len(path)
        want = coupled_draws(target_probs[node + 1 : node + 2], rates[d : d + 1])[0]
        nxt = children.get(node, {}).get(want)
        if nxt is None:
            return VerifyResult(d, want, node >= 0 and node not in children, tuple(path))
        path.append(nxt)
        node = nxt


def verify_draft(draft: "Draft", logits: torch.Tensor, argmax: Optional[Sequence[int]], sampling: "SamplingConfig",
                 position: int, noise: Optional[CoupledNoise], gen: Optional[torch.Generator],
                 chain_rule: str) -> VerifyResult:
    """The rule for one row's draft (the core's dispatch): a tree (``draft.parents``) or a chain,
    each greedy (``argmax``: the target's argmax per position, needed for a greedy ``sampling``),
    coupled (``noise``: the row's Gumbel-max draws from sequence ``position`` on) or sampled
    (``gen``; a chain by ``CHAIN_RULES[chain_rule]``). ``logits``: the row's [width, V] target logits."""
    g = len(draft.tokens)
    if draft.parents is not None:
        if sampling.greedy:
            assert argmax is not None
            return greedy_verify_tree(argmax[: g + 1], draft.tokens, draft.parents)
        probs = probs_from_logits(logits[: g + 1], sampling)
        if noise is not None:
            return coupled_verify_tree(probs, draft.tokens, draft.parents,
                                       noise.window(position, tree_levels(draft.parents) + 1))
        return rejection_sample_tree(probs, draft.tokens, draft.parents, draft.probs, gen)
    if sampling.greedy:
        assert argmax is not None
        return greedy_verify(argmax[: g + 1], draft.tokens)
    probs = probs_from_logits(logits[: g + 1], sampling)
    if noise is not None:
        return coupled_verify(probs, draft.tokens, noise.window(position, g + 1))
    draft_ids = torch.tensor(draft.tokens, dtype=torch.long, device=logits.device)
    return CHAIN_RULES[chain_rule](probs, draft_ids, draft.probs, gen)


def tree_mask(drafts: Sequence[Draft], width: int, device: torch.device) -> torch.Tensor:
    """[B, width, width] bool: node i sees node j iff j is i or an ancestor of i. Node 0 is the
    pending token (the root); node k + 1 is draft token k. A chain draft or the padding after a
    row's draft continues as a chain."""
    rows = []
    for d in drafts:
        anc = [[0]]
        for k in range(width - 1):
            parent = d.parents[k] + 1 if d.parents is not None and k < len(d) else k
            anc.append(anc[parent] + [k + 1])
        m = torch.zeros(width, width, dtype=torch.bool)
        for i, a in enumerate(anc):
            m[i, a] = True
        rows.append(m)
    return torch.stack(rows).to(device)
