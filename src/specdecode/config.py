"""Dataclass configs: the single source of defaults, validation and CLI flags.

Each field's ``metadata["help"]`` becomes the ``--help`` text of the flag that
``add_dataclass_args`` derives from it, so the CLI and the server can never
disagree with the library about a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, TypeVar


class ConfigError(ValueError):
    """A user-supplied value is invalid; the message names the value and the fix."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is drawn from logits (applied identically to target and draft)."""

    temperature: float = field(
        default=0.0, metadata=_help("sampling temperature; 0 means greedy (argmax) decoding")
    )
    top_k: Optional[int] = field(
        default=None, metadata=_help("keep only the k most likely tokens (applied after temperature)")
    )
    top_p: Optional[float] = field(
        default=None, metadata=_help("nucleus sampling: keep the smallest set with cumulative prob >= top_p")
    )
    min_p: Optional[float] = field(
        default=None, metadata=_help("drop tokens whose prob is below min_p times the top token's prob")
    )
    seed: Optional[int] = field(default=None, metadata=_help("random seed; the same seed reproduces a run"))

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or math.isnan(t) or t < 0 or math.isinf(t):
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ConfigError(f"top_k must be a positive integer or None to disable it, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1] or None to disable it, got {self.top_p!r}")
        if self.min_p is not None and not (isinstance(self.min_p, (int, float)) and 0.0 <= self.min_p <= 1.0):
            raise ConfigError(f"min_p must be in [0, 1] or None to disable it, got {self.min_p!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationConfig:
    """When generation stops."""

    max_new_tokens: int = field(default=128, metadata=_help("maximum number of tokens to generate"))
    ignore_eos: bool = field(default=False, metadata=_help("keep generating past the end-of-sequence token"))
    stop: tuple[str, ...] = field(default=(), metadata=_help("stop when the text contains this string (repeatable)"))

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop strings must be non-empty strings, got {self.stop!r}")


CHAIN_RULES = ("block", "token")  # verify.CHAIN_RULES maps the same names to the functions
ACCEPT_RULES = ("auto", "coupled", "rejection")  # VerifyConfig.accept_rule


@dataclass(frozen=True)
class VerifyConfig:
    """How a sampled draft is verified (greedy decoding ignores it: the argmax rule is the only one)."""

    chain_rule: str = field(default="block", metadata=_help(
        "verification rule for sampled chain drafts: block = block verification (Sun et al., arXiv:2403.10444), "
        "never fewer accepted tokens than token-by-token in expectation; token = token-by-token rejection "
        "sampling (Leviathan et al.). Both are exact"))
    accept_rule: str = field(default="auto", metadata=_help(
        "how sampled drafts are accepted: coupled = Gumbel-max coupling (Daliri et al., arXiv:2408.07978): each "
        "token is the target's own seeded draw and a draft token is kept when it equals it, so a seed gives the "
        "same text whatever the drafter, gamma or batch; rejection = rejection sampling (Leviathan/Chen token by "
        "token or block verification, per --chain-rule; SpecInfer for trees), which accepts more tokens; "
        "auto = coupled when a seed is given, else rejection. All are exact"))

    def __post_init__(self) -> None:
        if self.chain_rule not in CHAIN_RULES:
            raise ConfigError(f"chain_rule must be one of {', '.join(CHAIN_RULES)} (block is the default and "
                              f"never accepts fewer tokens), got {self.chain_rule!r}")
        if self.accept_rule not in ACCEPT_RULES:
            raise ConfigError(f"accept_rule must be one of {', '.join(ACCEPT_RULES)} (auto: coupled for seeded "
                              f"requests, rejection otherwise), got {self.accept_rule!r}")

    def coupled(self, sampling: SamplingConfig) -> bool:
        """Whether a request with these sampling settings draws by the Gumbel-max coupling."""
        if sampling.greedy:
            return False
        return self.accept_rule == "coupled" or (self.accept_rule == "auto" and sampling.seed is not None)


_DTYPE_NAMES = ("auto", "fp32", "float32", "bf16", "bfloat16", "fp16", "float16")

# How a checkpoint runs: ``ModelLoadConfig`` (the CLI's flags) and ``load_model`` (the library)
# both take their defaults from these, so the CLI and the Python API run the same way.
DEFAULT_DEVICE = "cpu"
DEFAULT_DTYPE = "auto"
DEFAULT_WEIGHT_DTYPE = "auto"
DEFAULT_FAST = True  # the small-M CPU kernel and fused decode ops (SPECDECODE_FAST_LINEAR=0 turns them off)
DEFAULT_MATMUL = "bf16"
MATMUL_MODES = ("bf16", "fp32")
DEFAULT_KV_DTYPE = "auto"
KV_DTYPE_NAMES = ("auto", "fp32", "fp16", "bf16")
DEFAULT_FIXED_ROWS = "auto"
DEFAULT_PACK_CACHE = True  # a GGUF's packed weights kept on disk and mapped at the next start


@dataclass(frozen=True)
class ModelLoadConfig:
    """Where and how a checkpoint is run."""

    device: str = field(default=DEFAULT_DEVICE, metadata=_help("torch device: cpu, cuda, cuda:0 ..."))
    dtype: str = field(default=DEFAULT_DTYPE,
                       metadata=_help("compute dtype: auto (fp32 on CPU, bf16 on CUDA), fp32, bf16, fp16"))
    weight_dtype: str = field(default=DEFAULT_WEIGHT_DTYPE, metadata=_help(
        "storage dtype of weight matrices: auto (a bf16 checkpoint stays bf16 under fp32 compute when the fast CPU "
        "kernel is on), same (= dtype), fp32, bf16, or int8 / int4: the layer matrices quantized at load to blocks "
        "of 32 with fp16 scales (llama.cpp's Q8_0 / Q4_0 math; CPU, fp32 activations, fast kernel)"))
    fast_linear: bool = field(default=DEFAULT_FAST, metadata=_help(
        "use the small-M CPU linear kernel and fused decode ops (compiled on first use; falls back to PyTorch "
        "if they cannot build)"))
    matmul: str = field(default=DEFAULT_MATMUL, metadata=_help(
        "how the fast kernel multiplies by bf16-stored weights (fp32 weights are unaffected): bf16 = round the "
        "activations to bf16 and sum exact products in fp32, as llama.cpp does for bf16 models (half the "
        "activation bytes; with AVX512_BF16 where vdpbf16ps keeps pace with FMA, about 2x the multiply-adds per "
        "cycle, so verifying several tokens costs little more than one; where it issues slower, as on some "
        "Intel Xeons, about the fp32 path's speed: scripts/cpu_dot_throughput.cpp tells which); "
        "fp32 = exact fp32 products (logits match transformers' fp32 run of the same weights)"))
    kv_dtype: str = field(default=DEFAULT_KV_DTYPE, metadata=_help(
        "storage dtype of the KV cache: auto (fp16 for Llama-family models on the fused CPU ops with fp32 "
        "activations, as llama.cpp's default; else the compute dtype), fp32, fp16 or bf16. Attention still "
        "computes in fp32; fp16 halves the cache's memory and the bytes a long-context decode step reads. "
        "Speculative and plain decoding share the cache, so their greedy outputs stay identical; fp32 keeps "
        "logits equal to transformers' fp32 run"))
    fixed_rows: str = field(default=DEFAULT_FIXED_ROWS, metadata=_help(
        "batch-invariant decoding: every pass of up to N new tokens runs padded to N rows and attends over the "
        "whole cache, so verifying k tokens rounds each one as k one-token passes would and greedy output stays "
        "identical to plain decoding. auto = 64 where the kernels are not batch-invariant themselves (CUDA; "
        "bf16/fp16 activations on the CPU), off on the CPU's fp32 path, whose kernels are; a number N; or off"))
    pack_cache: bool = field(default=DEFAULT_PACK_CACHE, metadata=_help(
        "keep a GGUF file's weights in the kernels' layout under $SPECDECODE_CACHE/packed (about the file's size "
        "on disk) and map them at the next start instead of repacking the file (a 1.7B Q8_0 file's first token: "
        "3.4 s to about 1.5 s); a changed file is repacked"))
    cuda_graphs: bool = field(default=False, metadata=_help(
        "replay each fixed-shape decode pass (--fixed-rows) as a CUDA graph: one launch instead of ~40 a layer. "
        "CUDA only; experimental: on an H200 its outputs were identical to eager passes, but it was no faster "
        "(docs/gpu.md; scripts/gpu_check.py measures it)"))

    def __post_init__(self) -> None:
        check_matmul(self.matmul)
        check_kv_dtype(self.kv_dtype)
        check_fixed_rows(self.fixed_rows)
        if self.dtype not in _DTYPE_NAMES:
            raise ConfigError(f"dtype must be one of auto, fp32, bf16, fp16; got {self.dtype!r}")
        check_weight_dtype(self.weight_dtype)


WEIGHT_DTYPE_NAMES = _DTYPE_NAMES + ("same", "int8", "int4")


def check_weight_dtype(weight_dtype: object) -> None:
    """Raise ``ConfigError`` unless ``weight_dtype`` names a weight storage (shared by the CLI and ``load_model``)."""
    if weight_dtype not in WEIGHT_DTYPE_NAMES:
        raise ConfigError(f"weight_dtype must be one of auto, same, fp32, bf16, fp16, int8, int4; got {weight_dtype!r}")


def check_kv_dtype(kv_dtype: object) -> None:
    """Raise ``ConfigError`` unless ``kv_dtype`` names a KV-cache storage (shared by the CLI and ``load_model``)."""
    if kv_dtype not in KV_DTYPE_NAMES:
        raise ConfigError(f"kv_dtype must be one of {', '.join(KV_DTYPE_NAMES)}; got {kv_dtype!r}")


def check_fixed_rows(fixed_rows: object) -> None:
    """Raise ``ConfigError`` unless ``fixed_rows`` is auto, off or a positive row count."""
    if fixed_rows in ("auto", "off", None) or (isinstance(fixed_rows, int) and fixed_rows > 0):
        return
    if isinstance(fixed_rows, str) and fixed_rows.isdigit() and int(fixed_rows) > 0:
        return
    raise ConfigError(f"fixed_rows must be auto, off or a positive number of rows; got {fixed_rows!r}")


def check_matmul(matmul: str) -> None:
    """Raise ``ConfigError`` unless ``matmul`` names a product mode (shared by the CLI and ``load_model``)."""
    if matmul not in MATMUL_MODES:
        raise ConfigError(f"matmul must be one of {', '.join(MATMUL_MODES)}; got {matmul!r}")


if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # the type checker's name for "a dataclass"

C = TypeVar("C", bound="DataclassInstance")


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one ``--flag`` per dataclass field, with its default and help text."""
    for f in dataclasses.fields(cls):
        name = "--" + prefix + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        default = f.default
        if f.type in ("bool", bool) and default:
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif f.type in ("bool", bool):
            parser.add_argument(name, action="store_true", default=default, help=help_text)
        elif f.name == "stop":
            parser.add_argument(name, action="append", default=None, help=help_text)
        else:
            parser.add_argument(name, type=_parse_type(f.type), default=default,
                                help=f"{help_text} (default: {default})")


def _parse_type(annotation: Any) -> Any:
    text = str(annotation)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


def from_args(cls: type[C], args: argparse.Namespace, prefix: str = "") -> C:
    """Build a dataclass from parsed flags; validation happens in ``__post_init__``."""
    values = {}
    for f in dataclasses.fields(cls):
        v = getattr(args, (prefix + f.name).replace("-", "_"))
        if f.name == "stop":
            v = tuple(v or ())
        values[f.name] = v
    return cls(**values)
