"""Verification of a draft against the target: pure functions, no model, no state.

``rejection_sample`` is the modified rejection sampling of Leviathan et al.
(arXiv:2211.17192) and Chen et al. (arXiv:2302.01318): accept draft token x
with probability min(1, p(x)/q(x)); at the first rejection draw the recovered
token from norm(max(0, p - q)); if every token is accepted draw a bonus token
from the target's next distribution. The output law equals p exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .sampling import draw

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
