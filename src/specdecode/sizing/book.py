"""The one cost book: one key, one on-disk cache, one way to fetch a drafter's costs.

A drafter never times or caches anything itself: it declares a ``CostSpec`` (what else its figures
depend on, and the steps to time on a miss) and ``get_costs`` returns the cached ``Costs`` or
measures them once, quickly (``QUICK_REPS`` rounds, the minimum of each: load only adds time, and the
γ policy corrects what a few samples miss from the live passes), and keeps them. Live corrections
come back through ``store_costs`` under the same key, so the next start begins from them.

- a chain drafter (a draft model, a layer-skip exit, the int4 copy) declares ``chain_spec``;
- a drafter that times its own steps (Medusa's and EAGLE's trees) declares a ``CostSpec`` whose
  ``steps`` builds its ``CostSteps``; with ``CostSteps.target_v`` the wider passes are the target's
  shared figures (``target_spec``), so each tree drafter times only its one-token pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from ..kernels import kernel_streams
from .costs import MAX_GAMMA, Costs, CostSteps, chain_steps, measure_steps

if TYPE_CHECKING:
    from ..models import Model

QUICK_REPS = 3  # timed rounds of the first-start measurement (the policy refines it from live passes)
QUICK_WARMUP = 0  # its untimed rounds: none, its minimum already drops a slow first call (w1 and w0 agree)
QUICK_WIDTHS = (1, 2, 4, 8, 16)  # widths it times; the others interpolated (SmolLM2: within 3.2% VNNI, 2.1% AVX2)
QUICK_DRAFT_RUNS = 8  # single draft steps it times per round: 24 samples, so some are clean of load
COST_FORMAT = 8  # part of every cache key: other schemes' files are ignored (8: refinements no longer compound)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CostSpec:
    """What a drafter hands the book. ``what``: everything beyond ``models`` that changes its figures
    (shape, run-time format, files); ``models``: the models whose files, dtypes and kernels do (the
    target first); ``steps``: the steps to time, built only on a cache miss. Or, instead of ``steps``,
    ``base``: another spec whose figures these start from, with ``adjust`` applied once before they are
    kept under this spec's own key (a step timed apart and folded into c), so live corrections of one
    never rewrite the other's."""

    what: str
    models: tuple[Optional["Model"], ...]
    steps: Optional[Callable[[], CostSteps]] = None
    base: Optional["CostSpec"] = None
    adjust: Optional[Callable[[Costs], Costs]] = None
    label: str = "a drafter's"  # whose steps, in the one line a measurement logs ("the target's")


def chain_spec(target: "Model", draft: Optional["Model"], draft_head: Optional[torch.Tensor] = None,
               draft_layers: Optional[tuple[int, ...]] = None, extra: str = "",
               label: str = "the draft chain's") -> CostSpec:
    """A chain drafter's spec: v(k) of ``target`` and c of ``draft`` (``draft_head``: its restricted output
    matrix; ``draft_layers``: the layers of ``draft`` a layer-skip step runs; ``extra``: anything else that
    changes the draft step; ``label``: whose steps, for the log). ``draft=None``: the target's own v(k),
    which every drafter shares."""
    what = f"draft_head={None if draft_head is None else tuple(draft_head.shape)}"
    if draft_layers is not None:
        what += f"|draft_layers={','.join(map(str, draft_layers))}"
    if extra:
        what += f"|{extra}"

    def steps() -> CostSteps:
        return chain_steps(target, draft, MAX_GAMMA, draft_head, None, draft_layers, QUICK_WIDTHS,
                           QUICK_DRAFT_RUNS, 1)

    return CostSpec(what, (target, draft), steps=steps, label="the target's" if draft is None else label)


def target_spec(target: "Model") -> CostSpec:
    """The target's own v(k) (c = 0): what the self-sizing drafters weigh widths with."""
    return chain_spec(target, None)


def get_costs(target: "Model", spec: CostSpec) -> Costs:
    """The one way to fetch costs: this process's copy, else the cache file, else measured on ``target``
    (minimum of ``QUICK_REPS`` rounds) and kept under the spec's key."""
    key = cost_key(spec.models, spec.what)
    costs = cached_costs(key)
    if costs is not None:
        return costs
    if spec.base is not None:
        costs = get_costs(target, spec.base)
    elif spec.steps is not None:
        t0 = time.perf_counter()
        steps = spec.steps()
        costs = measure_steps(steps, target, QUICK_REPS, min, QUICK_WARMUP)
        if steps.target_v:
            shared = get_costs(target, target_spec(target))
            costs = replace(costs, v=shared.v, measured=shared.measured,
                            target_s=tuple(costs.target_s[0] * v for v in shared.v))
        log.info("measured %s step costs in %.1f s (once per machine, model and drafter shape; refined from "
                 "the live passes)", spec.label, time.perf_counter() - t0)
    else:
        raise ValueError(f"cost spec {spec.what!r} names neither steps to time nor a base")
    if spec.adjust is not None:
        costs = spec.adjust(costs)
    costs = replace(costs, key=key)
    store_costs(costs)
    return costs


def cost_key(models: Sequence[Optional["Model"]], what: str = "") -> str:
    """The one cost cache key: ``what`` (the drafter's steps: shape, run-time format, files), machine,
    threads, torch, and per model its files (a GGUF file's size and date), dtypes, KV-cache dtype and
    kernels with their ISA (each model's own: an eager model and a fast one time differently)."""
    parts = [f"costs-v{COST_FORMAT}", what, platform.processor() or platform.machine(), cpu_name(),
             str(torch.get_num_threads()), torch.__version__, stream_layout(models)]
    for m in models:
        if m is None:
            parts.append("none")
            continue
        path = Path(m.path)
        weights = [path] if path.is_file() else sorted(path.glob("*.safetensors"))  # a GGUF file, or a directory
        stamp = ",".join(f"{w.name}:{w.stat().st_size}:{int(w.stat().st_mtime)}" for w in weights)
        parts += [str(path.resolve()), stamp, str(m.dtype), str(m.weight_dtype), str(m.device),
                  m.kernels.describe(), str(getattr(m, "kv_dtype", m.dtype))]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def stream_layout(models: Sequence[Optional["Model"]]) -> str:
    """The CPU kernels' weight-stream layouts for a decode step where a model runs them (the dense kernel's, and
    ``SPECDECODE_KERNEL_STREAMS``, which with the CPU's vendor sets the quantized kernel's): speed only, not bits,
    so part of the cost key and not of the kernels' label. Read only where the kernel is loaded already."""
    fast = [m for m in models if m is not None and m.kernels.fast]
    env = os.environ.get("SPECDECODE_KERNEL_STREAMS", "auto")
    own = ",".join(str(m.kernels.streams or kernel_streams()) for m in fast)  # a model's own choice, else the process's
    return f"streams {own}/{env}" if fast else "streams -"


def cpu_name() -> str:
    """The CPU's model name: part of the cost cache key, and recorded by the benchmark."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDECODE_CACHE", Path.home() / ".cache" / "specdecode")) / "costs"


_MEMO: dict[str, Costs] = {}


def cached_costs(key: str) -> Optional[Costs]:
    """The costs kept under ``key`` (this process's copy, else the cache file), or None."""
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / f"{key}.json"
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
        costs = Costs(c=float(d["c"]), v=tuple(float(x) for x in d["v"]),
                      target_s=tuple(float(x) for x in d.get("target_s", ())), draft_s=d.get("draft_s"),
                      context_len=int(d.get("context_len", 0)), repeats=int(d.get("repeats", 0)), key=key,
                      extras=tuple((str(k), float(x)) for k, x in d.get("extras", ())),
                      measured=tuple(float(x) for x in d.get("measured", ())))
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return None  # a corrupt cache file is re-measured
    if not sane_costs(costs):
        log.warning("cost cache file %s holds figures no measurement can give (NaN, infinite, negative); "
                    "measuring again", path)
        return None
    _MEMO[key] = costs
    return costs


def sane_costs(costs: Costs) -> bool:
    """Whether ``costs`` could come from a measurement: every figure finite (a NaN passes ``c < 0`` and then
    reaches /health's JSON), c >= 0, v(0) = 1 and v >= 1 (v is not monotonic: see ``Costs.from_times``),
    positive times."""
    figures = [costs.c, *costs.v, *costs.measured, *costs.target_s, *(x for _, x in costs.extras)]
    if costs.draft_s is not None:
        figures.append(costs.draft_s)
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in figures):
        return False
    measured_ok = not costs.measured or (len(costs.measured) == len(costs.v) and costs.measured[0] == 1.0
                                         and all(x >= 1.0 for x in costs.measured))
    return (bool(costs.v) and costs.v[0] == 1.0 and costs.c >= 0 and all(x >= 1.0 for x in costs.v) and measured_ok
            and all(t > 0 for t in costs.target_s) and (costs.draft_s is None or costs.draft_s > 0)
            and all(x >= 0 for _, x in costs.extras) and costs.context_len >= 0 and costs.repeats >= 0)


def store_costs(costs: Costs) -> None:
    """The one write-back: keep ``costs`` under its key, in this process and on disk (a read-only home
    only costs a re-measurement next time). Fresh measurements and live corrections both come here."""
    if not costs.key:
        return
    if not sane_costs(costs):  # never kept: a later start would read it back (cached_costs refuses it anyway)
        log.info("not caching costs no measurement can give (c=%r, v=%r)", costs.c, costs.v[:4])
        return
    _MEMO[costs.key] = costs
    try:
        path = cache_dir() / f"{costs.key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(costs), allow_nan=False))
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    except (OSError, ValueError):
        pass
