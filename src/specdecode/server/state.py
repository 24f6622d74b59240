"""What the app serves from: the loaded models, their drafters, the scheduler and the flags.

``make_state`` builds every registered drafter that can run with what is loaded, each from its own
artifact (artifacts are keyed by kind, so giving one never unloads another).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from ..chat import PLAIN_TEMPLATE, ChatFormatter
from ..config import ConfigError
from ..drafters.crosstok import shares_vocabulary
from ..drafters.registry import PAIRED_DEFAULT, REGISTRY, DrafterOptions, get_spec, missing, with_defaults
from ..models.catalog import CATALOG
from ..sizing.gamma import Gamma, Speculation, resolve_gamma, speculation_flag
from ..sizing.pricer import DEFAULT_PRICER, Pricer
from .config import ServerConfig, resolve_api_key
from .metrics import ServerMetrics
from .protocol import now
from .scheduler import Scheduler

if TYPE_CHECKING:
    from ..drafters.vocab import VocabSpec
    from ..models import Model


@dataclass
class ServerState:
    scheduler: Scheduler
    metrics: ServerMetrics
    config: ServerConfig
    model_name: str
    chat: ChatFormatter
    chat_has_model_template: bool
    default_drafter: str
    default_gamma: Gamma  # what a request without ``gamma`` asks for: the server's --gamma, N or "auto"
    created: int
    max_token_chars: int = 0  # longest vocabulary entry, for the early context-length check
    model_names: tuple[str, ...] = ()  # what a request's ``model`` may say (``served_names``); model_name first

    def __post_init__(self) -> None:
        if self.model_name not in self.model_names:
            self.model_names = (self.model_name, *self.model_names)

    @property
    def default_speculation(self) -> Speculation:
        """What a request to the default drafter without ``gamma`` gets, by the rule ``generate`` follows
        (``gamma.resolve_gamma``); a client's ``gamma`` N is N every step, as ``--gamma N`` is."""
        d = self.scheduler.drafters.get(self.default_drafter)
        return resolve_gamma(self.default_gamma, d.gamma if d is not None else "auto",
                             speculation_flag(self.config.speculation))

    @property
    def default_cap(self) -> int:
        """The most draft tokens a pass of a request to the default drafter without ``gamma``."""
        return self.default_speculation.cap

    @property
    def speculation_mode(self) -> str:
        """What a request without ``gamma`` gets: "adaptive" (the γ policy picks 0..``default_cap`` each
        step) or "fixed" (``default_cap`` every step)."""
        return "adaptive" if self.default_speculation.adaptive else "fixed"

    def describe_gamma(self) -> str:
        """``speculation_mode`` in words with its cap, e.g. "adaptive, at most 15", for the start line."""
        return self.default_speculation.describe()


def make_state(target: "Model", draft_model: Optional["Model"], config: ServerConfig,
               default_drafter: Optional[str] = None, default_gamma: Gamma = "auto", model_name: Optional[str] = None,
               draft_vocab: "VocabSpec" = "auto", options: Optional[Mapping[str, object]] = None,
               artifacts: Optional[Mapping[str, str]] = None, prepare_in_background: bool = False,
               aliases: Sequence[str] = (), pricer: Pricer = DEFAULT_PRICER) -> ServerState:
    """Everything the app needs, from loaded models and the serving flags: every registered drafter
    that can run with what is loaded (a draft model's only when one is given; each trained artifact
    from its own directory in ``artifacts``, by artifact name). ``options``: the drafters' declared
    options by key; ``default_drafter``: the registry's paired default unless given; ``aliases``: more
    names requests may give the target by (``served_names``). ``default_gamma`` and ``config.speculation``
    mean what ``--gamma`` and ``--speculation`` do (``gamma.resolve_gamma``); ``pricer``: the γ policy's margin
    and cost book."""
    config = resolve_api_key(config, {})  # a key file given to the config is read here, never ignored
    # unset --speculation follows --gamma (auto: adaptive, N: fixed); set here so every reader sees it
    adaptive = resolve_gamma(default_gamma, "auto", speculation_flag(config.speculation)).adaptive
    config = replace(config, speculation="auto" if adaptive else "always")
    default_drafter = default_drafter or PAIRED_DEFAULT
    opts = DrafterOptions(draft=draft_model, gamma="auto", vocab=draft_vocab, options=dict(options or {}),
                          artifacts=dict(artifacts or {}))
    default = get_spec(default_drafter)
    why = missing(default_drafter, opts)
    if why is not None:
        raise ConfigError(f"default {why}")
    # a draft with another tokenizer serves only the drafters that re-tokenize; the rest run without it
    other_vocab = draft_model is not None and not shares_vocabulary(draft_model, target)
    if draft_model is not None and other_vocab and default.needs_draft_model and not default.own_tokenizer:
        own = ", ".join(n for n, sp in REGISTRY.items() if sp.own_tokenizer)
        raise ConfigError(f"the draft {draft_model.path} has another tokenizer than the target, so default drafter "
                          f"{default_drafter!r} cannot use it; serve it with --drafter {own}")
    drafters = {}
    for name, spec in REGISTRY.items():
        o = replace(opts, draft=None) if other_vocab and not spec.own_tokenizer else opts
        if spec.missing(o) is not None:
            continue
        built = spec.build(with_defaults(o))
        if built is not None:
            drafters[name] = built
    metrics = ServerMetrics()
    scheduler = Scheduler(target, drafters, max_batch_size=config.max_batch_size, max_queue=config.max_queue,
                          max_context=config.max_context, metrics=metrics,
                          prepare=[default_drafter] if default_drafter in drafters else [],
                          prepare_in_background=prepare_in_background, threads=config.threads,
                          pricer=pricer)
    chat = ChatFormatter.for_model(target)  # a loaded model: a GGUF carries its template in its metadata
    name = model_name or target.name
    return ServerState(scheduler, metrics, config, name, chat, chat.source != PLAIN_TEMPLATE,
                       default_drafter, default_gamma, now(), max_token_chars(target),
                       served_names(target, name, aliases))


def served_names(target: "Model", model_name: str, aliases: Sequence[str] = ()) -> tuple[str, ...]:
    """The names a request's ``model`` may give: the served name, the model file's name, ``aliases`` (the
    ``--target`` name it was loaded by) and the catalogue's name for that file (the name ``specdecode
    pull`` takes), so a client may say either ``smollm2-135m-instruct`` or ``SmolLM2-135M-Instruct.Q4_1.gguf``."""
    file = Path(str(target.path)).name
    names = [model_name, file, *aliases, *(e.name for e in CATALOG.values() if e.filename == file)]
    return tuple(dict.fromkeys(n for n in names if n))


def max_token_chars(target: "Model") -> int:
    """Characters in the longest vocabulary entry (0 without a tokenizer): bounds tokens from below by length."""
    tok = target.tokenizer
    if tok is None:
        return 0
    return max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=0)
