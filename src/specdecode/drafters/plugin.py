"""What a drafter module declares to plug in (``SPECS = (DrafterSpec(...),)`` at its end).

A spec holds everything the rest of the program needs to know about one drafter: its options
(typed, with help and a default), the trained artifacts it needs and how they are found, how it is
built, its own error text, how ``auto`` may use it and its benchmark family. ``registry.py``
collects the specs; the command-line flags, the server's drafters, the bench's methods and auto's
members are derived from them, so adding a drafter is one module. What the cost model times for a
drafter is not in the spec but on the drafter itself, where the state to time lives: it declares a
``sizing.book.CostSpec`` (a chain drafter's ``chain_spec`` of its draft model or layers, a tree
drafter's own steps), and the cost book (``sizing/book.py``) runs the one timer and cache.

Artifacts resolve in one order for every drafter (``resolve_artifacts``): an explicit flag; else
the shared ``--heads DIR`` when that directory holds this kind; else beside the target, in
``TARGET/drafters/<artifact>/`` (TARGET: the target's folder, a GGUF file's folder, or for a
catalogued model name ``models/<name>/``); else, with the bundled target only, the artifact's
bundled folder (``models/code-medusa`` ...), where the bundled ones lived before the convention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from ..config import ConfigError
from .base import BatchDrafter, Gamma
from .vocab import VocabSpec

if TYPE_CHECKING:
    from ..models import Model

SHARED_ARTIFACT_FLAG = "--heads"  # one directory of any kind, told apart by its contents (generate's habit)
SWEEPS = ("none", "gammas", "lookup_tokens")  # a drafter's size knob in the bench: none (γ 'auto'), γ, lookup k


@dataclass(frozen=True)
class Option:
    """One drafter-specific knob. It becomes the command-line flag(s) ``flags`` (default: ``--key``
    with dashes) for generate, serve and bench, and ``DrafterOptions.options[key]``."""

    key: str
    parse: Callable[[str], object]  # text -> value (argparse's ``type``)
    default: object
    help: str
    flags: tuple[str, ...] = ()
    metavar: Optional[str] = None

    @property
    def flag_names(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.key.replace("_", "-"),)


@dataclass(frozen=True)
class Artifact:
    """A trained directory a drafter needs. ``name`` is its folder beside the target
    (``TARGET/drafters/<name>/``) and its key in ``DrafterOptions.artifacts``."""

    name: str
    what: str  # "a Medusa heads directory": for "--flag DIR: not <what>"
    needs: str  # "Medusa heads": for "drafter 'x' needs <needs> (--heads DIR)"
    train: str  # the command that writes one
    accepts: Callable[[Path], bool]  # does this directory hold one
    flag: str  # its own flag (serve loads every kind at once, so each has one)
    bundled: Optional[str] = None  # legacy: the bundled target's copy in models/<bundled>
    required: bool = True  # False: the drafter runs without it (layer skip uncalibrated) and uses it when found


@dataclass(frozen=True)
class BenchVariant:
    """The bench's method family for a drafter: only what the drafter knows about itself. The
    comparisons the bench runs beside it (verification rules, ablations, the gamma='auto' companion,
    the default set) are the bench's, applied to every drafter that fits (``bench/ours.py``)."""

    family: str  # the method's name in --methods
    help: str
    sweep: str = "none"  # which settings list sizes it (SWEEPS), a method built per value; "none": one, γ 'auto'
    history: bool = False  # remembers earlier requests: forgets when a prompt comes round again

    def __post_init__(self) -> None:
        if self.sweep not in SWEEPS:
            raise ValueError(f"bench family {self.family!r}: sweep must be one of {SWEEPS}, got {self.sweep!r}")


@dataclass(frozen=True)
class AutoMember:
    """How ``auto`` may use a drafter: ``rank`` orders members (lower first on ties)."""

    rank: int
    only_without_draft_model: bool = False  # left out when a draft model is a member
    usable: Optional[Callable[[BatchDrafter, "DrafterOptions"], bool]] = None  # checked after prepare_rows
    fits: Optional[Callable[["Model"], bool]] = None  # checked before prepare_rows: False, never worth preparing


@dataclass(frozen=True)
class DrafterOptions:
    """What a registered drafter is built from: the shared knobs, the declared options by key
    (absent: the declared default) and the resolved artifact directories by artifact name."""

    draft: Optional["Model"] = None  # a separate draft model (shared by the drafters that take one)
    gamma: Gamma = "auto"
    vocab: VocabSpec = "auto"  # a draft model's proposal vocabulary (FR-Spec)
    options: Mapping[str, object] = field(default_factory=dict)
    artifacts: Mapping[str, str] = field(default_factory=dict)

    def artifact(self, name: str) -> Optional[str]:
        return self.artifacts.get(name)


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    help: str  # one line for --help and the server's error messages
    build: Callable[[DrafterOptions], Optional[BatchDrafter]]  # None: plain decoding
    needs_draft_model: bool = False
    uses_draft_model: bool = False  # takes a draft model when there is one (auto): the CLI loads the bundled one
    own_tokenizer: bool = False  # takes a draft model whose tokenizer differs from the target's
    options: tuple[Option, ...] = ()
    artifacts: tuple[Artifact, ...] = ()  # required unless the artifact says otherwise
    auto: Optional[AutoMember] = None
    bench: tuple[BenchVariant, ...] = ()

    def missing(self, o: DrafterOptions, alternatives: str = "") -> Optional[str]:
        """Why this drafter cannot be built from ``o`` (None: it can), in its own words."""
        if self.needs_draft_model and o.draft is None:
            return f"drafter {self.name!r} needs a draft model (--draft DIR){alternatives}"
        for a in self.artifacts:
            if a.required and o.artifact(a.name) is None:
                return (f"drafter {self.name!r} needs {a.needs} ({SHARED_ARTIFACT_FLAG} DIR); or {a.flag} DIR, or "
                        f"put it in TARGET/drafters/{a.name}/; train one with `{a.train}`")
        return None

    def check(self, o: DrafterOptions, alternatives: str = "") -> None:
        why = self.missing(o, alternatives)
        if why is not None:
            raise ConfigError(why)


def has_file(name: str) -> Callable[[Path], bool]:
    """An ``Artifact.accepts`` for a kind whose directory holds a file called ``name``."""
    return lambda path: (path / name).is_file()
