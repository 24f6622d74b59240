"""specdecode: exact speculative decoding for Hugging Face checkpoints.

    import specdecode
    target = specdecode.load_model("path/to/hf-dir")
    draft = specdecode.load_model("path/to/small-hf-dir")
    r = specdecode.generate(target, "def fib(n):", drafter=specdecode.DraftModelDrafter(draft, gamma=4))
    r.token_ids, r.text, r.stats
"""

from .cache import ContextLengthError, KVCache
from .config import ConfigError, GenerationConfig, SamplingConfig
from .drafters import Draft, DraftContext, Drafter, DraftModelDrafter, PromptLookupDrafter, VocabularyMismatchError
from .kernels import enable_fast_linear
from .engine import FinishEvent, GenerationResult, StepEvent, generate, stream
from .metrics import GenerationStats
from .models import Model, ModelNotFoundError, UnsupportedModelError, load_model

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "ContextLengthError", "Draft", "DraftContext", "DraftModelDrafter", "Drafter", "FinishEvent",
    "GenerationConfig", "GenerationResult", "GenerationStats", "KVCache", "Model", "ModelNotFoundError",
    "PromptLookupDrafter", "SamplingConfig", "StepEvent", "UnsupportedModelError", "VocabularyMismatchError",
    "enable_fast_linear", "generate", "load_model", "stream",
]
