"""A trained drafter records which target weights it was trained for; the check holds across weight formats
(a bf16-trained EAGLE layer on an int8 or int4 target is the same model) and tells other weights apart."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specdecode.drafters.medusa_heads import describe_target, same_weights, warn_if_other_weights
from specdecode.models import load_model


def test_same_weights_in_every_format_and_not_for_other_weights(tiny_dirs: dict[str, Path]) -> None:
    record = describe_target(load_model(tiny_dirs["llama"], weight_dtype="bf16"))
    for wd in ("fp32", "int8", "int4"):
        assert same_weights(record, load_model(tiny_dirs["llama"], weight_dtype=wd)), wd
    other = load_model(tiny_dirs["mistral"])  # same shapes family, other random weights
    assert not same_weights(record, other)
    # a record from before sketches: the exact hash, which a format change breaks
    old = {"path": record["path"], "fingerprint": record["fingerprint"]}
    assert same_weights(old, load_model(tiny_dirs["llama"], weight_dtype="bf16"))
    assert not same_weights(old, other)
    assert same_weights({}, other)  # nothing recorded: nothing to warn about


def test_the_warning_names_both_and_says_outputs_stay_exact(tiny_dirs: dict[str, Path],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    record = describe_target(load_model(tiny_dirs["llama"]))
    other = load_model(tiny_dirs["mistral"])
    with caplog.at_level(logging.WARNING):
        warn_if_other_weights("the EAGLE draft", "DIR", record, load_model(tiny_dirs["llama"], weight_dtype="int4"))
        assert not caplog.records
        warn_if_other_weights("the EAGLE draft", "DIR", record, other)
    (rec,) = caplog.records
    msg = rec.getMessage()
    assert "the EAGLE draft in DIR" in msg and str(tiny_dirs["llama"]) in msg and str(tiny_dirs["mistral"]) in msg
    assert "outputs stay exact" in msg
