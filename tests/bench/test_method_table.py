"""The bench's method table, derived from the drafters' own families plus the bench's comparisons, is the
table the drafters used to declare knob by knob (snapshot taken before the comparisons moved to
``bench/ours.py``): the same names in the same order, the same defaults, companions, sweeps and knobs,
so ``--methods`` and its help read as before."""

from __future__ import annotations

import pytest

from specdecode.bench.ours import BenchFamily, bench_families, method_name
from specdecode.bench.runners import default_methods, method_table
from specdecode.config import VerifyConfig
from specdecode.drafters import BenchVariant
from specdecode.drafters.registry import REGISTRY

# family: (runtime, sweep, default, with_auto, with_sampling), in --methods order
TABLE = {
    "plain": ("specdecode", "none", True, None, None),
    "eager-plain": ("specdecode", "none", True, None, None),
    "auto": ("specdecode", "none", False, None, None),
    "crosstok": ("specdecode", "gammas", False, None, None),
    "eagle": ("specdecode", "none", False, None, None),
    "layerskip-adapter": ("specdecode", "gammas", False, "layerskip-adapter-auto", None),
    "layerskip-adapter-auto": ("specdecode", "none", False, None, None),
    "layerskip": ("specdecode", "gammas", False, "layerskip-auto", None),
    "layerskip-auto": ("specdecode", "none", False, None, None),
    "medusa": ("specdecode", "none", False, None, None),
    "medusa-chain": ("specdecode", "none", False, None, None),
    "draft": ("specdecode", "gammas", True, "draft-auto", "draft-token"),
    "draft-token": ("specdecode", "gammas", False, None, None),
    "draft-coupled": ("specdecode", "gammas", False, None, None),
    "draft-auto": ("specdecode", "none", True, None, None),
    "draft-fullvocab": ("specdecode", "gammas", False, None, None),
    "eager-draft": ("specdecode", "peer_gammas", False, None, None),
    "lookup": ("specdecode", "lookup_tokens", True, None, None),
    "quant": ("specdecode", "gammas", False, "quant-auto", None),
    "quant-auto": ("specdecode", "none", False, None, None),
    "suffix": ("specdecode", "none", False, None, None),
    "hf-plain": ("transformers", "none", True, None, None),
    "hf-assisted": ("transformers", "peer_gammas", True, None, None),
    "hf-assisted-auto": ("transformers", "none", False, None, None),
    "hf-lookup": ("transformers", "lookup_tokens", True, None, None),
}
DEFAULTS = ("plain", "eager-plain", "draft", "draft-auto", "lookup", "hf-plain", "hf-assisted", "hf-lookup")
BLOCK, AUTO = VerifyConfig(accept_rule="rejection"), VerifyConfig()
# family: (drafter, name with no setting, name at setting 3, verify, sampled_only, eager, vocab, history)
KNOBS = {
    "plain": ("none", "plain", "plain/g3", AUTO, False, False, None, False),
    "eager-plain": ("none", "eager-plain", "eager-plain/g3", AUTO, False, True, None, False),
    "auto": ("auto", "auto", "auto/g3", AUTO, False, False, None, True),
    "crosstok": ("crosstok", "crosstok", "crosstok/g3", AUTO, False, False, None, False),
    "eagle": ("eagle", "eagle", "eagle/g3", AUTO, False, False, None, False),
    "layerskip-adapter": ("layerskip-adapter", "layerskip-adapter", "layerskip-adapter/g3", AUTO, False, False, None,
                          False),
    "layerskip-adapter-auto": ("layerskip-adapter", "layerskip-adapter/auto", "layerskip-adapter/auto/g3", AUTO,
                               False, False, None, False),
    "layerskip": ("layerskip", "layerskip", "layerskip/g3", AUTO, False, False, None, False),
    "layerskip-auto": ("layerskip", "layerskip/auto", "layerskip/auto/g3", AUTO, False, False, None, False),
    "medusa": ("medusa", "medusa", "medusa/g3", AUTO, False, False, None, False),
    "medusa-chain": ("medusa-chain", "medusa-chain", "medusa-chain/g3", AUTO, False, False, None, False),
    "draft": ("model", "draft", "draft/g3", BLOCK, False, False, None, False),
    "draft-token": ("model", "draft-token", "draft-token/g3", VerifyConfig(chain_rule="token", accept_rule="rejection"),
                    True, False, None, False),
    "draft-coupled": ("model", "draft-coupled", "draft-coupled/g3", VerifyConfig(accept_rule="coupled"), True, False,
                      None, False),
    "draft-auto": ("model", "draft/auto", "draft/auto/g3", AUTO, False, False, None, False),
    "draft-fullvocab": ("model", "draft-fullvocab", "draft-fullvocab/g3", AUTO, False, False, "full", False),
    "eager-draft": ("model", "eager-draft", "eager-draft/g3", AUTO, False, True, None, False),
    "lookup": ("ngram", "lookup", "lookup/k3", AUTO, False, False, None, False),
    "quant": ("quant", "quant", "quant/g3", AUTO, False, False, None, False),
    "quant-auto": ("quant", "quant/auto", "quant/auto/g3", AUTO, False, False, None, False),
    "suffix": ("suffix", "suffix", "suffix/g3", AUTO, False, False, None, True),
}
# the drafters' own families' help, unchanged (the derived ones are worded by the bench)
OWN_HELP = {
    "plain": "our decode loop with no drafter: the baseline",
    "draft": "draft model, γ from --gammas (sampled chains: block verification, the default rule)",
    "lookup": "prompt lookup, k from --lookup-tokens",
}


def test_the_method_table_is_the_snapshot() -> None:
    table = method_table()
    assert list(table) == list(TABLE)
    assert {f: (s.runtime, s.sweep, s.default, s.with_auto, s.with_sampling) for f, s in table.items()} == TABLE
    assert default_methods() == DEFAULTS
    for family, help in OWN_HELP.items():
        assert table[family].help == help
    assert all(s.help for s in table.values())


def test_the_methods_knobs_are_the_snapshot() -> None:
    got = {b.family: (b.drafter, method_name(b, None), method_name(b, 3), b.verify, b.sampled_only, b.eager, b.vocab,
                      b.history) for b in bench_families()}
    assert got == KNOBS


def test_each_drafter_declares_one_family_of_its_own_facts() -> None:
    """The comparisons are the bench's: a drafter's spec names one family, its size knob and history."""
    assert all(len(s.bench) <= 1 for s in REGISTRY.values())
    assert {f.name for f in BenchVariant.__dataclass_fields__.values()} == {"family", "help", "sweep", "history"}


def test_every_drafters_family_is_a_method() -> None:
    """Conformance: every registered drafter that declares a family is in the table, under its own name."""
    table = method_table()
    own = [v.family for s in REGISTRY.values() for v in s.bench]
    assert own and set(own) <= set(table)
    assert {b.drafter for b in bench_families()} == {n for n, s in REGISTRY.items() if s.bench}


def test_a_drafters_size_knob_is_checked_where_declared() -> None:
    with pytest.raises(ValueError, match="sweep must be one of"):
        BenchVariant("x", "x", sweep="peer_gammas")


def test_comparisons_follow_the_drafters_facts() -> None:
    """A new γ-swept drafter gets its gamma='auto' companion; one with its own tokenizer does not."""
    from specdecode.bench.ours import derive
    from specdecode.drafters.plugin import DrafterSpec

    def families(own_tokenizer: bool) -> list[BenchFamily]:
        spec = DrafterSpec("new", "a new drafter", lambda o: None, needs_draft_model=own_tokenizer,
                           own_tokenizer=own_tokenizer, bench=(BenchVariant("new", "h", "gammas"),))
        return list(derive(spec, spec.bench[0]))

    shared = families(own_tokenizer=False)
    assert [b.family for b in shared] == ["new", "new-auto"] and shared[0].with_auto == "new-auto"
    assert [(b.label, b.sweep, b.default) for b in shared] == [("new", "gammas", False), ("new/auto", "none", False)]
    assert [b.family for b in families(own_tokenizer=True)] == ["new"]
