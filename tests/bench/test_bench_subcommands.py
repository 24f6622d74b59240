"""The `specdecode bench <name>` measurements that replaced one-off scripts: they parse, run on tiny models,
and refuse bad input with a message (not a traceback)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from specdecode.cli import build_parser, main

SUBCOMMANDS = ("costs", "variants", "replay", "load", "kv-dtype", "llamacpp-decode", "kernel-ab", "ab", "coldstart")


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", name, "--help"])
    assert e.value.code == 0 and name in capsys.readouterr().out


def test_costs_with_a_draft_gives_c(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "costs.json"
    rc = main(["bench", "costs", "--target", str(tiny_dirs["llama"]), "--draft", str(tiny_dirs["draft"]),
               "--formats", "bf16", "--isas", "auto", "--max-tokens", "2", "--rounds", "1", "--reps", "1",
               "--context", "8", "--json", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["c"] > 0 and row["draft_step_s"] > 0


def test_variants_match_plain_decoding(tiny_dirs: dict[str, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "category": "c", "prompt": p, "max_new_tokens": 8}) + "\n"
                                for i, p in enumerate(["def f(x):\n    return x", "a b a b a b"])))
    out = tmp_path / "v.json"
    rc = main(["bench", "variants", "ngram", "ngram:ngram_max=2", "--target", str(tiny_dirs["llama"]),
               "--workload", str(workload), "--reps", "1", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["mismatches"] == 0
    assert {(r["category"], r["variant"]) for r in report["rows"]} == {
        (c, v) for c in ("c", "overall") for v in ("plain", "ngram", "ngram:ngram_max=2")}
    assert "outputs differing from plain decoding: 0" in capsys.readouterr().out


def test_variants_run_two_trained_directories_side_by_side(tiny_dirs: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from eagle_util import make_eagle

    from specdecode.bench import variants
    from specdecode.bench.variants import parse_variant
    from specdecode.models import load_model

    built: list[str] = []
    real_build = variants.build_drafter

    def spy(name, o):  # type: ignore[no-untyped-def]
        built.append(o.artifacts["eagle"])
        return real_build(name, o)

    monkeypatch.setattr(variants, "build_drafter", spy)

    target = load_model(str(tiny_dirs["llama"]))
    one, two = make_eagle(tmp_path / "e1", target, seed=1), make_eagle(tmp_path / "e2", target, seed=2)
    assert parse_variant(f"eagle:eagle-draft={two}").artifacts == {"eagle": str(two)}
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "p", "category": "c", "prompt": "a b a b a b", "max_new_tokens": 8}) + "\n")
    out = tmp_path / "v.json"
    rc = main(["bench", "variants", "eagle", f"eagle:eagle_draft={two}", "--target", str(tiny_dirs["llama"]),
               "--eagle-draft", str(one), "--workload", str(workload), "--reps", "1", "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["mismatches"] == 0
    assert built == [str(one), str(two)]  # the flag's directory, then the variant's own
    # a directory that holds no EAGLE draft is named, not loaded
    assert main(["bench", "variants", f"eagle:eagle-draft={tmp_path}", "--target", str(tiny_dirs["llama"])]) != 0
    err = capsys.readouterr().err
    assert "eagle_draft" in err and "EAGLE-3" in err and "Traceback" not in err


@pytest.mark.parametrize("variant, words", [("no-such-drafter", "unknown drafter"),
                                            ("ngram:depth=3", "ngram_max"),
                                            ("ngram:ngram_max=two", "ngram_max")])
def test_a_bad_variant_is_a_message(variant: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "variants", variant]) != 0
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_kv_dtype_compares_two_storage_dtypes(tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "kv-dtype", "--target", str(tiny_dirs["llama"]), "--weight-dtype", "bf16",
               "--contexts", "8,16", "--pairs", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "context     8" in text and "fp16 vs fp32" in text


def test_ab_compares_each_method_pair_by_pair() -> None:
    from specdecode.bench.ab import compare, overall_tps

    def run(plain: float, lookup: float) -> dict:
        return {"methods": [{"name": "plain", "status": "ok",
                             "categories": {"overall": {"tokens_per_s": {"mean": plain}}}},
                            {"name": "lookup/k4", "status": "ok",
                             "categories": {"overall": {"tokens_per_s": {"mean": lookup}}}},
                            {"name": "broken", "status": "failed", "categories": {}}]}

    this = [overall_tps(run(100, 200)), overall_tps(run(110, 200))]
    rev = [overall_tps(run(100, 100)), overall_tps(run(100, 250))]
    rows = {r["method"]: r for r in compare(this, rev)}
    assert set(rows) == {"plain", "lookup/k4"}
    assert rows["lookup/k4"]["ratio_min"] == pytest.approx(0.8) and rows["lookup/k4"]["ratio_max"] == pytest.approx(2.0)
    assert rows["plain"]["this_speedup"] == pytest.approx(1.0)
    assert rows["lookup/k4"]["this_speedup"] == pytest.approx(200 / 105)


def test_ab_wants_out_before_the_bench_args(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "ab", "--rev", "HEAD", "--", "--quick", "--out", "x"]) != 0
    assert "--out before" in capsys.readouterr().err


@pytest.mark.slow  # starts a server
def test_coldstart_times_a_first_server_with_an_empty_cost_cache(tiny_dirs: dict[str, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDECODE_CACHE", str(cache))  # the subcommand must not use this one: it starts empty
    out = tmp_path / "cold.json"
    rc = main(["bench", "coldstart", "--target", str(tiny_dirs["llama"]), "--requests", "2", "--max-tokens", "8",
               "--rounds", "2", "--json", str(out)])
    assert rc == 0
    summary = json.loads(out.read_text())
    assert len(summary["rounds"]) == 2
    for r in summary["rounds"]:
        assert 0 < r["health_s"] < r["first_answer_s"] and r["restart_health_s"] > 0
        kinds = ("cold", "warm", "plain_cold", "plain_warm", "restart", "plain_restart")
        assert [len(r[k]) for k in kinds] == [2] * 6
        assert all(x["tokens"] == 8 for k in kinds for x in r[k])  # ignore_eos: equal lengths
        assert r["speedup_cold"] > 0 and r["speedup_warm"] > 0 and r["speedup_restart"] > 0
        assert r["cold_over_restart"] == pytest.approx(r["speedup_cold"] / r["speedup_restart"])
    assert summary["cold_over_restart"] == pytest.approx(statistics.median(
        r["cold_over_restart"] for r in summary["rounds"]))
    assert not cache.exists()


def test_coldstart_refuses_no_requests(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "coldstart", "--requests", "0"])
    assert "--requests" in capsys.readouterr().err


def test_a_subcommand_flag_that_prefixes_bench_flags_reaches_the_subcommand() -> None:
    """`--n` is a prefix of bench's --no-plots, --ngram-max, ...: it must still reach llamacpp-decode."""
    args = build_parser().parse_args(["bench", "llamacpp-decode", "--gguf", "m.gguf", "--n", "16", "--threads", "1"])
    assert (args.n, args.threads, args.gguf) == (16, 1, ["m.gguf"])
