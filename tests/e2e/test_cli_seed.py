"""`specdecode generate --seed`: the same text whatever --drafter and --gamma (the coupled rule is the
default for seeded runs); --accept-rule selects the rule and a bad value is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode.cli import main

PROMPT = "def fib(n):"


def generate(capsys: pytest.CaptureFixture[str], dirs: dict[str, Path], *flags: str) -> dict:
    code = main(["generate", "--target", str(dirs["llama"]), "--draft", str(dirs["draft"]), "--prompt", PROMPT,
                 "--max-new-tokens", "16", "--ignore-eos", "--temperature", "0.8", "--top-p", "0.95", "--seed", "11",
                 "--json", *flags])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_seeded_generate_is_the_same_for_every_drafter(tiny_dirs: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    plain = generate(capsys, tiny_dirs, "--drafter", "none")
    assert plain["stats"]["drafted"] == 0
    runs = {"model-g1": ("--drafter", "model", "--gamma", "1"), "model-g4": ("--drafter", "model", "--gamma", "4"),
            "model-auto": ("--drafter", "model", "--gamma", "auto"), "ngram-g3": ("--drafter", "ngram", "--gamma", "3"),
            "layerskip-g2": ("--drafter", "layerskip", "--exit-layer", "1", "--gamma", "2"),
            "model-g3-coupled": ("--drafter", "model", "--gamma", "3", "--accept-rule", "coupled")}
    drafted = 0
    for name, flags in runs.items():
        out = generate(capsys, tiny_dirs, *flags)
        assert (out["token_ids"], out["text"]) == (plain["token_ids"], plain["text"]), name
        drafted += out["stats"]["drafted"]
    assert drafted > 0
    # the rule is what makes it so: rejection sampling draws in a drafter-dependent order
    rejection = [generate(capsys, tiny_dirs, "--drafter", "model", "--gamma", str(g), "--accept-rule", "rejection")
                 for g in (1, 4)]
    assert any(r["token_ids"] != plain["token_ids"] for r in rejection)


def test_bad_accept_rule_is_a_one_line_error(tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--target", str(tiny_dirs["llama"]), "--drafter", "none", "--prompt", PROMPT,
                 "--accept-rule", "leviathan"])
    err = capsys.readouterr().err
    assert code == 2 and "accept_rule must be one of auto, coupled, rejection" in err and "Traceback" not in err
