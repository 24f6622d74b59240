"""Model runtime: our own PyTorch implementations of the supported HF architectures."""

from .config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from .loading import ForwardOutput, Model, ModelNotFoundError, load_model

__all__ = ["ForwardOutput", "Model", "ModelConfig", "ModelNotFoundError", "SUPPORTED_ARCHITECTURES",
           "UnsupportedModelError", "load_model"]
