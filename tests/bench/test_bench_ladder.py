"""`specdecode bench ladder`'s offline parts: the random-weight GGUF it writes loads as the shape it names, the
theory's prediction from measured costs, the peak-RSS probe and the table (llama.cpp itself is not needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gguf_util import tiny_gguf
from specdecode import generate, load_model
from specdecode.bench.ladder import Shape, load_pair, markdown, measure_first_token, predicted, write_f16
from specdecode.sizing.costs import predicted_speedup


def test_the_written_file_has_the_shape_and_decodes(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _, tok = tiny_gguf(tmp_path, "F16")
    path = tmp_path / "shape.gguf"
    write_f16(Shape("test", 128, 3, 4, 2, 256, False), tok, path)
    model = load_model(path)
    c = model.config
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.intermediate_size, c.tie_embeddings) == (
        128, 3, 4, 2, 256, False)
    assert len(generate(model, [1, 2, 3], max_new_tokens=4, ignore_eos=True).token_ids) == 4


def test_the_prediction_is_the_best_gamma_of_the_theory() -> None:
    v = [1.1, 1.2, 1.3, 1.5]
    p = predicted(0.1, v)
    for alpha in (0.6, 0.7, 0.8):
        best = max(range(1, 5), key=lambda g: predicted_speedup(alpha, g, 0.1, v[g - 1]))
        assert p[str(alpha)]["gamma"] == best
        assert p[str(alpha)]["speedup"] == pytest.approx(predicted_speedup(alpha, best, 0.1, v[best - 1]))
    assert predicted(0.9, v)["0.6"]["speedup"] < 1.0  # a draft as dear as the target never pays


def test_the_probe_reports_the_childs_own_peak_not_the_parents() -> None:
    """A child that holds ~200 MB reports about that, however large the measuring process is."""
    ballast = b"x" * (300 * 2**20)  # this process: 300 MB more than the child will hold, written
    hold = "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    r = measure_first_token([sys.executable, "-S", "-c", hold], 1)
    assert 200 <= r["peak_rss_mib"] < 280, r
    del ballast
    with pytest.raises(RuntimeError):
        measure_first_token([sys.executable, "-S", "-c", "raise SystemExit(3)"], 1)


def test_each_side_reports_its_median_start_of_several_in_turn(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 4096)
    log = tmp_path / "order"
    side = "import sys; open(sys.argv[1], 'a').write(sys.argv[2])"
    ours, theirs = load_pair(f, [sys.executable, "-S", "-c", side, str(log), "o"],
                             [sys.executable, "-S", "-c", side, str(log), "t"], 1, 3)
    # ours' first start (no packed-weights cache for the file), then in turn, so neither side always starts after
    # the other
    assert log.read_text() == "oototot"
    assert ours["first_start_s"] > 0
    for r in (ours, theirs):
        assert len(r["first_token_runs_s"]) == 3 and r["first_token_s"] == sorted(r["first_token_runs_s"])[1]


def test_the_table_has_a_row_per_file() -> None:
    row = {"rung": "360m", "format": "Q4_0", "file_mib": 219.0,
           "ours": {"peak_rss_mib": 545.0, "first_token_s": 1.8, "tokens_per_s": 81.8},
           "llama.cpp": {"peak_rss_mib": 421.0, "first_token_s": 0.2, "tokens_per_s": 77.5},
           "costs": {"v": [1.1, 1.2, 1.3, 1.54, 1.6, 1.7, 1.8, 2.28]}}
    lines = markdown([row]).splitlines()
    assert len(lines) == 3 and "SmolLM2-360M" in lines[2] and "1.06×" in lines[2] and "2.28" in lines[2]
