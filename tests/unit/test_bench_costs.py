"""`specdecode bench costs`: v(n) per weight format and kernel path, on a tiny model."""

from __future__ import annotations

import json

import pytest


def test_bench_costs_prints_v_per_format_and_path(tiny_dirs, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from specdecode.cli import main
    from specdecode.kernels import fast_linear_available

    if not fast_linear_available():
        pytest.skip("the quantized formats need the fast CPU kernel")
    out = tmp_path / "costs.json"
    rc = main(["bench", "costs", "--target", str(tiny_dirs["llama"]), "--formats", "bf16,int4", "--isas", "auto",
               "--max-tokens", "3", "--rounds", "1", "--reps", "1", "--context", "8", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "v(n)" in text and "bf16" in text and "int4" in text
    rows = json.loads(out.read_text())["rows"]
    assert [(r["format"], r["isa"], r["threads"]) for r in rows] == [("bf16", "auto", 1), ("int4", "auto", 1)]
    for r in rows:
        assert len(r["v"]) == 3 and r["v"][0] == 1.0 and all(t > 0 for t in r["pass_s"])


def test_bench_costs_floor_bounds_v_for_quantized_rows_only(tiny_dirs, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from specdecode.cli import main
    from specdecode.kernels import fast_linear_available
    from specdecode.models import load_model

    if not fast_linear_available():
        pytest.skip("the quantized formats need the fast CPU kernel")
    out = tmp_path / "costs.json"
    rc = main(["bench", "costs", "--target", str(tiny_dirs["llama"]), "--formats", "bf16,int8", "--isas", "auto",
               "--max-tokens", "4", "--rounds", "1", "--reps", "1", "--context", "8", "--floor", "--json", str(out)])
    assert rc == 0
    assert "arithmetic per row" in capsys.readouterr().out
    bf16, int8 = json.loads(out.read_text())["rows"]
    assert "v_floor" not in bf16  # a dense path has no packed kernel to floor
    model = load_model(str(tiny_dirs["llama"]), weight_dtype="int8")
    assert model.quant is not None
    # every packed matrix's weights plus the output matrix: one multiply-add each per token row
    assert int8["macs_per_token"] == sum(model.quant.logical.values()) + model.output_matrix().numel()
    assert int8["floor_row_s"] > 0
    v = int8["v_floor"]
    assert len(v) == 4 and all(x >= 1.0 for x in v) and v == sorted(v)
    assert v[-1] == pytest.approx(max(1.0, 4 * int8["floor_row_s"] / int8["pass_s"][0]))


def test_bench_costs_rejects_an_unknown_format(tiny_dirs, capsys) -> None:  # type: ignore[no-untyped-def]
    from specdecode.cli import main

    assert main(["bench", "costs", "--target", str(tiny_dirs["llama"]), "--formats", "int3"]) != 0
    err = capsys.readouterr().err
    assert "int3" in err and "Traceback" not in err


def test_bench_without_costs_still_parses_as_the_benchmark() -> None:
    from specdecode.cli import build_parser

    args = build_parser().parse_args(["bench", "--quick", "--threads", "1"])
    assert args.func.__name__ == "cmd_bench" and args.bench_command is None and args.quick
