"""Drafters by name: the specs every drafter module declares (``plugin.py``), collected in one table.

``generate``, ``serve``, ``bench`` and ``auto`` only iterate this table: the CLI's ``--drafter``
choices and its per-drafter flags, the server's drafters, the bench's methods and auto's members are
all derived from the specs, so adding a drafter is one module ending in ``SPECS = (DrafterSpec(...),)``
(found here by scanning the package) or one ``register(...)`` call anywhere.

**Flags: per-drafter groups derived from the declared options**, not a generic ``--drafter-opt k=v``.
Each ``Option`` becomes a typed flag in a ``--drafter NAME`` group of ``--help`` (its parser checks
the value when the command line is read, before any model loads, and ``--help`` shows its help and
default), and the flags users and docs already know (``--ngram-max``, ``--exit-layer``,
``--skip-layers``, serve's ``--medusa-heads``/``--eagle-draft``/``--exit-adapter``) are simply the
declared spellings, so nothing had to change for them. Each ``Artifact`` gets its own flag too, and
the shared ``--heads DIR`` stays as a documented alias that fills whichever kind the directory holds.
Options share one namespace: two drafters may declare the same key only with the same declaration.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import pkgutil
from pathlib import Path
from typing import Mapping, Optional

from ..bundled import DEFAULT_TARGET, default_model_dir
from ..config import ConfigError
from .base import BatchDrafter
from .plugin import SHARED_ARTIFACT_FLAG, Artifact, DrafterOptions, DrafterSpec, Option

__all__ = ["ALONE_DEFAULT", "PAIRED_DEFAULT", "PLAIN", "REGISTRY", "DrafterOptions", "DrafterSpec", "add_drafter_args",
           "all_artifacts", "all_options", "artifacts_from_args", "build_drafter", "drafter_names", "get_spec",
           "options_from_args", "register", "resolve_artifacts", "target_folder", "with_defaults"]

PLAIN = "none"  # plain decoding, no drafts
PAIRED_DEFAULT = "model"  # the default drafter with a draft model (the bundled pair)
ALONE_DEFAULT = "auto"  # the default drafter for a target without one (needs no artifact)

REGISTRY: dict[str, DrafterSpec] = {}


def register(spec: DrafterSpec) -> None:
    """Add a drafter; its options must not clash with another drafter's same-named option."""
    if spec.name in REGISTRY:
        raise ValueError(f"drafter {spec.name!r} is already registered")
    known = all_options()
    for o in spec.options:
        if o.key in known and known[o.key] != o:
            raise ValueError(f"drafter {spec.name!r}: option {o.key!r} is declared differently by another drafter")
    REGISTRY[spec.name] = spec


def drafter_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get_spec(name: str) -> DrafterSpec:
    if name not in REGISTRY:
        raise ConfigError(f"unknown drafter {name!r}; choose one of: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def all_options() -> dict[str, Option]:
    return {o.key: o for s in REGISTRY.values() for o in s.options}


def all_artifacts() -> dict[str, Artifact]:
    return {a.name: a for s in REGISTRY.values() for a in s.artifacts}


def with_defaults(o: DrafterOptions) -> DrafterOptions:
    """``o`` with every declared option present (the declared default where ``o`` has none)."""
    return dataclasses.replace(o, options={**{k: opt.default for k, opt in all_options().items()}, **o.options})


def _draft_free() -> str:
    return f"; or choose one of: {', '.join(n for n, s in REGISTRY.items() if not s.needs_draft_model)}"


def build_drafter(name: str, options: DrafterOptions) -> Optional[BatchDrafter]:
    """The named drafter (None for plain decoding); its own error when it lacks what it needs."""
    spec = get_spec(name)
    spec.check(options, _draft_free())
    return spec.build(with_defaults(options))


def missing(name: str, options: DrafterOptions) -> Optional[str]:
    """Why ``name`` cannot be built from ``options`` (None: it can)."""
    return get_spec(name).missing(options, _draft_free())


# -- artifacts -------------------------------------------------------------------------------------
def target_folder(target: Optional[str]) -> Optional[Path]:
    """Where a target's drafters live (in ``drafters/<artifact>/`` there): the bundled target's folder
    when ``target`` is None, a directory itself, a file's folder (GGUF), a catalogued name's
    ``models/<name>/``; None for anything else (a hub id)."""
    if target is None:
        return default_model_dir(DEFAULT_TARGET)
    path = Path(target).expanduser()
    if path.is_file():
        return path.parent
    if path.is_dir():
        return path
    from ..models.catalog import CATALOG

    return default_model_dir(target) if target in CATALOG else None


def draft_model_beside(target: str) -> Optional[Path]:
    """A draft model trained for ``target``: ``TARGET/drafters/model/`` when it holds a config.json."""
    folder = target_folder(target)
    place = folder / "drafters" / "model" if folder is not None else None
    return place if place is not None and (place / "config.json").is_file() else None


def resolve_artifacts(explicit: Mapping[str, Optional[str]], shared: Optional[str],
                      target: Optional[str]) -> dict[str, str]:
    """Every registered artifact this run has, by name (see ``plugin``'s docstring for the order):
    ``explicit`` (its own flag), ``shared`` (``--heads``: the kinds it holds), ``TARGET/drafters/<name>/``,
    the bundled folder when ``target`` is None (the bundled target)."""
    kinds = all_artifacts()
    found: dict[str, str] = {}
    if shared:
        held = [a for a in kinds.values() if a.accepts(Path(shared))]
        if not held:
            state = "does not exist" if not Path(shared).exists() else "holds no drafter artifact"
            raise ConfigError(f"{SHARED_ARTIFACT_FLAG} {shared} {state} (expected "
                              f"{' or '.join(a.what for a in kinds.values())}); train one with "
                              + " or ".join(f"`{a.train}`" for a in kinds.values()))
        found.update({a.name: str(shared) for a in held})
    folder = target_folder(target)
    for a in kinds.values():
        own = explicit.get(a.name)
        if own:
            if not a.accepts(Path(own)):
                raise ConfigError(f"{a.flag} {own}: not {a.what}; pass the directory `{a.train.split(' --target')[0]}` "
                                  f"wrote, or drop {a.flag}")
            found[a.name] = str(own)
            continue
        if a.name in found:
            continue
        places = [folder / "drafters" / a.name] if folder is not None else []
        if target is None and a.bundled:
            places.append(default_model_dir(a.bundled))
        for place in places:
            if a.accepts(place):
                found[a.name] = str(place)
                break
    return found


# -- command-line flags, derived -------------------------------------------------------------------
def artifact_dest(a: Artifact) -> str:
    return "artifact_" + a.name.replace("-", "_")


def add_drafter_args(p: argparse.ArgumentParser) -> None:
    """Every registered drafter's options and artifact flags, one group per drafter, plus ``--heads``."""
    seen: set[str] = set()
    for spec in REGISTRY.values():
        new_opts = [o for o in spec.options if o.key not in seen]
        new_arts = [a for a in spec.artifacts if a.name not in seen]
        if not new_opts and not new_arts:
            continue
        g = p.add_argument_group(f"--drafter {spec.name}")
        for o in new_opts:
            seen.add(o.key)
            g.add_argument(*o.flag_names, dest=o.key, type=o.parse, default=None, metavar=o.metavar,
                           help=o.help if o.default is None else f"{o.help} (default: {o.default})")
        for a in new_arts:
            seen.add(a.name)
            bundled = f"; the bundled target's: models/{a.bundled}" if a.bundled else ""
            g.add_argument(a.flag, dest=artifact_dest(a), default=None, metavar="DIR",
                           help=f"{a.what} (`{a.train}`; default: TARGET/drafters/{a.name}/{bundled})")
    arts = all_artifacts().values()
    p.add_argument(SHARED_ARTIFACT_FLAG, default=None, metavar="DIR",
                   help="a trained drafter directory of any kind, told apart by its contents ("
                        + ", ".join(f"{a.what}: {a.flag}" for a in arts) + ")")


def options_from_args(args: argparse.Namespace) -> dict[str, object]:
    """The declared options given on the command line (absent ones take their declared defaults)."""
    return {k: getattr(args, k) for k in all_options() if getattr(args, k, None) is not None}


def artifacts_from_args(args: argparse.Namespace) -> dict[str, str]:
    """The artifact directories the flags name or the target has beside it (``resolve_artifacts``)."""
    explicit = {a.name: getattr(args, artifact_dest(a), None) for a in all_artifacts().values()}
    return resolve_artifacts(explicit, getattr(args, "heads", None), getattr(args, "target", None))


# -- collection ------------------------------------------------------------------------------------
def _none(o: DrafterOptions) -> Optional[BatchDrafter]:
    return None


def _collect() -> None:
    """Register plain decoding, then every ``SPECS`` declared by a module of this package, in module order."""
    from .. import drafters
    from .plugin import BenchVariant

    register(DrafterSpec(PLAIN, "plain decoding (no drafts)", _none, bench=(
        BenchVariant("plain", "our decode loop with no drafter: the baseline"),)))
    for info in pkgutil.iter_modules(drafters.__path__):
        if info.name in ("registry", "plugin") or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{drafters.__name__}.{info.name}")
        for spec in getattr(module, "SPECS", ()):
            register(spec)


_collect()
