"""What the app serves from: the loaded models, their drafters, the scheduler and the flags.

``make_state`` builds every registered drafter that can run with what is loaded, each from its own
artifact (a Medusa heads, an EAGLE-3 draft and an exit adapter directory are separate options, so
giving one never unloads another).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..config import ConfigError
from .chat import PLAIN_TEMPLATE, ChatFormatter
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
    default_gamma: int
    created: int
    max_token_chars: int = 0  # longest vocabulary entry, for the early context-length check


def make_state(target: "Model", draft_model: Optional["Model"], config: ServerConfig, default_drafter: str = "model",
               default_gamma: int = 4, ngram_max: int = 3, ngram_min: int = 1,
               model_name: Optional[str] = None, draft_vocab: "VocabSpec" = "auto",
               exit_layer: Optional[int] = None, skip_layers: Optional[tuple[int, ...]] = None,
               heads: Optional[str] = None, eagle: Optional[str] = None,
               exit_adapter: Optional[str] = None, prepare_in_background: bool = False) -> ServerState:
    """Everything the app needs, from loaded models and the serving flags: every registered drafter
    that can run with what is loaded (a draft model's only when one is given; Medusa heads, an EAGLE-3
    draft and an exit adapter each from its own directory)."""
    from dataclasses import replace

    from ..drafters.crosstok import shares_vocabulary
    from ..drafters.registry import REGISTRY, DrafterOptions, exit_adapter_dir, get_spec

    config = resolve_api_key(config, {})  # a key file given to the config is read here, never ignored
    options = DrafterOptions(draft=draft_model, gamma="auto", vocab=draft_vocab, ngram_max=ngram_max,
                             ngram_min=ngram_min, exit_layer=exit_layer, skip_layers=skip_layers, heads=heads,
                             eagle=eagle, exit_adapter=exit_adapter)
    if get_spec(default_drafter).needs_draft_model and draft_model is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs a draft model; pass one or choose one of: "
                          f"{', '.join(n for n, sp in REGISTRY.items() if not sp.needs_draft_model)}")
    if get_spec(default_drafter).needs_eagle and eagle is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs an EAGLE-3 draft (--eagle-draft DIR); train one "
                          "with `specdecode distill --method eagle --target TARGET --out DIR`")
    if get_spec(default_drafter).needs_heads and heads is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs Medusa heads (--medusa-heads DIR); train them "
                          "with `specdecode distill --method medusa --target TARGET --out DIR`")
    if get_spec(default_drafter).needs_exit_adapter and exit_adapter_dir(options) is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs an exit adapter (--exit-adapter DIR); train "
                          "one with `specdecode distill --method early-exit --target TARGET --out DIR`")
    # a draft with another tokenizer serves only the drafters that re-tokenize (crosstok); the rest run without it
    other_vocab = draft_model is not None and not shares_vocabulary(draft_model, target)
    if other_vocab and get_spec(default_drafter).needs_draft_model and not get_spec(default_drafter).own_tokenizer:
        raise ConfigError(f"the draft {draft_model.path} has another tokenizer than the target, so default drafter "
                          f"{default_drafter!r} cannot use it; serve it with --drafter crosstok")
    drafters = {}
    for name, spec in REGISTRY.items():
        opts = replace(options, draft=None) if other_vocab and not spec.own_tokenizer else options
        if spec.needs_draft_model and opts.draft is None:
            continue
        built = spec.build(opts)
        if built is not None:
            drafters[name] = built
    metrics = ServerMetrics()
    scheduler = Scheduler(target, drafters, max_batch_size=config.max_batch_size, max_queue=config.max_queue,
                          max_context=config.max_context, metrics=metrics,
                          prepare=[default_drafter] if default_drafter in drafters else [],
                          prepare_in_background=prepare_in_background)
    chat = ChatFormatter.for_model(target)  # a loaded model: a GGUF carries its template in its metadata
    return ServerState(scheduler, metrics, config, model_name or target.name, chat, chat.source != PLAIN_TEMPLATE,
                       default_drafter, default_gamma, now(), max_token_chars(target))


def max_token_chars(target: "Model") -> int:
    """Characters in the longest vocabulary entry (0 without a tokenizer): bounds tokens from below by length."""
    tok = target.tokenizer
    if tok is None:
        return 0
    return max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=0)
