"""Log-probabilities of emitted tokens from the target's law (OpenAI ``logprobs``/``top_logprobs``).

Each emitted token's log-probability is read from the law the target gives its position: the
logits after the row's logit bias and grammar mask, then temperature and the top-k/top-p/min-p
filters (``sampling.probs_from_logits``); greedy rows report that law at temperature 1 (the law
at temperature 0 is a point mass). Under speculation every emitted position is one the target
scored in its verifying pass along the emitted prefix, so the numbers are the ones plain decoding
would report: exact, at no extra target pass. Filtered-out tokens (-inf) never appear in ``top``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .config import ConfigError, SamplingConfig
from .sampling import probs_from_logits

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # the k most likely (token, logprob), best first


def check_logprobs(k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ConfigError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}")


def logprob_setting(cfg: SamplingConfig) -> SamplingConfig:
    return dataclasses.replace(cfg, temperature=1.0) if cfg.greedy else cfg


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], cfg: SamplingConfig, k: int) -> list[TokenLogprob]:
    """``logits`` [n, V]: the (biased, masked) target logits at the positions of ``tokens`` (n of them)."""
    logp = probs_from_logits(logits[: len(tokens)], logprob_setting(cfg)).log()
    idx = torch.tensor(list(tokens), dtype=torch.long, device=logp.device).unsqueeze(1)
    chosen = logp.gather(1, idx).squeeze(1).tolist()
    out = [TokenLogprob(int(t), float(c)) for t, c in zip(tokens, chosen)]
    if k > 0:
        vals, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
        for tl, vs, ts in zip(out, vals.tolist(), ids.tolist()):
            tl.top = [(int(t), float(v)) for t, v in zip(ts, vs) if v != float("-inf")]
    return out
