"""specdecode: exact speculative decoding for Hugging Face checkpoints.

    import specdecode
    target = specdecode.load_model("path/to/hf-dir")          # the C++ fast path on the CPU; fast=False: eager
    draft = specdecode.load_model("path/to/small-hf-dir")
    r = specdecode.generate(target, "def fib(n):", drafter=specdecode.DraftModelDrafter(draft, gamma=4))
    r.token_ids, r.text, r.stats
"""

from .cache import ContextLengthError, KVCache
from .config import ConfigError, GenerationConfig, SamplingConfig, VerifyConfig
from .draft import Draft, DraftContext
from .drafters import (BatchDrafter, BatchDrafterBase, Drafter, DrafterOptions, DraftModelDrafter, EagleDrafter,
                       ExitAdapterDrafter, LayerSkipDrafter, MedusaDrafter, PromptLookupDrafter, QuantDrafter,
                       SuffixDrafter, VocabularyMismatchError, build_drafter, drafter_names)
from .core import DecodeCore
from .rows import FinishEvent, Request, StepEvent
from .engine import GenerationResult, generate, stream
from .metrics import GenerationStats
from .models import Model, ModelNotFoundError, UnsupportedModelError, load_model

__version__ = "0.1.0"

__all__ = [
    "BatchDrafter", "BatchDrafterBase",
    "ConfigError", "ContextLengthError", "DecodeCore", "Draft", "DraftContext", "DraftModelDrafter",
    "Drafter", "DrafterOptions", "EagleDrafter", "ExitAdapterDrafter", "FinishEvent", "GenerationConfig",
    "GenerationResult",
    "GenerationStats", "KVCache", "LayerSkipDrafter", "MedusaDrafter", "Model", "ModelNotFoundError",
    "PromptLookupDrafter", "QuantDrafter", "Request", "SamplingConfig", "StepEvent", "SuffixDrafter",
    "UnsupportedModelError", "VerifyConfig", "VocabularyMismatchError", "build_drafter", "drafter_names", "generate",
    "load_model", "stream",
]
