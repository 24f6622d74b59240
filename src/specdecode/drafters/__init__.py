"""Drafters: everything that proposes tokens for the target to verify, behind one protocol."""

from .base import Draft, DraftContext, Drafter, VocabularyMismatchError
from .model import DraftModelDrafter, check_vocab_compatible
from .ngram import PromptLookupDrafter

__all__ = ["Draft", "DraftContext", "Drafter", "DraftModelDrafter", "PromptLookupDrafter",
           "VocabularyMismatchError", "check_vocab_compatible"]
