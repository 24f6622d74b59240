"""llama.cpp as a bench peer: output parsers on captured real output, the pre-tokenizer mapping, the
GGUF conversion (needs a llama.cpp checkout) and a real end-to-end run (needs a build).

The build-dependent tests look for a build in $SPECDECODE_LLAMA_CPP (scripts/build_llama_cpp.sh makes
one); CI has none and skips them, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specdecode.bench import llamacpp, llamacpp_gguf
from specdecode.bench.llamacpp_convert import GPT2_REGEX, is_gpt2_pretokenizer, pretokenizer_name
from specdecode.cli import main
from specdecode.config import ConfigError, SamplingConfig

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
BUNDLED_TARGET, BUNDLED_DRAFT = ROOT / "models" / "code-target", ROOT / "models" / "code-draft"
LLAMA_CPP = os.environ.get("SPECDECODE_LLAMA_CPP")
NO_BUILD = "no llama.cpp build: set SPECDECODE_LLAMA_CPP to one (scripts/build_llama_cpp.sh makes it)"


def _build() -> llamacpp.LlamaCppBuild:
    if not LLAMA_CPP:
        pytest.skip(NO_BUILD)
    try:
        return llamacpp.locate(LLAMA_CPP)
    except ConfigError as e:
        pytest.skip(f"SPECDECODE_LLAMA_CPP={LLAMA_CPP} is not a usable build: {e}")


# ---------------------------------------------------------------------------
# Parsers, on output captured from the real tools (tests/bench/data/README.md says how)
# ---------------------------------------------------------------------------

def test_parse_llama_bench_json_from_captured_output() -> None:
    samples = llamacpp.parse_llama_bench_json((DATA / "llama_bench_pg.txt").read_text())
    assert len(samples) == 1
    s = samples[0]
    assert (s.n_prompt, s.n_gen, s.n_threads) == (40, 24, 1)
    assert len(s.samples_ns) == 1 and 1e6 < s.samples_ns[0] < 1e10  # one repetition, a plausible time
    assert "BF16" in s.model_type


def test_parse_speculative_from_captured_output() -> None:
    text = (DATA / "llama_speculative_simple.txt").read_text()
    r = llamacpp.parse_speculative(text)
    assert (r.n_input, r.n_predict, r.n_drafted, r.n_accept) == (60, 27, 34, 15)
    assert (r.encode_s, r.decode_s) == (0.101, 0.393)
    assert r.seconds == pytest.approx(r.encode_s + r.decode_s) and r.seconds > 0
    assert r.passes == r.n_predict - r.n_accept


def test_parsers_reject_truncated_or_foreign_output() -> None:
    text = (DATA / "llama_speculative_simple.txt").read_text()
    cut = text[: text.index("n_drafted")]  # the run died before its summary
    with pytest.raises(llamacpp.LlamaCppError, match="n_drafted"):
        llamacpp.parse_speculative(cut)
    with pytest.raises(llamacpp.LlamaCppError, match="no llama-bench JSON"):
        llamacpp.parse_llama_bench_json("main: error: failed to load model 'x.gguf'\n")
    with pytest.raises(llamacpp.LlamaCppError, match="lacks"):
        llamacpp.parse_llama_bench_json('[{"n_prompt": 4, "n_gen": 2}]')


def test_parse_speculative_ignores_lookalike_generated_text() -> None:
    """Generated text comes before the summary; the last match of each line is the one read."""
    text = (DATA / "llama_speculative_simple.txt").read_text()
    fake = "decoded 999 tokens in 0.001 seconds\nn_accept = 999\n"
    r = llamacpp.parse_speculative(fake + text)
    assert r.n_predict == 27 and r.n_accept == 15


def test_speculative_run_repeats_a_run_whose_summary_was_lost(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """llama.cpp's async logger may drop a run's last lines at exit: the run is repeated (twice at most),
    and a stand-in binary that prints the captured output only from its second call shows it."""
    from specdecode.models import load_model

    captured = DATA / "llama_speculative_simple.txt"
    calls = tmp_path / "calls"
    stub = tmp_path / llamacpp.SPEC_BIN
    stub.write_text(f"#!/bin/sh\necho x >> {calls}\n"
                    f"if [ $(wc -l < {calls}) -ge 2 ]; then cat {captured}; else echo 'def f(x):'; fi\n")
    stub.chmod(0o755)
    build = llamacpp.LlamaCppBuild(tmp_path, tmp_path, "stub")
    m = llamacpp.LlamaCppSpeculative(build, tmp_path / "t.gguf", tmp_path / "d.gguf", "bf16", 3, 1,
                                     load_model(str(tiny_dirs["llama"])))
    out = m.run([1, 2, 3], 24)
    assert len(out.token_ids) == 27 and out.seconds == pytest.approx(0.494) and out.steps is None
    assert m.stats.lost_summaries == 1 and m.stats.to_dict()["accept_rate"] == pytest.approx(15 / 34)
    stub.write_text("#!/bin/sh\necho 'def f(x):'\n")  # never a summary: the third failure is reported
    with pytest.raises(llamacpp.LlamaCppSummaryLost, match="printed no 'encoded' line"):
        m.run([1, 2, 3], 24)
    assert m.stats.lost_summaries == 1 + 1 + llamacpp.SUMMARY_RETRIES


# ---------------------------------------------------------------------------
# The pre-tokenizer mapping
# ---------------------------------------------------------------------------

def test_bundled_tokenizer_is_gpt2_style() -> None:
    assert pretokenizer_name(BUNDLED_TARGET) == "gpt-2"
    assert pretokenizer_name(BUNDLED_DRAFT) == "gpt-2"


@pytest.mark.parametrize("pre, expected", [
    ({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, True),
    ({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}, True),
    ({"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}, False),  # another split
    ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}, False),  # no regex at all
    ({"type": "Sequence", "pretokenizers": [  # Llama-3-style digits-in-threes regex
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{N}{1,3}"}, "behavior": "Isolated"},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}, False),
    ({"type": "Metaspace", "replacement": "▁"}, False),
    (None, False),
])
def test_gpt2_pretokenizer_recognition(pre: object, expected: bool) -> None:
    assert is_gpt2_pretokenizer(pre) is expected


def test_unknown_pretokenizer_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": {"type": "Metaspace"}}))
    with pytest.raises(ValueError, match="Metaspace"):
        pretokenizer_name(tmp_path)


def test_locate_names_the_flag_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--llama-cpp.*not a directory"):
        llamacpp.locate(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="--llama-cpp: no llama-bench.*build_llama_cpp.sh"):
        llamacpp.locate(str(tmp_path))
    with pytest.raises(ConfigError, match="--llama-cpp-formats"):
        llamacpp.parse_formats("bf16,q5_k")


def test_bench_without_llama_cpp_says_it_was_not_run(tiny_dirs: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    wl = tmp_path / "one.jsonl"
    wl.write_text(json.dumps({"id": "c1", "category": "completion", "prompt": "def f(x):\n",
                              "max_new_tokens": 6}) + "\n")
    out = tmp_path / "out"
    assert main(["bench", "--target", str(tiny_dirs["llama"]), "--methods", "plain", "--workload", str(wl),
                 "--reps", "1", "--threads", "1", "--cost-repeats", "1", "--no-plots", "--no-progress",
                 "--out", str(out)]) == 0
    assert f"llama.cpp: {llamacpp.NOT_RUN}" in capsys.readouterr().out
    data = json.loads((out / "bench.json").read_text())
    assert data["llama_cpp"] == {"status": llamacpp.NOT_RUN}


# ---------------------------------------------------------------------------
# With a llama.cpp checkout / build
# ---------------------------------------------------------------------------

def _gguf_meta(build: llamacpp.LlamaCppBuild, path: Path, keys: list[str]) -> dict[str, object]:
    """Read string/int metadata with the checkout's own gguf-py (in a child: it is not our dependency)."""
    code = ("import json, sys; from gguf import GGUFReader; r = GGUFReader(sys.argv[1]); out = {}\n"
            "for k in sys.argv[2:]:\n"
            "    f = r.fields.get(k)\n"
            "    out[k] = None if f is None else f.contents()\n"
            "print(json.dumps(out))")
    env = {**os.environ, "PYTHONPATH": str(build.checkout / "gguf-py")}
    p = subprocess.run([sys.executable, "-c", code, str(path), *keys], capture_output=True, text=True, env=env,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_conversion_maps_gpt2_pretokenizer_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build = _build()
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    path = llamacpp.gguf_path(build, BUNDLED_DRAFT, "bf16")
    assert path.is_file() and str(path).startswith(str(tmp_path / "llama.cpp"))
    meta = _gguf_meta(build, path, ["tokenizer.ggml.pre", "tokenizer.ggml.model", "general.architecture",
                                    "tokenizer.ggml.bos_token_id"])
    assert meta == {"tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.model": "gpt2", "general.architecture": "llama",
                    "tokenizer.ggml.bos_token_id": 0}
    # the bundled draft has an FR-Spec cut: its output matrix went over untied, zero outside the cut
    from specdecode.drafters.vocab import read_vocab_file
    from specdecode.models import load_model

    vocab = read_vocab_file(BUNDLED_DRAFT)
    assert vocab is not None
    head = load_model(str(path)).output_matrix().float()
    inside = torch.zeros(head.shape[0], dtype=torch.bool)
    inside[vocab["token_ids"][:vocab["size"]]] = True
    assert bool((head[~inside] == 0).all()) and bool((head[inside].abs().sum(dim=1) > 0).all())
    stamp = path.stat().st_mtime_ns
    assert llamacpp.gguf_path(build, BUNDLED_DRAFT, "bf16") == path and path.stat().st_mtime_ns == stamp  # cached
    if build.binary(llamacpp.QUANT_BIN):
        q8 = llamacpp.gguf_path(build, BUNDLED_DRAFT, "q8_0")
        assert q8.is_file() and q8.stat().st_size < path.stat().st_size


@pytest.mark.slow
def test_bench_with_llama_cpp_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled pair, one prompt per category, 24 tokens: llama.cpp plain in three formats and
    speculative at γ = 3 beside ours, then a target-only run (plain only)."""
    build = _build()
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "pair"
    common = ["--per-category", "1", "--max-new-tokens", "24", "--reps", "1", "--threads", "1", "--no-plots",
              "--no-progress", "--cost-repeats", "2", "--llama-cpp", str(build.checkout)]
    assert main(["bench", "--methods", "plain,draft", "--gammas", "3", "--peer-gammas", "3",
                 "--out", str(out), *common]) == 0
    table = capsys.readouterr().out
    assert "ours vs llama.cpp" in table and "best of ours vs best of llama.cpp, per category" in table
    data = json.loads((out / "bench.json").read_text())
    best = {r["category"]: r for r in data["llama_cpp"]["best_by_category"]}
    assert set(best) == set(data["categories"]) and all(r["ratio_ours_over_theirs"] > 0 for r in best.values())
    names = {m["name"]: m for m in data["methods"]}
    for fmt in llamacpp.FORMATS:
        for name in (f"llama.cpp/{fmt}", f"llama.cpp-spec/{fmt}/g3"):
            m = names[name]
            assert m["status"] == "ok", (name, m["reason"])
            o = m["categories"]["overall"]
            assert o["tokens_per_s"]["mean"] > 0 and o["exact_match"] is None
            # the budget, EOS ignored; llama-speculative-simple's last draft may overshoot it by up to γ
            assert 24 <= o["new_tokens_mean"] <= (24 if name.startswith("llama.cpp/") else 24 + 3)
    rows = {(r["llama_cpp"], r["ours"]): r for r in data["llama_cpp"]["comparison"]}
    plain_bf16 = rows[("llama.cpp/bf16", "plain")]
    assert plain_bf16["same_weight_format"] and plain_bf16["ratio_ours_over_theirs"] > 0
    spec = rows[("llama.cpp-spec/bf16/g3", "draft/g3")]["spec"]
    assert spec["prompt_token_mismatches"] == 0  # llama.cpp tokenised our text as we do
    assert 0.3 < spec["accept_rate"] <= 1.0 and 1.0 < spec["tau"] <= 4.0  # the trained pair agrees often
    assert data["llama_cpp"]["version"] and data["llama_cpp"]["threads"] == 1

    out2 = tmp_path / "target-only"
    assert main(["bench", "--target", str(BUNDLED_TARGET), "--methods", "plain", "--llama-cpp-formats", "bf16",
                 "--out", str(out2), *common]) == 0
    data2 = json.loads((out2 / "bench.json").read_text())
    names2 = {m["name"]: m for m in data2["methods"]}
    assert names2["llama.cpp/bf16"]["status"] == "ok"
    spec2 = [m for n, m in names2.items() if n.startswith("llama.cpp-spec/")]
    assert spec2 and all(m["status"] == "skipped" and "no draft model" in m["reason"] for m in spec2)


def test_converter_takes_tokenizer_json_without_a_sentencepiece_model(tmp_path: Path) -> None:
    """The converter's SentencePiece attempt (which Qwen2 makes first, falling back to tokenizer.json only on
    FileNotFoundError) fails with FileNotFoundError before importing sentencepiece when the checkpoint has no
    tokenizer.model, and runs as before when it has one."""
    from specdecode.bench.llamacpp_convert import install_mapping

    calls: list[str] = []

    class FakeTextModel:
        def __init__(self, d: Path) -> None:
            self.dir_model = d

        def get_vocab_base_pre(self, tokenizer: object) -> str:
            return "gpt-2"

        def _set_vocab_sentencepiece(self, add_to_gguf: bool = True) -> None:
            calls.append(f"sentencepiece add={add_to_gguf}")

    install_mapping(FakeTextModel)
    with pytest.raises(FileNotFoundError, match="tokenizer.model"):
        FakeTextModel(tmp_path)._set_vocab_sentencepiece()
    assert calls == []
    (tmp_path / "tokenizer.model").write_bytes(b"")
    FakeTextModel(tmp_path)._set_vocab_sentencepiece(add_to_gguf=False)
    assert calls == ["sentencepiece add=False"]


# ---------------------------------------------------------------------------
# GGUF targets and lookup decoding (llamacpp_gguf.py), with stand-in binaries
# ---------------------------------------------------------------------------

def _stub_build(tmp_path: Path) -> llamacpp.LlamaCppBuild:
    """A build whose tools are shell stand-ins: llama-quantize records its arguments and copies its input,
    the speculative tools print the captured summary."""
    bins = tmp_path / "bin"
    bins.mkdir(parents=True)
    captured = DATA / "llama_speculative_simple.txt"
    (bins / llamacpp.QUANT_BIN).write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/quantize-calls\n'
                                           'for a in "$@"; do case "$a" in --*) ;; *) set -- "$@" "$a";; esac; done\n'
                                           'n=$#; eval src=\\${$((n-2))}; eval dst=\\${$((n-1))}; cp "$src" "$dst"\n')
    for b in (llamacpp.BENCH_BIN, llamacpp.SPEC_BIN, llamacpp_gguf.LOOKUP_BIN):
        (bins / b).write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/{b}.args\ncat {captured}\n")
    for b in bins.iterdir():
        b.chmod(0o755)
    return llamacpp.LlamaCppBuild(tmp_path, bins, "stub 1")


def test_formats_for_gguf_and_hf_targets(tmp_path: Path) -> None:
    from gguf_util import tiny_gguf

    hf, g = tiny_gguf(tmp_path, "Q8_0")
    assert llamacpp_gguf.default_formats(str(g)) == "file"
    assert llamacpp_gguf.default_formats(str(hf)) == "bf16,q8_0,q4_0"
    assert llamacpp_gguf.parse_formats("file, q4_0,q8_0,q4_0", True) == ["file", "q4_0", "q8_0"]
    assert llamacpp_gguf.parse_formats("file,bf16,q8_0", False) == ["bf16", "q8_0"]  # file = the BF16 conversion
    assert llamacpp_gguf.parse_formats("q4_0-pure", True) == llamacpp_gguf.parse_formats("q4_0-pure", False)
    with pytest.raises(ConfigError, match="--llama-cpp-formats.*q5_k"):
        llamacpp_gguf.parse_formats("file,q5_k", True)
    assert llamacpp_gguf.file_type(g) == "q8_0"


def test_gguf_target_runs_as_is_and_requantizes_with_allow_requantize(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf_util import tiny_gguf
    from specdecode.models import load_model

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    _, g = tiny_gguf(tmp_path, "Q4_1")
    build = _stub_build(tmp_path)
    target = load_model(str(g))
    methods, skipped, files = llamacpp_gguf.build_methods(build, target, None, ["file", "q8_0", "q4_1"], [3], [4],
                                                          1, SamplingConfig())
    names = [m.name for m in methods]
    # the file itself (named by its type), a Q8_0 made from it; q4_1 is the file's own type: no second copy
    assert names == ["llama.cpp/q4_1", "llama.cpp-lookup/q4_1/k4", "llama.cpp/q8_0", "llama.cpp-lookup/q8_0/k4"]
    assert methods[0].gguf == g  # type: ignore[attr-defined]
    calls = (tmp_path / "quantize-calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith(f"--allow-requantize {g} ") and calls[0].endswith(" Q8_0")
    q8 = Path(files[f"{target.name}/q8_0"])
    assert q8.is_file() and str(q8).startswith(str(tmp_path / "cache" / "llama.cpp"))
    assert llamacpp_gguf.requantized(build, g, "q8_0") == q8  # cached: llama-quantize not run again
    assert len((tmp_path / "quantize-calls").read_text().splitlines()) == 1
    assert [s.name for s in skipped] == ["llama.cpp-spec/q4_1/g3", "llama.cpp-spec/q8_0/g3"]
    assert all("no draft model" in s.reason for s in skipped)
    pure = llamacpp_gguf.requantized(build, g, "q4_0-pure")  # every matrix Q4_0: llama-quantize --pure
    assert pure.name.endswith("-q4_0-pure.gguf") and pure.is_file()
    last = (tmp_path / "quantize-calls").read_text().splitlines()[-1]
    assert last.startswith(f"--allow-requantize --pure {g} ") and last.endswith(" Q4_0")


def test_lookup_runs_llama_lookup_without_a_persistent_cache(tmp_path: Path) -> None:
    from gguf_util import tiny_gguf
    from specdecode.models import load_model

    _, g = tiny_gguf(tmp_path, "Q8_0")
    build = _stub_build(tmp_path)
    target = load_model(str(g))
    m = llamacpp_gguf.LlamaCppLookup(build, g, "q8_0", 4, 1, target)
    assert (m.name, m.family, m.setting) == ("llama.cpp-lookup/q8_0/k4", "llama.cpp-lookup", 4)
    out = m.run([5, 6, 7], 24)
    assert len(out.token_ids) == 27 and out.seconds == pytest.approx(0.494)
    args = (tmp_path / f"{llamacpp_gguf.LOOKUP_BIN}.args").read_text().split()
    assert args[args.index("--spec-draft-n-max") + 1] == "4" and args[args.index("-n") + 1] == "23"
    assert "-md" not in args and "-lcd" not in args and "--lookup-cache-dynamic" not in args
    assert "--ignore-eos" in args and args[args.index("-m") + 1] == str(g)


def test_prompt_text_keeps_bos_when_the_gguf_does_not_add_it(tmp_path: Path) -> None:
    """The tiny GGUF says add_bos_token = false (as SmolLM2's does): a leading BOS of ours stays in the text."""
    from gguf_util import tiny_gguf
    from specdecode.models import load_model

    _, g = tiny_gguf(tmp_path, "F16")
    target = load_model(str(g))
    bos = int(llamacpp_gguf.gguf_meta(g)["tokenizer.ggml.bos_token_id"])
    m = llamacpp.LlamaCppSpeculative(_stub_build(tmp_path), g, g, "f16", 3, 1, target)
    ids = [bos, 5, 6]
    assert m.prompt_text(ids) == target.tokenizer.decode(ids, skip_special_tokens=False)  # type: ignore[union-attr]
    stand_in = llamacpp.LlamaCppSpeculative(_stub_build(tmp_path / "x"), tmp_path / "none.gguf", g, "f16", 3, 1,
                                            target)  # no file to read: the old rule (llama.cpp adds it)
    eos = sorted(target.eos_token_ids)[0]
    assert stand_in.prompt_text([eos, 5, 6]) == target.tokenizer.decode([5, 6], skip_special_tokens=False)  # type: ignore[union-attr]


def test_comparison_pairs_lookup_with_our_lookup() -> None:
    def entry(name: str, family: str, runtime: str, tps: float, setting: object = None) -> dict[str, object]:
        return {"name": name, "family": family, "runtime": runtime, "setting": setting, "status": "ok",
                "categories": {"overall": {"tokens_per_s": {"mean": tps}}}}

    summary = {"methods": [entry("plain", "plain", "specdecode", 50.0),
                           entry("lookup/k4", "lookup", "specdecode", 80.0, 4),
                           entry("llama.cpp/q8_0", "llama.cpp-plain", "llama.cpp", 40.0),
                           entry("llama.cpp-lookup/q8_0/k4", "llama.cpp-lookup", "llama.cpp", 64.0, 4)]}
    rows = {r["llama_cpp"]: r for r in llamacpp.comparison(summary, "int8", [])}
    assert rows["llama.cpp/q8_0"]["ours"] == "plain" and rows["llama.cpp/q8_0"]["same_weight_format"]
    assert rows["llama.cpp/q8_0"]["ratio_ours_over_theirs"] == pytest.approx(1.25)
    assert rows["llama.cpp-lookup/q8_0/k4"]["ours"] == "lookup/k4"
    assert rows["llama.cpp-lookup/q8_0/k4"]["ratio_ours_over_theirs"] == pytest.approx(1.25)


def test_best_by_category_takes_each_side_best_per_category() -> None:
    def entry(name: str, runtime: str, per_cat: dict[str, float], status: str = "ok") -> dict[str, object]:
        return {"name": name, "runtime": runtime, "status": status,
                "categories": {c: {"tokens_per_s": {"mean": v}} for c, v in per_cat.items()}}

    summary = {"methods": [entry("plain", "specdecode", {"code": 50.0, "chat": 50.0, "overall": 50.0}),
                           entry("suffix", "specdecode", {"code": 90.0, "chat": 45.0, "overall": 70.0}),
                           entry("auto", "specdecode", {"code": 999.0}, status="failed"),
                           entry("llama.cpp/q4_0", "llama.cpp", {"code": 30.0, "chat": 40.0, "overall": 35.0}),
                           entry("llama.cpp-lookup/q4_0/k8", "llama.cpp", {"code": 60.0, "chat": 20.0,
                                                                          "overall": 40.0})]}
    rows = {r["category"]: r for r in llamacpp.best_by_category(summary)}
    assert (rows["code"]["ours"], rows["code"]["llama_cpp"]) == ("suffix", "llama.cpp-lookup/q4_0/k8")
    assert rows["code"]["ratio_ours_over_theirs"] == pytest.approx(1.5)  # the failed method's figure is not read
    assert (rows["chat"]["ours"], rows["chat"]["llama_cpp"]) == ("plain", "llama.cpp/q4_0")
    assert rows["chat"]["ratio_ours_over_theirs"] == pytest.approx(1.25)
    assert rows["overall"]["ratio_ours_over_theirs"] == pytest.approx(70.0 / 40.0)
    text = llamacpp.format_best_by_category(list(rows.values()))
    assert "llama.cpp-lookup/q4_0/k8" in text and "1.50" in text
    assert llamacpp.best_by_category({"methods": summary["methods"][:2]}) == []  # no llama.cpp row: nothing


def test_cut_draft_is_staged_with_zero_rows_outside_its_cut(tmp_path: Path) -> None:
    """llama.cpp has no FR-Spec cut, so a cut draft is converted from a copy whose output rows outside the cut
    are zero: the cut's logits are unchanged and the rest score 0."""
    import transformers
    from tiny import build_model

    from specdecode.bench.llamacpp_convert import stage_vocab_cut
    from specdecode.drafters.vocab import write_vocab_file

    d = build_model(tmp_path / "draft", tie_word_embeddings=True)
    assert stage_vocab_cut(d, tmp_path / "staged") == d  # no draft_vocab.json: converted as it is
    ranked = list(range(299, -1, -1))
    write_vocab_file(d, ranked, np.ones(300), size=40, source="test")
    staged = stage_vocab_cut(d, tmp_path / "staged")
    assert staged == tmp_path / "staged"
    assert json.loads((staged / "config.json").read_text())["tie_word_embeddings"] is False
    assert not (staged / "draft_vocab.json").exists() and (staged / "tokenizer.json").is_file()
    ids = torch.tensor([[5, 9, 17, 3]])
    with torch.no_grad():
        before = transformers.AutoModelForCausalLM.from_pretrained(d).eval()(ids).logits[0]
        after = transformers.AutoModelForCausalLM.from_pretrained(staged).eval()(ids).logits[0]
    cut = torch.tensor(sorted(ranked[:40]))
    outside = torch.ones(300, dtype=torch.bool)
    outside[cut] = False
    torch.testing.assert_close(after[:, cut], before[:, cut])
    assert bool((after[:, outside] == 0).all())
    write_vocab_file(d, ranked, np.ones(300), size=300, source="test")  # a cut as wide as the vocabulary: no copy
    assert stage_vocab_cut(d, tmp_path / "staged2") == d


@pytest.mark.slow
def test_bench_gguf_target_with_llama_cpp_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny Q8_0 GGUF as --target: llama.cpp plain on the file and on a Q4_0 made from it, and its lookup
    decoding beside ours; no conversion step."""
    from gguf_util import tiny_gguf

    build = _build()
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    _, g = tiny_gguf(tmp_path, "Q8_0", pre="gpt-2")  # llama.cpp's name for GPT-2's pre-tokenizer
    wl = tmp_path / "one.jsonl"
    wl.write_text(json.dumps({"id": "c1", "category": "completion", "prompt": "def f(x):\n    return x + 1\n" * 4,
                              "max_new_tokens": 16}) + "\n")
    out = tmp_path / "out"
    assert main(["bench", "--target", str(g), "--methods", "plain,lookup", "--lookup-tokens", "3", "--workload",
                 str(wl), "--reps", "1", "--threads", "1", "--cost-repeats", "1", "--no-plots", "--no-progress",
                 "--llama-cpp", str(build.checkout), "--llama-cpp-formats", "file,q4_0", "--out", str(out)]) == 0
    data = json.loads((out / "bench.json").read_text())
    names = {m["name"]: m for m in data["methods"]}
    for name in ("llama.cpp/q8_0", "llama.cpp/q4_0", "llama.cpp-lookup/q8_0/k3", "llama.cpp-lookup/q4_0/k3"):
        assert names[name]["status"] == "ok", (name, names[name]["reason"])
    assert data["llama_cpp"]["gguf"][f"{g.name}/q8_0"] == str(g)  # the very file
    rows = {(r["llama_cpp"], r["ours"]): r for r in data["llama_cpp"]["comparison"]}
    assert rows[("llama.cpp/q8_0", "plain")]["same_weight_format"]
    assert rows[("llama.cpp-lookup/q8_0/k3", "lookup/k3")]["spec"]["prompt_token_mismatches"] == 0


def test_decode_only_comparison_reads_llama_bench_tg_at_depth(tmp_path: Path) -> None:
    from specdecode.bench import llamacpp_decode

    stub = tmp_path / llamacpp.BENCH_BIN
    stub.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\necho 'loading...'\n"
                    "echo '[{\"n_prompt\": 0, \"n_gen\": 8, \"n_depth\": 32, \"samples_ns\": [100000000], "
                    "\"model_type\": \"llama ?B Q4_0\", \"n_threads\": 1}]'\n")
    stub.chmod(0o755)
    t = llamacpp_decode.theirs(stub, "m.gguf", 1, 32, 8)
    assert t["tokens_per_s"] == pytest.approx(80.0) and t["n_depth"] == 32
    assert (tmp_path / "args").read_text().split() == ["-m", "m.gguf", "-t", "1", "-p", "0", "-n", "8", "-d", "32",
                                                       "-r", "1", "-o", "json"]
