"""Structured output: a grammar (JSON schema, regex, Lark) as a token mask, exact under speculation.

The constrained law at a position is the target's logits with every token the grammar forbids
set to -inf, then the usual filters (``sampling.probs_from_logits``): the mask comes first, so a
top-k or top-p filter can never leave nothing. The decode core applies that law to the target
at every verified position, and drafters draw from the same masked law (``DraftContext.constraint``),
so the verifier compares two laws of the same kind and the output follows the constrained target
law exactly. A drafter that ignores the mask stays exact too: the core cuts its draft at the
first forbidden token (``ConstraintState.check_draft``). The grammar state advances only over
the tokens the verifier emitted; draft tokens are pushed on a stack and rolled back.

Engine: llguidance (Microsoft, MIT; behind llama.cpp's and vLLM's guidance backends). Why this
one: a 3 MB abi3 wheel with no Python dependencies (xgrammar 0.2.9 pulls triton, 286 MB, and
apache-tvm-ffi; outlines-core has no context-free grammars); JSON schema, regex and Lark in one
engine; a mask for the bundled 8k vocabulary in ~10-20 µs on this CPU (under 1% of a target
pass of the bundled 27M model); rollback of consumed tokens (drafts); and ``compute_ff_tokens``
(the tokens the grammar forces), which the core inserts as free drafts.

A ``ConstraintSpec`` (what a user asks for, model-independent) is built in ``constraint_spec.py``
(re-exported here); this module binds it to a tokenizer and keeps each row's grammar state.

Convention past the end: once EOS is pushed (or the grammar cannot continue) the mask allows
EOS only. Those positions are never emitted (the row stops at EOS), and target and draft use
the same convention, so the rule stays exact.
"""

from __future__ import annotations

import logging
import re
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .config import ConfigError
from .constraint_spec import (INSTALL_HINT, JSON_LAYOUT, KIND_NAMES, KINDS, ConstraintSpec, echo, json_schema_spec,
                              llguidance_module, short_error, spec_from_args, spec_from_files,
                              spec_from_response_format)

from .draft import Draft

if TYPE_CHECKING:
    from .models import Model

_TOKENIZERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
# tokens ``bind`` walks to find a grammar the engine gives up on at once (an object with ~500 optional
# properties or an enum of ~2000 values fails at its first token): it is refused before it takes a row
PROBE_TOKENS = 16
_TOKEN_ID = re.compile(r"[0-9]+")  # not \d, which matches every script's digits
log = logging.getLogger("specdecode")


class GrammarLimitError(ConfigError):
    """The grammar engine gave up on a constraint (one of its resource limits, such as llguidance's
    2000 Earley items per parser row): the constraint is too large or too ambiguous for it."""


def _gave_up(kind: str, err: str, tokens: int) -> str:
    """What to tell a user whose constraint the engine gave up on (its own text, parser state
    included, goes to the log only)."""
    log.info("grammar engine gave up on a %s after %d tokens: %s", kind, tokens, short_error(err))
    where = f"after {tokens} tokens of output" if tokens else "at the start of the output"
    m = re.search(r"row has (\d+) items; max is (\d+)", err)
    if m:
        why = (f"it allows {m[1]} alternatives at one point ({where}), more than the engine's limit of {m[2]} "
               "(an object with many optional properties, a long enum or anyOf)")
    else:
        why = f"it ran past one of the engine's resource limits ({where})"
    return (f"the {KIND_NAMES[kind]} is too large for the structured-output grammar engine: {why}; make it smaller "
            "or simpler")


# -- bound to a tokenizer ------------------------------------------------------------------------------
def grammar_tokenizer(model: "Model") -> Any:
    """llguidance's view of ``model``'s tokenizer.json (built once per model, ~70 ms for 8k tokens)."""
    tok = _TOKENIZERS.get(model)
    if tok is not None:
        return tok
    if model.tokenizer is None:
        raise ConfigError(f"structured output needs the model's tokenizer.json; {model.path} has none")
    if not model.eos_token_ids:
        raise ConfigError(f"structured output needs an end-of-sequence token; {model.path} defines none "
                          "(set eos_token_id in config.json)")
    eos = sorted(model.eos_token_ids)
    tok = llguidance_module().LLTokenizer(model.tokenizer.to_str(), n_vocab=model.vocab_size, eos_token=eos)
    _TOKENIZERS[model] = tok
    return tok


class _TokenList:
    """llguidance's TokenizerWrapper contract for a vocabulary given as bytes (tests, toy models)."""

    def __init__(self, tokens: Sequence[bytes], eos: int) -> None:
        self.tokens = list(tokens)
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = [eos]

    def __call__(self, text: Union[str, bytes]) -> list[int]:  # greedy longest match (only used for forced text)
        data = text.encode() if isinstance(text, str) else text
        out, i = [], 0
        while i < len(data):
            best = max((k for k, t in enumerate(self.tokens) if k != self.eos_token_id and data.startswith(t, i)),
                       key=lambda k: len(self.tokens[k]), default=None)
            if best is None:
                raise ValueError(f"cannot tokenize {data[i:]!r}")
            out.append(best)
            i += len(self.tokens[best])
        return out


def token_list_tokenizer(tokens: Sequence[bytes], eos: int) -> Any:
    """A grammar tokenizer for a vocabulary whose tokens' bytes are listed (``tokens[eos]`` is EOS)."""
    llg = llguidance_module()
    return llg.LLTokenizer(llg.TokenizerWrapper(_TokenList(tokens, eos)), n_vocab=len(tokens))


@dataclass(frozen=True, eq=False)
class Constraint:
    """A spec compiled for one tokenizer: shareable between rows; ``start`` gives a row its state."""

    spec: ConstraintSpec
    tokenizer: Any  # llguidance.LLTokenizer
    vocab_size: int

    def start(self) -> "ConstraintState":
        return ConstraintState(self)


def bind(spec: ConstraintSpec, model: "Model") -> Constraint:
    """``spec`` compiled against ``model``'s tokenizer."""
    c = Constraint(spec, grammar_tokenizer(model), model.vocab_size)
    c.start().probe(PROBE_TOKENS)  # fail now (ConfigError), not in the middle of a batch
    return c


def constraint_from_response_format(model: "Model", response_format: Any) -> Optional[Constraint]:
    """For the server: OpenAI ``response_format`` -> a constraint for ``model`` (None for text)."""
    spec = spec_from_response_format(response_format)
    return bind(spec, model) if spec is not None else None


# -- one row's grammar state -----------------------------------------------------------------------
def parse_logit_bias(logit_bias: Any, vocab_size: int) -> Optional[dict[int, float]]:
    """OpenAI's ``logit_bias`` ({token id (int or its string): bias in [-100, 100]}) checked against
    the vocabulary; None when empty. ConfigError names the field and the fix. A string key must be
    ASCII decimal digits only: ``int`` would also take " 5 ", "1_0" and other scripts' digits."""
    if logit_bias is None or logit_bias == {}:
        return None
    if not isinstance(logit_bias, Mapping):
        raise ConfigError("logit_bias must be an object mapping token ids to biases, e.g. {\"50256\": -100}")
    out: dict[int, float] = {}
    for k, v in logit_bias.items():
        if isinstance(k, int) and not isinstance(k, bool):
            t = k
        elif isinstance(k, str) and _TOKEN_ID.fullmatch(k) and len(k) <= 20:
            t = int(k)
        else:
            raise ConfigError(f"logit_bias key {echo(k)} is not a token id; keys must be token ids written in "
                              "the digits 0-9 only, e.g. {\"50256\": -100}")
        if not 0 <= t < vocab_size:
            raise ConfigError(f"logit_bias token id {t} is outside the vocabulary [0, {vocab_size})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100.0 <= float(v) <= 100.0:
            raise ConfigError(f"logit_bias values must be numbers in [-100, 100], got {echo(v)} for token {t}")
        out[t] = float(v)
    return out


def row_state(constraint: Optional[Constraint], logit_bias: Optional[Mapping[int, float]],
              vocab_size: int) -> Optional["ConstraintState"]:
    """What the decode core keeps for a row with a grammar and/or a logit bias (None: neither)."""
    if constraint is None and not logit_bias:
        return None
    bias = None
    if logit_bias:
        bias = torch.zeros(vocab_size)
        for t, b in logit_bias.items():
            bias[t] = b
    return ConstraintState(constraint, vocab_size, bias)


class ConstraintState:
    """A row's logits hook: the grammar state (committed tokens plus a stack of draft tokens) and
    the row's logit bias, applied alike to the target's logits and the drafter's.

    ``allowed`` is the mask at the top of the stack; ``push``/``rollback`` move along a draft;
    ``commit`` advances over emitted tokens (the stack must be empty). Masks are cached by the
    draft tokens since the last commit, so the draft and the verifier share them. Without a
    grammar every token is allowed and only the bias applies (a finite shift of the logits:
    target and draft laws are both the biased ones, so the verifier stays exact).

    If the grammar engine gives up (a resource limit, partway through decoding), nothing raises:
    ``error`` holds what to tell the user, and from then on the state allows EOS only, refuses
    pushes, drafts nothing and commits nothing. The decode core then fails this row alone (a
    drafter that drafts for many rows at once is never interrupted by one row's grammar)."""

    def __init__(self, c: Optional[Constraint], vocab_size: Optional[int] = None,
                 bias: Optional[torch.Tensor] = None) -> None:
        self.constraint = c
        self.vocab_size = c.vocab_size if c is not None else int(vocab_size or 0)
        self.bias = bias
        self._all = torch.ones(self.vocab_size, dtype=torch.bool)
        self.matcher: Any = None
        self.eos = -1
        self._eos_ids: frozenset[int] = frozenset()
        if c is not None:
            self.eos = int(c.tokenizer.eos_token)
            self.matcher = llguidance_module().LLMatcher(c.tokenizer, c.spec.grammar, log_level=0)
            if self.matcher.is_error():
                raise ConfigError(f"the {c.spec.kind} constraint does not compile: "
                                  f"{short_error(self.matcher.get_error())}")
            self._eos_ids = frozenset(c.tokenizer.eos_tokens) | {self.eos}
        self.error: Optional[str] = None  # set when the grammar engine gave up (the row must fail)
        self._committed = 0  # tokens committed (for the error message)
        self._stack: list[int] = []  # pushed draft tokens
        self._fed: list[bool] = []  # whether each pushed token went into the matcher (not past EOS)
        self.done = False  # EOS is at or below the top of the stack
        self._committed_done = False
        self._masks: dict[tuple[int, ...], torch.Tensor] = {}
        self._eos_only = torch.zeros(self.vocab_size, dtype=torch.bool)
        if self.eos >= 0:
            self._eos_only[self.eos] = True

    # -- masks ----------------------------------------------------------------------------------
    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next (EOS only once the grammar is done)."""
        if self.matcher is None:
            return self._all
        if self.error is not None:
            return self._eos_only
        key = tuple(self._stack)
        m = self._masks.get(key)
        if m is None:
            if self.done:
                m = self._eos_only
            else:
                bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
                if self.matcher.is_error():
                    self._fail()
                    return self._eos_only
                m = torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool))
                if not bool(m.any()):  # cannot happen for a valid grammar state; never leave nothing
                    m = self._eos_only
            self._masks[key] = m
        return m

    def _fail(self) -> None:
        """The engine gave up: keep what to tell the user; the state is inert from now on."""
        if self.error is None:
            assert self.constraint is not None
            self.error = _gave_up(self.constraint.spec.kind, self.matcher.get_error() or "", self._committed)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [V] with forbidden tokens at -inf (a drafter samples or takes the argmax of it).
        If the drafter's own logits leave no allowed token finite (a restricted draft vocabulary),
        the law is uniform over the allowed tokens: any law is fine for a draft that reports it."""
        if self.bias is not None:
            logits = logits + self.bias[: logits.shape[-1]]
        if self.matcher is None:
            return logits
        allowed = self.allowed()
        out = logits.masked_fill(~allowed[: logits.shape[-1]], float("-inf"))
        if not bool(torch.isfinite(out).any()):
            out = torch.zeros_like(logits).masked_fill(~allowed[: logits.shape[-1]], float("-inf"))
        return out

    # -- the draft stack --------------------------------------------------------------------------
    def push(self, token: int) -> bool:
        """Advance over a draft token; False (and no change) if the grammar forbids it here."""
        if self.matcher is None:
            return 0 <= token < self.vocab_size
        if not (0 <= token < self.vocab_size) or not bool(self.allowed()[token]) or self.error is not None:
            return False
        fed = not self.done and token not in self._eos_ids
        if fed and not self.matcher.consume_token(token):  # an allowed token refused: the engine gave up
            self._fail()
            return False
        self._stack.append(token)
        self._fed.append(fed)
        if not fed:
            self.done = True
        return True

    def rollback(self, n: Optional[int] = None) -> None:
        """Pop ``n`` draft tokens (all of them by default)."""
        n = len(self._stack) if n is None else n
        if n <= 0:
            return
        fed = sum(self._fed[-n:])
        if fed and self.error is None and not self.matcher.rollback(fed):
            self._fail()
        del self._stack[-n:], self._fed[-n:]
        self.done = self._committed_done or not all(self._fed)

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance the committed state over emitted tokens (each must be allowed)."""
        self.rollback()
        for t in tokens:
            if not self.push(t):
                if self.error is not None:  # the engine gave up: the core fails the row
                    break
                raise RuntimeError(f"token {t} was emitted but the grammar forbids it (a mask was not applied)")
        self._committed += len(self._stack)
        self._stack.clear()
        self._fed.clear()
        self._committed_done = self.done
        self._masks.clear()

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces from here (llguidance's fast-forward tokens,
        in the tokenizer's canonical split), for the core to propose as a free draft."""
        if self.matcher is None or self.done or self.error is not None or limit <= 0:
            return []
        forced = [int(t) for t in self.matcher.compute_ff_tokens()[:limit]]
        if self.matcher.is_error():
            self._fail()
            return []
        return forced

    def probe(self, steps: int) -> None:
        """Walk up to ``steps`` tokens of the grammar (the forced ones, else the lowest allowed one)
        and raise GrammarLimitError if the engine gives up on the way: a grammar too large for its
        limits usually fails at its first tokens, and is refused then rather than mid-batch. For a
        fresh state that is then dropped (the walk stays on its draft stack)."""
        while len(self._stack) < steps and self.matcher is not None and not self.done and self.error is None:
            tokens = self.forced(steps - len(self._stack))
            if not tokens:
                allowed = self.allowed().clone()
                allowed[[t for t in self._eos_ids if 0 <= t < self.vocab_size]] = False
                first = allowed.nonzero()
                if first.numel() == 0:
                    break
                tokens = [int(first[0])]
            if not all(self.push(t) for t in tokens):
                break
        if self.error is not None:
            raise GrammarLimitError(self.error)

    # -- the core's side --------------------------------------------------------------------------
    def check_draft(self, draft: "Draft") -> tuple["Draft", torch.Tensor]:
        """The draft the target may verify under the grammar, and [n+1, V] bool masks: row 0 for
        the position after the pending token, row k+1 after draft node k (along its path).

        Exactness of the cuts: a chain with laws (a stochastic drafter) is cut just *after* its
        first forbidden token: the target gives that token probability 0, so block and
        token-by-token verification reject it and never look past it; the verdict equals that of
        the whole draft. A draft without laws (deterministic: n-gram, heads) is cut *before* it
        (any deterministic draft is a valid draft). A tree without laws loses its forbidden nodes
        and their subtrees; a tree with laws is not verified under a grammar (empty draft,
        decided without looking at it)."""
        self.rollback()
        if self.matcher is None:
            return draft, self._all.expand(len(draft.tokens) + 1, self.vocab_size)
        if self.error is None and draft.parents is not None:
            if draft.probs is not None:
                return Draft(), self.allowed().unsqueeze(0)
            draft, masks = self._check_tree(draft)
        elif self.error is None:
            draft, masks = self._check_chain(draft)
        if self.error is not None:  # the engine gave up (now or before): no draft; the core fails the row
            return Draft(), self._eos_only.unsqueeze(0)
        return draft, masks

    def _check_chain(self, draft: "Draft") -> tuple["Draft", torch.Tensor]:
        masks = [self.allowed()]
        n = len(draft.tokens)
        for k, t in enumerate(draft.tokens):
            if not self.push(t):
                n = k + 1 if draft.probs is not None else k
                if n > k:  # the kept forbidden token is rejected for sure: the position after it is never used
                    masks.append(self._eos_only)
                break
            masks.append(self.allowed())
        self.rollback()
        if n == len(draft.tokens):
            return draft, torch.stack(masks)
        probs = draft.probs[:n] if draft.probs is not None else None
        return Draft(list(draft.tokens[:n]), probs, source=draft.source), torch.stack(masks)

    def _check_tree(self, draft: "Draft") -> tuple["Draft", torch.Tensor]:
        assert draft.parents is not None
        paths: dict[int, list[int]] = {-1: []}
        keep: list[int] = []
        new_index: dict[int, int] = {-1: -1}
        masks = [self.allowed()]
        for k, (t, par) in enumerate(zip(draft.tokens, draft.parents)):
            if par not in paths:  # its parent was dropped
                continue
            path = paths[par] + [t]
            ok = all(self.push(x) for x in path)
            if ok:
                masks.append(self.allowed())
                paths[k] = path
                new_index[k] = len(keep)
                keep.append(k)
            self.rollback()
        tokens = [draft.tokens[k] for k in keep]
        parents = [new_index[draft.parents[k]] for k in keep]
        return Draft(tokens, None, parents if tokens else None, draft.source), torch.stack(masks)

    def apply(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Target logits [n+1, V'] with forbidden tokens at -inf (V' may exceed the tokenizer's V)."""
        v = logits.shape[-1]
        if self.bias is not None:
            logits = logits + self.bias[:v]
        if self.matcher is None:
            return logits
        forbid = ~masks[:, :v]
        if forbid.shape[-1] < v:  # padded embedding rows past the tokenizer: never allowed
            forbid = torch.nn.functional.pad(forbid, (0, v - forbid.shape[-1]), value=True)
        return logits.masked_fill(forbid, float("-inf"))


def check_request(request: Any, target: "Model") -> None:
    """ConfigError unless a constrained ``rows.Request`` can run on ``target``: the grammar's
    vocabulary is the target's, and the row stops at the EOS the grammar ends with."""
    c: Optional[Constraint] = request.constraint
    if request.logit_bias:
        parse_logit_bias(request.logit_bias, target.vocab_size)
    if c is None:
        return
    if c.vocab_size != target.vocab_size:
        raise ConfigError(f"the constraint was compiled for a vocabulary of {c.vocab_size} tokens but the target "
                          f"has {target.vocab_size}; build it with constraints.bind(spec, target)")
    if request.generation.ignore_eos:
        raise ConfigError("ignore_eos cannot be combined with structured output: the grammar ends the output "
                          "with the end-of-sequence token; drop ignore_eos")
    if int(c.tokenizer.eos_token) not in target.eos_token_ids:
        raise ConfigError(f"the constraint ends with token {int(c.tokenizer.eos_token)}, which is not one of the "
                          f"target's end-of-sequence tokens {sorted(target.eos_token_ids)}")


__all__ = ["INSTALL_HINT", "JSON_LAYOUT", "KINDS", "KIND_NAMES", "PROBE_TOKENS", "Constraint", "ConstraintSpec",
           "ConstraintState", "GrammarLimitError", "bind", "check_request", "constraint_from_response_format",
           "grammar_tokenizer", "json_schema_spec", "llguidance_module", "parse_logit_bias", "row_state",
           "short_error", "spec_from_args", "spec_from_files", "spec_from_response_format", "token_list_tokenizer"]
