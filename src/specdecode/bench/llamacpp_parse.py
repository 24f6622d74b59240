"""Reading llama.cpp's output: ``llama-bench -o json`` and ``llama-speculative-simple``'s closing summary.

Kept apart from the runners in ``llamacpp.py`` because these are pure text parsers, tested on recorded output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


class LlamaCppError(RuntimeError):
    """llama.cpp failed or printed something we cannot read; the message carries its output's tail."""


class LlamaCppSummaryLost(LlamaCppError):
    """A run exited cleanly but its closing summary never reached the output."""




@dataclass(frozen=True)
class BenchSample:
    """One llama-bench test: a prefill of ``n_prompt`` tokens then ``n_gen`` generated, per repetition."""

    n_prompt: int
    n_gen: int
    samples_ns: tuple[int, ...]
    n_threads: int
    model_type: str


def output_tail(text: str, n: int = 800) -> str:
    return text[-n:].strip()


def parse_llama_bench_json(text: str) -> list[BenchSample]:
    """``llama-bench -o json`` stdout: a JSON array of tests (log lines before it are skipped)."""
    start = text.find("[")
    while start >= 0:
        try:
            tests, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            start = text.find("[", start + 1)
            continue
        if isinstance(tests, list) and all(isinstance(t, dict) for t in tests):
            try:
                return [BenchSample(int(t["n_prompt"]), int(t["n_gen"]), tuple(int(x) for x in t["samples_ns"]),
                                    int(t.get("n_threads", 0)), str(t.get("model_type", ""))) for t in tests]
            except (KeyError, TypeError, ValueError) as e:
                raise LlamaCppError(f"llama-bench JSON lacks {e}: {output_tail(text)}") from None
        start = text.find("[", start + 1)
    raise LlamaCppError(f"no llama-bench JSON results in its output: {output_tail(text)}")


@dataclass(frozen=True)
class SpecResult:
    """What llama-speculative-simple reports at the end of a run."""

    n_input: int  # prompt tokens, as llama.cpp tokenised our text
    encode_s: float
    n_predict: int  # tokens generated
    decode_s: float
    n_drafted: int
    n_accept: int

    @property
    def seconds(self) -> float:
        return self.encode_s + self.decode_s

    @property
    def passes(self) -> int:
        """Target passes: each emits its accepted draft tokens plus one of its own."""
        return self.n_predict - self.n_accept


_NUM = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"
_SPEC_PATTERNS = {
    "encoded": re.compile(r"encoded\s+([0-9]+)\s+tokens\s+in\s+" + _NUM + r"\s+seconds"),
    "decoded": re.compile(r"decoded\s+([0-9]+)\s+tokens\s+in\s+" + _NUM + r"\s+seconds"),
    "n_drafted": re.compile(r"n_drafted\s*=\s*([0-9]+)"),
    "n_accept": re.compile(r"n_accept\s*=\s*([0-9]+)"),
}


def parse_speculative(text: str) -> SpecResult:
    """The summary block of ``llama-speculative-simple`` (stdout and stderr together); the last match of
    each line wins, so generated text that happens to contain the same words cannot fool it."""
    found: dict[str, tuple[str, ...]] = {}
    for key, pat in _SPEC_PATTERNS.items():
        matches = pat.findall(text)
        if not matches:
            raise LlamaCppSummaryLost(f"llama-speculative-simple printed no '{key}' line: {output_tail(text)}")
        last = matches[-1]
        found[key] = last if isinstance(last, tuple) else (last,)
    return SpecResult(n_input=int(found["encoded"][0]), encode_s=float(found["encoded"][1]),
                      n_predict=int(found["decoded"][0]), decode_s=float(found["decoded"][1]),
                      n_drafted=int(found["n_drafted"][0]), n_accept=int(found["n_accept"][0]))
