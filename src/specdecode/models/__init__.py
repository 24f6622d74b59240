"""Model runtime: our own PyTorch implementations of the supported HF architectures."""

from .config import SUPPORTED_ARCHITECTURES, ModelConfig, ModelNotFoundError, UnsupportedModelError
from .loading import load_model
from .model import ForwardOutput, Model

__all__ = ["ForwardOutput", "Model", "ModelConfig", "ModelNotFoundError", "SUPPORTED_ARCHITECTURES",
           "UnsupportedModelError", "load_model"]
