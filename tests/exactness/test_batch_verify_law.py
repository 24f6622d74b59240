"""The batched chain verifier (``verify_batch.verify_chains``) against the per-row reference rules and the laws.

Three kinds of evidence: row for row it returns what ``verify.block_verify`` / ``verify.rejection_sample`` return
for the same generator state (random laws, mixed batches); its emitted law is the target's (chi-square, with a
wrong law rejected); its one-step law is Algorithm 2's for block rows and token-by-token's for token rows."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from specdecode.config import SamplingConfig
from specdecode.verify import CHAIN_RULES, VerifyResult
from specdecode.verify_batch import ChainRow, verify_chains

from .chi2 import gof_pvalue
from .test_block_law import LENGTH, N, V, block_step_law, pair, simulate, step, token_step_law
from .test_rejection_law import SETTINGS


def batched(rule: str):
    """``verify_chains`` on one row, with a reference rule's call shape (for the law harness)."""
    def run(probs: torch.Tensor, tokens: torch.Tensor, draft_probs: Optional[torch.Tensor],
            generator: Optional[torch.Generator] = None) -> VerifyResult:
        return verify_chains([ChainRow(probs, tokens.tolist(), draft_probs, rule, generator)])[0]
    return run


def random_law(rows: int, v: int, g: torch.Generator, sparse: bool) -> torch.Tensor:
    """Random float32 laws [rows, v]; ``sparse``: some entries zero (filtered tokens)."""
    w = torch.rand(rows, v, generator=g) ** 3
    if sparse:
        w = w * (torch.rand(rows, v, generator=g) > 0.4)
        w[:, 0] += 0.05  # never an empty law
    return (w / w.sum(1, keepdim=True)).float()


@pytest.mark.parametrize("v", [6, 300])
def test_each_row_equals_the_reference_rule(v: int) -> None:
    """Mixed batches (block and token rows, sampled and deterministic drafters, lengths 0 to 6, drafts made
    likely or unlikely): each row's result is the reference's, drawn from a clone of the same generator."""
    g = torch.Generator().manual_seed(v)
    mismatches, rows_seen, kept = 0, 0, 0
    for trial in range(150):
        rows, refs = [], []
        for _ in range(int(torch.randint(1, 6, (1,), generator=g))):
            n = int(torch.randint(0, 7, (1,), generator=g))
            p = random_law(n + 1 + int(torch.randint(0, 3, (1,), generator=g)), v, g, sparse=trial % 2 == 0)
            q = random_law(n, v, g, sparse=trial % 3 == 0) if bool(torch.rand(1, generator=g) < 0.6) else None
            if q is not None and trial % 4 != 3:  # a target that resembles the draft: long acceptances
                p[:n] = 0.8 * q + 0.2 * p[:n]
            # draft tokens from q (likely under p too when p resembles q), else arbitrary
            if q is not None and n:
                tokens = torch.multinomial(q, 1, generator=g).view(-1).tolist()
            else:
                tokens = torch.randint(0, v, (n,), generator=g).tolist()
            rule = "block" if bool(torch.rand(1, generator=g) < 0.5) else "token"
            seed = int(torch.randint(0, 2**31, (1,), generator=g))
            rows.append(ChainRow(p, tokens, q, rule, torch.Generator().manual_seed(seed)))
            refs.append(CHAIN_RULES[rule](p, torch.tensor(tokens, dtype=torch.long), q,
                                          torch.Generator().manual_seed(seed)))
        for got, want in zip(verify_chains(rows), refs):
            rows_seen += 1
            kept += got.n_accepted
            mismatches += (got.n_accepted, got.next_token, got.bonus) != (want.n_accepted, want.next_token, want.bonus)
    assert mismatches == 0, f"{mismatches} of {rows_seen} rows differ from the reference"
    assert kept > rows_seen // 2  # the batches accepted tokens: the comparison covered acceptances


def test_coupled_rows_equal_the_reference_in_a_mixed_batch() -> None:
    """Coupled rows (seeded sampling) beside sampled ones: each is ``coupled_verify``'s result, and the sampled
    rows are still the reference's."""
    from specdecode.sampling import CoupledNoise
    from specdecode.verify import coupled_verify

    g = torch.Generator().manual_seed(9)
    v = 40
    for trial in range(60):
        rows, refs = [], []
        for k in range(4):
            n = int(torch.randint(0, 6, (1,), generator=g))
            p = random_law(n + 1, v, g, sparse=trial % 2 == 0)
            noise = CoupledNoise(trial * 10 + k, v)
            rates = noise.window(7, n + 1)
            draws = (p * rates).argmax(-1).tolist()  # a draft agreeing with the target's own draws for a while
            cut = int(torch.randint(0, n + 1, (1,), generator=g))
            tokens = draws[:cut] + torch.randint(0, v, (n - cut,), generator=g).tolist()
            if k % 2:
                rows.append(ChainRow(p, tokens, None, "coupled", None, rates))
                refs.append(coupled_verify(p, tokens, rates))
            else:
                seed = trial * 10 + k
                rows.append(ChainRow(p, tokens, None, "block", torch.Generator().manual_seed(seed)))
                refs.append(CHAIN_RULES["block"](p, torch.tensor(tokens, dtype=torch.long), None,
                                                 torch.Generator().manual_seed(seed)))
        assert verify_chains(rows) == refs


def test_a_row_judged_alone_or_in_a_batch_is_the_same() -> None:
    """A row's result does not depend on the other rows of the batch (their lengths pad it)."""
    g = torch.Generator().manual_seed(5)
    p = random_law(4, 50, g, sparse=False)
    q = random_law(3, 50, g, sparse=False)
    tokens = torch.multinomial(q, 1, generator=g).view(-1).tolist()
    alone = verify_chains([ChainRow(p, tokens, q, "block", torch.Generator().manual_seed(1))])[0]
    others = [ChainRow(random_law(8, 50, g, False), [1, 2, 3, 4, 5, 6, 7], None, "token",
                       torch.Generator().manual_seed(2))]
    together = verify_chains(others + [ChainRow(p, tokens, q, "block", torch.Generator().manual_seed(1))])[1]
    assert alone == together


def test_bad_weights_are_a_clear_error() -> None:
    p = torch.full((1, 5), float("nan"))
    with pytest.raises(ValueError, match="cannot sample"):
        verify_chains([ChainRow(p, [], None, "block", torch.Generator().manual_seed(0))])


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["block", "token"])
@pytest.mark.parametrize("setting", SETTINGS[:2], ids=["T1", "T0.7-k3"])
def test_output_law_is_the_target_law(rule: str, setting: SamplingConfig) -> None:
    """Repeated batched steps emit the target's law over LENGTH tokens; the draft's law is rejected."""
    p, q = pair(setting, 200)
    g = torch.Generator().manual_seed(17)
    samples = [simulate(batched(rule), p, q, 3, g) for _ in range(N)]
    assert gof_pvalue(samples, p.sequence_law(LENGTH)) > 1e-3
    assert gof_pvalue(samples, q.sequence_law(LENGTH)) < 1e-6  # power


def test_step_laws_are_algorithm_2_and_token_by_token() -> None:
    """One step: block rows follow Algorithm 2's law and not token-by-token's, token rows the reverse."""
    p, q = pair(SETTINGS[0], 7)
    block, token = block_step_law(p, q, 3), token_step_law(p, q, 3)
    for rule, law, other in (("block", block, token), ("token", token, block)):
        g = torch.Generator().manual_seed(23)
        samples = [step(batched(rule), p, q, (), 3, g) for _ in range(N)]
        assert gof_pvalue(samples, law) > 1e-3, rule
        assert gof_pvalue(samples, other) < 1e-6, rule


@pytest.mark.slow
def test_deterministic_drafter_law() -> None:
    """q one-hot (no draft law): the target's law, and a law that favours the proposal is rejected."""
    p = pair(SETTINGS[0], 31)[0]
    g = torch.Generator().manual_seed(3)
    samples = [simulate(batched("block"), p, None, 2, g) for _ in range(N)]
    law = p.sequence_law(LENGTH)
    assert gof_pvalue(samples, law) > 1e-3
    biased = {k: val * (1.5 if k[0] == 0 else 1.0) for k, val in law.items()}
    total = sum(biased.values())
    assert gof_pvalue(samples, {k: val / total for k, val in biased.items()}) < 1e-6
    assert V == 5  # the harness's vocabulary: the proposal (token 0) is one of five
