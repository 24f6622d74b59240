"""/health's ``kernels.fast_path`` is false whenever eager PyTorch runs instead of a compiled kernel, with a
reason name: a failed build, a CPU without AVX2, or a switch (``SPECDECODE_FAST_LINEAR=0``,
``SPECDECODE_FUSED_OPS=0``) (issue 49). The switches are read per call, so turning one back on clears it."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import specdecode.kernels as kernels
from specdecode.kernels import build, fused
from specdecode.server.app import kernel_status

from server_helpers import RunningServer

LINEAR, FUSED = kernels.EXTENSION, fused.EXTENSION


@pytest.fixture(autouse=True)
def fresh_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's kernel records, emptied for each test and restored after it."""
    monkeypatch.setattr(build, "_STATUS", {})
    monkeypatch.setattr(build, "_REASONS", {})


class NoAvx2(ModuleType):
    """An extension that built on a CPU without AVX2."""

    def __init__(self) -> None:
        super().__init__("no_avx2")

    def has_avx2(self) -> bool:
        return False


def _built_without_avx2(name: str, source: Path, loader: Any = None) -> ModuleType:
    build.report_fallback(name, None)  # as build_extension records a build that loaded
    return NoAvx2()


def test_the_fast_linear_switch_is_reported_and_clears(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_FAST_LINEAR", "0")
    assert not kernels.fast_linear_available()
    assert kernel_status() == {"fast_path": False, "failed": [LINEAR], "reasons": {LINEAR: "disabled"}}
    assert "SPECDECODE_FAST_LINEAR=0" in build.extension_problems()[LINEAR]
    monkeypatch.delenv("SPECDECODE_FAST_LINEAR")
    if kernels.load_extension() is None:
        pytest.skip("the small-M kernel does not build here")
    assert kernels.fast_linear_available()
    assert kernel_status() == {"fast_path": True, "failed": [], "reasons": {}}


def test_the_fused_ops_switch_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_FUSED_OPS", "off")
    assert not fused.fused_ops_available()
    assert kernel_status()["reasons"] == {FUSED: "disabled"}


def test_a_cpu_without_avx2_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECDECODE_FAST_LINEAR", raising=False)
    monkeypatch.delenv("SPECDECODE_FUSED_OPS", raising=False)
    for module in (kernels, fused):  # as in a fresh process: nothing loaded yet
        monkeypatch.setattr(module, "build_extension", _built_without_avx2)
        monkeypatch.setattr(module, "_ext", None)
        monkeypatch.setattr(module, "_warned", True)
    monkeypatch.setattr(kernels, "_load_error", None)
    monkeypatch.setattr(kernels, "_load_reason", build.BUILD_FAILED)
    monkeypatch.setattr(fused, "_error", None)
    monkeypatch.setattr(fused, "_reason", build.BUILD_FAILED)
    assert not kernels.fast_linear_available() and not fused.fused_ops_available()
    assert kernel_status() == {"fast_path": False, "failed": sorted([FUSED, LINEAR]),
                               "reasons": {FUSED: "no_avx2", LINEAR: "no_avx2"}}
    assert "AVX2" in build.extension_problems()[LINEAR]


def test_a_failed_build_keeps_its_reason_name() -> None:
    build._STATUS["specdecode_smallm_linear"] = "could not build the C++ extension (no compiler)"
    assert kernel_status() == {"fast_path": False, "failed": [LINEAR], "reasons": {LINEAR: "build_failed"}}


def test_health_shows_the_reason_name_without_the_detail(server: RunningServer) -> None:
    build.report_fallback(LINEAR, "disabled", "SPECDECODE_FAST_LINEAR=0 in /home/someone/.profile")
    k = server.get("/health").json()["kernels"]
    assert k == {"fast_path": False, "failed": [LINEAR], "reasons": {LINEAR: "disabled"}}
    build.report_fallback(LINEAR, None)
    assert server.get("/health").json()["kernels"]["fast_path"] is True
