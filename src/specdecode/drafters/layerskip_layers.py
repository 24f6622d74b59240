"""Which of the target's layers a layer-skip draft runs (``DraftLayers``: an early exit or a skip set)
and the calibration files that record the best set per checkpoint (``specdecode calibrate`` writes
them beside the checkpoint, or in the cache directory). ``layerskip.py`` drafts with them."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..config import ConfigError
from ..sizing.book import cache_dir

if TYPE_CHECKING:
    from ..models import Model

log = logging.getLogger(__name__)

CALIBRATION_FILE = "layerskip.json"
CALIBRATION_VERSION = 1
SUPPORTED_FAMILIES = ("llama", "gpt2")  # the module families whose forward takes ``layers``


def check_family(target: "Model") -> None:
    """A ConfigError unless ``target``'s module can run a subset of its layers."""
    family = target.config.family
    if family not in SUPPORTED_FAMILIES:
        raise ConfigError(f"layer-skip drafting runs llama-family and gpt2 checkpoints, not {family!r}")


# -- which layers ------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftLayers:
    """The target's layers a draft runs (increasing), out of ``n_layers``."""

    layers: tuple[int, ...]
    n_layers: int
    copy: bool = False  # the layers are another copy of the target's (packed weights): all may run

    def __post_init__(self) -> None:
        n, ls = self.n_layers, self.layers
        if not ls or any(not 0 <= i < n for i in ls) or list(ls) != sorted(set(ls)):
            raise ConfigError(f"a layer-skip draft runs distinct increasing layers in 0..{n - 1}, got {list(ls)}")
        if len(ls) == n and not self.copy:
            raise ConfigError(f"a layer-skip draft must skip at least one of the {n} layers (else it is the target)")

    @classmethod
    def every(cls, n_layers: int) -> "DraftLayers":
        """Every layer, of a copy of the target's weights (the quantized self-draft)."""
        return cls(tuple(range(n_layers)), n_layers, copy=True)

    @classmethod
    def exit(cls, exit_layer: int, n_layers: int) -> "DraftLayers":
        """The first ``exit_layer`` layers, then the final norm and output layer."""
        if not 1 <= exit_layer < n_layers:
            raise ConfigError(f"exit layer must be in 1..{n_layers - 1} (the model has {n_layers} layers), "
                              f"got {exit_layer}")
        return cls(tuple(range(exit_layer)), n_layers)

    @classmethod
    def skip(cls, skipped: Sequence[int], n_layers: int) -> "DraftLayers":
        bad = [i for i in skipped if not 0 <= i < n_layers]
        if bad or not skipped:
            raise ConfigError(f"skip layers must be a non-empty set of layer numbers in 0..{n_layers - 1}, "
                              f"got {list(skipped)}")
        return cls(tuple(i for i in range(n_layers) if i not in set(skipped)), n_layers)

    @classmethod
    def default(cls, n_layers: int) -> "DraftLayers":
        """The uncalibrated choice: exit after three quarters of the layers (at least one skipped)."""
        if n_layers < 2:
            raise ConfigError("layer-skip drafting needs a target with at least 2 layers")
        return cls.exit(max(1, n_layers - max(1, n_layers // 4)), n_layers)

    @property
    def shared(self) -> int:
        """How many leading layers are the target's own computation (0..k-1 all run): the layers whose
        cache entries the draft can share."""
        k = 0
        while k < len(self.layers) and self.layers[k] == k:
            k += 1
        return k

    @property
    def is_exit(self) -> bool:
        return self.shared == len(self.layers)

    @property
    def skipped(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if i not in set(self.layers))

    def describe(self) -> str:
        if self.copy:
            return f"every layer of {self.n_layers}, a packed copy"
        if self.is_exit:
            return f"early exit after layer {len(self.layers)} of {self.n_layers}"
        return f"layers {','.join(map(str, self.skipped))} of {self.n_layers} skipped"

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "n_layers": self.n_layers, "kind": "exit" if self.is_exit else "skip",
                "exit_layer": len(self.layers) if self.is_exit else None, "skipped": list(self.skipped)}


# -- calibration files ---------------------------------------------------------------------------
def weights_stamp(model_dir: str | Path) -> str:
    """The checkpoint's weight files (a GGUF: the file) by name and size: a calibration made for other
    weights is stale."""
    path = Path(model_dir)
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    return ",".join(f"{f.name}:{f.stat().st_size}" for f in files)


def cached_calibration_path(model_dir: str | Path) -> Path:
    """Where a calibration goes when no folder beside the checkpoint can be written: the cache directory."""
    key = hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:16]
    return cache_dir().parent / "layerskip" / f"{key}.json"


def calibration_paths(model_dir: str | Path, folder: Optional[str | Path] = None) -> list[Path]:
    """Where a calibration is looked for, first match wins: ``folder`` (the ``layerskip`` artifact,
    ``TARGET/drafters/layerskip/``), beside a checkpoint directory, then the cache."""
    places = [Path(folder) / CALIBRATION_FILE] if folder is not None else []
    if Path(model_dir).is_dir():
        places.append(Path(model_dir) / CALIBRATION_FILE)
    return places + [cached_calibration_path(model_dir)]


def save_calibration(model_dir: str | Path, record: dict[str, Any], folder: Optional[str | Path] = None) -> Path:
    """Write ``record`` to the first place of ``calibration_paths`` that can be written (``folder`` is
    created); returns the path written."""
    record = {"version": CALIBRATION_VERSION, "weights": weights_stamp(model_dir), **record}
    text = json.dumps(record, indent=2) + "\n"
    *wanted, cached = calibration_paths(model_dir, folder)
    for path in wanted:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return path
        except OSError as e:
            log.info("cannot write %s (%s); trying the next place", path, e)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(text)
    return cached


def load_calibration(model_dir: str | Path, n_layers: int, folder: Optional[str | Path] = None
                     ) -> Optional[tuple[DraftLayers, dict[str, Any], Path]]:
    """The stored calibration for this checkpoint (its layers, the whole record, its path), or None.
    A file for other weights or another layer count is skipped with a log line."""
    stamp = weights_stamp(model_dir)
    for path in calibration_paths(model_dir, folder):
        if not path.is_file():
            continue
        try:
            rec = json.loads(path.read_text())
            layers = DraftLayers(tuple(int(i) for i in rec["layers"]), int(rec["n_layers"]))
        except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
            log.warning("ignoring unreadable layer-skip calibration %s: %s", path, e)
            continue
        if layers.n_layers != n_layers or rec.get("weights", stamp) != stamp:
            log.warning("ignoring layer-skip calibration %s: it was made for other weights; "
                        "run `specdecode calibrate --target %s` again", path, model_dir)
            continue
        return layers, rec, path
    return None
