"""The decode loop: propose -> one target pass -> verify -> roll back -> emit.

Plain decoding is the same loop with an empty draft, so every speedup we
report is measured against the same runtime. The loop keeps one invariant:
the target's cache holds every token of the sequence except the last one,
which is fed together with the draft at the next pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, Union

import torch

from .cache import ContextLengthError, KVCache
from .config import ConfigError, GenerationConfig, SamplingConfig
from .drafters.base import Draft, DraftContext, Drafter
from .metrics import GenerationStats
from .models import Model
from .ops import argmax_list
from .sampling import make_generator, probs_from_logits
from .verify import greedy_verify, rejection_sample

Prompt = Union[str, Sequence[int]]


@dataclass
class StepEvent:
    """Tokens produced by one target pass, with their text pieces and origin."""

    token_ids: list[int]
    from_draft: list[bool]  # True: a draft token the target accepted
    pieces: list[str]  # text delta per token ('' while a multi-byte character is incomplete)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class FinishEvent:
    reason: str  # "stop" (EOS or stop string) or "length" (token budget or context window)
    token_ids: list[int]
    text: str
    stats: GenerationStats


Event = Union[StepEvent, FinishEvent]


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only (EOS included when it ended the run)
    text: str
    stats: GenerationStats
    finish_reason: str
    from_draft: list[bool] = field(default_factory=list)


class IncrementalDetokenizer:
    """Text deltas per token that concatenate to the decoded text, never splitting a UTF-8 character."""

    def __init__(self, model: Model, context: Sequence[int]) -> None:
        self.model = model
        self.ids = list(context[-4:])  # a little prompt context so leading spaces decode right
        self.prefix = 0
        self.read = len(self.ids)

    def push(self, token: int) -> str:
        self.ids.append(token)
        prefix_text = self.model.decode(self.ids[self.prefix : self.read])
        new_text = self.model.decode(self.ids[self.prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix_text = self.model.decode(self.ids[self.prefix : self.read])
        new_text = self.model.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return new_text[len(prefix_text) :]


def prompt_ids(target: Model, prompt: Prompt) -> list[int]:
    """Tokenise (or validate) a prompt, with errors that say what to change."""
    if isinstance(prompt, str):
        ids = target.encode(prompt)
    else:
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < target.vocab_size]
        if bad:
            raise ConfigError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {target.vocab_size})")
    if not ids:
        raise ConfigError("the prompt is empty; give at least one token of text")
    if len(ids) >= target.max_seq_len:
        raise ContextLengthError(
            f"prompt has {len(ids)} tokens but the context window of {target.name} is {target.max_seq_len}; "
            "shorten the prompt so at least one token can be generated"
        )
    return ids


@torch.inference_mode()
def _target_step(target: Model, tokens: list[int], cache: KVCache) -> torch.Tensor:
    """One target pass over the pending token and the draft: logits [len(tokens), V]."""
    ids = torch.tensor([tokens], dtype=torch.long, device=target.device)
    return target.forward(ids, cache)[0]


def stream(
    target: Model,
    prompt: Prompt,
    drafter: Optional[Drafter] = None,
    sampling: Optional[SamplingConfig] = None,
    generation: Optional[GenerationConfig] = None,
) -> Iterator[Event]:
    """Generate from ``target``, yielding a ``StepEvent`` per target pass and a final ``FinishEvent``."""
    sampling = sampling or SamplingConfig()
    generation = generation or GenerationConfig()
    tokens = prompt_ids(target, prompt)
    n_prompt = len(tokens)
    if drafter is not None:
        drafter.prepare(target)
    gen = make_generator(sampling.seed, target.device)
    max_len = min(target.max_seq_len, n_prompt + generation.max_new_tokens)
    cache = target.new_cache(1, max_len)
    eos = frozenset() if generation.ignore_eos else target.eos_token_ids
    stats = GenerationStats(prompt_tokens=n_prompt)
    detok = IncrementalDetokenizer(target, tokens) if target.tokenizer is not None else None
    text = ""
    generated: list[int] = []

    t0 = time.perf_counter()
    if n_prompt > 1:
        with torch.inference_mode():
            target.forward(torch.tensor([tokens[:-1]], device=target.device), cache, last_only=True)
    t1 = time.perf_counter()
    stats.prefill_s = t1 - t0
    reason = "length"
    while True:
        room = min(generation.max_new_tokens - len(generated), max_len - len(tokens))
        if room <= 0:
            break
        draft = Draft()
        if drafter is not None and room > 1:
            td = time.perf_counter()
            draft = drafter.propose(DraftContext(tokens, room - 1, sampling, gen))
            stats.draft_s += time.perf_counter() - td
            if len(draft) > room - 1:
                raise RuntimeError(f"drafter proposed {len(draft)} tokens but at most {room - 1} were allowed")
        g = len(draft)
        logits = _target_step(target, [tokens[-1]] + draft.tokens, cache)
        if sampling.greedy:
            res = greedy_verify(argmax_list(logits), draft.tokens)
        else:
            draft_ids = torch.tensor(draft.tokens, dtype=torch.long, device=logits.device)
            res = rejection_sample(probs_from_logits(logits, sampling), draft_ids, draft.probs, gen)
        cache.trim(g - res.n_accepted)
        if drafter is not None:
            drafter.on_verified(res.n_accepted)
        new = draft.tokens[: res.n_accepted] + [res.next_token]
        flags = [True] * res.n_accepted + [False]
        done = False
        for i, t in enumerate(new):
            if t in eos:
                new, flags, done, reason = new[: i + 1], flags[: i + 1], True, "stop"
                break
        stats.record_step(g, res.n_accepted, len(new))
        tokens.extend(new)
        generated.extend(new)
        pieces = [detok.push(t) for t in new] if detok is not None else [""] * len(new)
        if done and detok is not None:
            pieces[-1] += detok.flush()
        if generation.stop and detok is not None:
            cut = find_stop(text, "".join(pieces), generation.stop)
            if cut is not None:
                pieces = truncate_pieces(pieces, cut - len(text))
                done, reason = True, "stop"
        text += "".join(pieces)
        yield StepEvent(new, flags, pieces)
        if done:
            break
    if reason == "length" and detok is not None:
        tail = detok.flush()
        if tail:
            text += tail
            yield StepEvent([], [], [tail])
    stats.decode_s = time.perf_counter() - t1
    yield FinishEvent(reason, generated, text, stats)


def find_stop(previous: str, delta: str, stops: Sequence[str]) -> Optional[int]:
    """Index in the full text where the earliest stop string starts, if one completed in ``delta``."""
    full = previous + delta
    lo = max(0, len(previous) - max(len(s) for s in stops) + 1)
    hits = [i for s in stops if (i := full.find(s, lo)) >= 0]
    return min(hits) if hits else None


def truncate_pieces(pieces: list[str], keep: int) -> list[str]:
    out = []
    for p in pieces:
        out.append(p[: max(0, keep)])
        keep -= len(p)
    return out


def generate(
    target: Model,
    prompt: Prompt,
    drafter: Optional[Drafter] = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    seed: Optional[int] = None,
    ignore_eos: bool = False,
    stop: Sequence[str] = (),
) -> GenerationResult:
    """Run ``stream`` to the end and collect tokens, text and stats."""
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    generation = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos, stop=tuple(stop))
    flags: list[bool] = []
    for ev in stream(target, prompt, drafter, sampling, generation):
        if isinstance(ev, StepEvent):
            flags.extend(ev.from_draft)
        else:
            return GenerationResult(ev.token_ids, ev.text, ev.stats, ev.reason, flags)
    raise RuntimeError("stream ended without a FinishEvent")  # pragma: no cover
