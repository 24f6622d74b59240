"""Leviathan et al.'s model: their Table 1 (c = 0), the optimum, and the CLI."""

from __future__ import annotations

import json

import pytest

from specdecode.bench.theory import alpha_from_tau, expected_tokens, linear_v, optimal_gamma, speedup
from specdecode.cli import main
from specdecode.config import ConfigError

TABLE_1 = [(0.6, 2, 1.96), (0.7, 3, 2.53), (0.8, 2, 2.44), (0.8, 5, 3.69), (0.9, 2, 2.71), (0.9, 10, 6.86)]


@pytest.mark.parametrize("alpha,gamma,expected", TABLE_1)
def test_leviathan_table_1(alpha: float, gamma: int, expected: float) -> None:
    assert round(speedup(alpha, gamma, c=0.0), 2) == expected


def test_edges_and_inverse() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert alpha_from_tau(expected_tokens(0.73, 4), 4) == pytest.approx(0.73, abs=1e-8)
    with pytest.raises(ConfigError):
        expected_tokens(1.5, 2)


def test_optimal_gamma() -> None:
    # with free drafts and free verification longer is always better
    assert optimal_gamma(0.8, 0.0, max_gamma=20).gamma == 20
    # a costly draft: Leviathan's rule "some γ helps iff α > c"
    assert not optimal_gamma(0.3, 0.35).helps
    assert optimal_gamma(0.8, 0.05).helps
    # costly verification (CPU) shortens the optimum
    assert optimal_gamma(0.8, 0.05, linear_v(2.0, 4)).gamma < optimal_gamma(0.8, 0.05).gamma


def test_theory_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["theory", "--alpha", "0.8", "--gamma", "5", "--c", "0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert round(r["expected_tokens_per_pass"], 2) == 3.69 and round(r["speedup"], 2) == 3.69
    assert main(["theory", "--alpha", "0.9", "--gamma", "10", "--c", "0.02", "--v", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "6.86" in out and "optimal γ" in out
    # measured v(1..4) (a step, as on our CPU): the search stays within the measured γ
    assert main(["theory", "--alpha", "0.8", "--c", "0.05", "--v", "1.7,1.8,1.8,1.9", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["max_gamma"] == 4 and r["v"] == 1.9 and r["optimal_gamma"] == 4
    assert r["speedup"] == pytest.approx(expected_tokens(0.8, 4) / (4 * 0.05 + 1.9))
    assert main(["theory", "--alpha", "2"]) == 2  # a bad value is a one-line error, not a traceback
    assert main(["theory", "--alpha", "0.5", "--v", "x"]) == 2


def test_gamma_lists() -> None:
    from specdecode.bench.flags import parse_gammas, parse_int_list

    assert parse_int_list("1-3,6", "--gammas") == [1, 2, 3, 6]
    assert parse_gammas("2,auto") == ([2], True) and parse_gammas("auto") == ([], True)
    assert parse_gammas("1-8") == (list(range(1, 9)), False)
    with pytest.raises(ConfigError):
        parse_int_list("0-2", "--gammas")
