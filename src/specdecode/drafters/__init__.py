"""Drafters: everything that proposes tokens for the target to verify, behind one protocol."""

from .base import (Acceptance, BatchDrafter, BatchDrafterBase, Drafter, PerRowDrafters, VocabularyMismatchError,
                   as_batch_drafter)
from .model import DraftModelDrafter, check_vocab_compatible
from .layerskip import DraftLayers, LayerSkipDrafter
from .eagle import EagleDrafter
from .exit_adapter import ExitAdapterDrafter
from .medusa import MedusaDrafter
from .ngram import PromptLookupDrafter
from .quant import QuantDrafter
from .suffix import SuffixDrafter
from .plugin import Artifact, AutoMember, BenchVariant, Option
from .registry import DrafterOptions, DrafterSpec, build_drafter, drafter_names, register

__all__ = ["Acceptance", "Artifact", "AutoMember", "BatchDrafter", "BatchDrafterBase", "BenchVariant",
           "DraftModelDrafter", "Drafter", "DrafterOptions", "DrafterSpec", "DraftLayers", "EagleDrafter",
           "ExitAdapterDrafter", "LayerSkipDrafter", "MedusaDrafter", "Option", "PerRowDrafters",
           "PromptLookupDrafter", "QuantDrafter", "SuffixDrafter",
           "VocabularyMismatchError", "as_batch_drafter",
           "build_drafter", "check_vocab_compatible", "drafter_names", "register"]
