"""The conformance table: for every registered drafter, what a test must hand it (a draft model, tiny random
artifacts, options, γ). Adding a drafter is its module plus one line here; ``test_conformance`` checks
that the table and the registry list the same drafters.

Artifacts are random (no training): Medusa heads near the identity, an EAGLE-3 layer whose head is the
target's own output rows, an exit adapter with random output projections; drafts are then sometimes
accepted and sometimes rejected on the tiny models, which is what the suite needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

import specdecode as sd
from specdecode.drafters import DrafterOptions
from specdecode.drafters.base import Gamma

from specdecode.sizing.pricer import DEFAULT_PRICER, Pricer

from eagle_util import make_eagle
from medusa_util import make_heads
from pricing import FREE  # random heads and trees would never draft on the tiny target by measured costs


@dataclass(frozen=True)
class Needs:
    """What one drafter is built from in the suite (``draft``: use the suite's draft model)."""

    draft: bool = False
    artifacts: dict[str, Path] = field(default_factory=dict)
    options: dict[str, object] = field(default_factory=dict)
    gamma: Gamma = 2
    law_draft: Optional[Callable[[Path], Path]] = None  # its own draft for the law test (else the suite's)
    min_accepted: Optional[int] = None  # accepted draft tokens the law test needs (None: its default, N // 50)
    free: bool = False  # sizes its own drafts and needs ``FREE`` costs to draft at all on the tiny target
    cpu_fp32_only: bool = False  # runs on the CPU in fp32 only: elsewhere the suite checks its error instead

    @property
    def pricer(self) -> Pricer:
        """The pricer the suite runs this drafter with."""
        return FREE if self.free else DEFAULT_PRICER

    def options_for(self, draft: Optional[sd.Model]) -> DrafterOptions:
        return DrafterOptions(draft=draft if self.draft else None, gamma=self.gamma, options=self.options,
                              artifacts={k: str(v) for k, v in self.artifacts.items()})


def exit_adapter(out: Path, target: sd.Model, vocab: Optional[int] = None) -> Path:
    """A random exit adapter after the target's first layer (output projections not zero)."""
    from specdecode.drafters.exit_adapter import ExitAdapter, ExitAdapterConfig, save_adapter
    from specdecode.drafters.medusa_heads import describe_target

    g = torch.Generator().manual_seed(0)
    n = vocab or target.vocab_size
    a = ExitAdapter(ExitAdapterConfig.for_target(target, 1, 24, n), torch.arange(n), target.max_seq_len)
    with torch.no_grad():
        for p in (a.block.wo, a.block.w2):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    a.cfg.target = describe_target(target)
    return save_adapter(out, a.eval().requires_grad_(False))


def crosstok_law_draft(out: Path) -> Path:
    """A draft whose tokenizer merges the law target's character pairs (ab, cd, ...): every draft token is
    one or two target tokens after re-tokenization (tests/exactness/test_crosstok_law.py's toy pair)."""
    from exactness.test_crosstok_law import PAIRS, _write_tokenizer
    from exactness.test_generate_law import V
    from tiny import build_model

    d = build_model(out, "llama", vocab_size=V + len(PAIRS) + 1, tokenizer=False, hidden=16, layers=1, seed=23,
                    eos_token_id=V + len(PAIRS), bos_token_id=V + len(PAIRS))
    _write_tokenizer(d, PAIRS, special=True)
    return d


def make_store(out: Path, target: sd.Model) -> Path:
    """A suffix datastore of random token runs over the target's vocabulary: on a tiny vocabulary its short
    matches are everywhere, so drafts come from it (and are sometimes accepted) in every check."""
    from specdecode.drafters.suffix_store import save_store

    g = torch.Generator().manual_seed(5)
    docs = [torch.randint(0, target.vocab_size, (40,), generator=g).tolist() for _ in range(20)]
    return save_store(out, docs, target.vocab_size, {"source": "random (tests)"})


Kit = Callable[[sd.Model, Path], Needs]



TABLE: dict[str, Kit] = {
    "none": lambda t, tmp: Needs(),
    "model": lambda t, tmp: Needs(draft=True),
    "crosstok": lambda t, tmp: Needs(draft=True, law_draft=crosstok_law_draft),
    "ngram": lambda t, tmp: Needs(),
    "layerskip": lambda t, tmp: Needs(options={"exit_layer": 1}),
    "layerskip-adapter": lambda t, tmp: Needs(artifacts={"exit-adapter": exit_adapter(tmp / "adapter", t)}),
    "medusa": lambda t, tmp: Needs(artifacts={"medusa": make_heads(tmp / "heads", t.config.dim, t.vocab_size,
                                                                   num_heads=2, scale=0.3)}, gamma="auto", free=True),
    "medusa-chain": lambda t, tmp: Needs(artifacts={"medusa": make_heads(tmp / "heads", t.config.dim, t.vocab_size,
                                                                         num_heads=2, scale=0.3)},
                                         gamma="auto", free=True),
    "eagle": lambda t, tmp: Needs(artifacts={"eagle": make_eagle(tmp / "eagle", t, seed=3)}, gamma="auto", free=True),
    "suffix": lambda t, tmp: Needs(gamma="auto", artifacts={"suffix": make_store(tmp / "store", t)}, free=True),
    "quant": lambda t, tmp: Needs(cpu_fp32_only=True),  # the int8/int4 kernels: CPU, fp32 activations
    # auto drafts only where its live timings say a member pays, so on a loaded machine it may decode plainly
    # throughout: tests/exactness/test_suffix_law.py::test_auto_sampled_law_matches_target fixes members that draft
    "auto": lambda t, tmp: Needs(draft=True, gamma="auto", min_accepted=0),
}
