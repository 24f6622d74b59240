"""Kernels belong to a loaded model: the documented API runs the C++ kernel by default, and two models
in one process may run different kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

import specdecode
from specdecode import kernels
from specdecode.sizing.book import cost_key
from specdecode.kernels import EAGER, set_kernel_streams
from specdecode.kernels.fused import load_fused_extension
from specdecode.models.llama import LlamaModel


@pytest.fixture
def exts(monkeypatch: pytest.MonkeyPatch):
    """(small-M linear, fused ops) extensions, with the env switches cleared; skips where they cannot build."""
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    monkeypatch.delenv("SPECDECODE_FUSED_OPS", raising=False)
    linear, fused = kernels.load_extension(), load_fused_extension()
    if linear is None or fused is None:
        pytest.skip("the C++ extensions cannot be built here")
    return linear, fused


def count_stack_calls(monkeypatch: pytest.MonkeyPatch, fused) -> list[int]:
    """Count calls into the fused extension's whole-stack forward (one per fused model pass)."""
    calls = [0]
    real: Callable = fused.stack_forward

    def counting(*args):
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(fused, "stack_forward", counting)
    return calls


def test_documented_api_runs_the_kernel(exts, tiny_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """README's API path, nothing else: load_model(dir) then generate runs the C++ kernel and fused ops."""
    linear, fused = exts
    target = specdecode.load_model(tiny_dirs["llama"])
    draft = specdecode.load_model(tiny_dirs["draft"])
    for m in (target, draft):
        assert m.fast and m.kernels.linear is linear.linear_bf16_dot and m.kernels.fused is fused
        assert m.kernels.native == (int(linear.linear_address()), True)  # the C++ stack calls the kernel
    calls = count_stack_calls(monkeypatch, fused)
    r = specdecode.generate(target, "def add(a, b):", drafter=specdecode.DraftModelDrafter(draft, gamma=3),
                            max_new_tokens=16, ignore_eos=True)
    assert len(r.token_ids) == 16
    assert calls[0] >= r.stats.target_passes > 0  # every target pass (and draft step) went through C++


def test_two_models_in_one_process_run_their_own_kernels(exts, tiny_dirs: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An eager baseline beside a fast model, interleaved: each keeps its kernels, and both agree."""
    linear, fused = exts
    fast = specdecode.load_model(tiny_dirs["llama"], kv_dtype="fp32")  # the eager one's cache storage
    eager = specdecode.load_model(tiny_dirs["llama"], fast=False)
    assert eager.kernels is EAGER and not eager.fast and fast.fast
    assert all(layer.kernels is EAGER for layer in eager.module.layers)
    assert all(layer.kernels is fast.kernels for layer in fast.module.layers)
    calls = count_stack_calls(monkeypatch, fused)
    runs = []
    for model in (eager, fast, eager):
        before = calls[0]
        runs.append(specdecode.generate(model, "def fib(n):", max_new_tokens=8, ignore_eos=True))
        assert (calls[0] > before) == (model is fast)
    assert runs[0].token_ids == runs[2].token_ids
    ids = torch.randint(1, fast.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fast.forward(ids, fast.new_cache(1, 16)), eager.forward(ids, eager.new_cache(1, 16)),
                               rtol=1e-4, atol=1e-4)
    # the cost cache keys them apart: their timings differ; and a fast model's by its weight-stream layout
    assert cost_key([fast]) != cost_key([eager])
    before = set_kernel_streams(1)
    try:
        one, eager_one = cost_key([fast]), cost_key([eager])
        set_kernel_streams(4)
        assert cost_key([fast]) != one and cost_key([eager]) == eager_one  # eager models: no such layout
    finally:
        set_kernel_streams(before)


def test_a_module_built_for_training_runs_eager(tiny_dirs: dict[str, Path]) -> None:
    model = specdecode.load_model(tiny_dirs["llama"])
    module = LlamaModel(model.config, 32)
    assert module.kernels is EAGER and all(layer.kernels is EAGER for layer in module.layers)


def test_loading_a_model_never_computes_on_the_meta_device(tiny_dirs: dict[str, Path]) -> None:
    """Arithmetic on a meta tensor first imports torch's symbolic-shape machinery (sympy and ~800 modules):
    1.1-1.3 s of every model load, server start and `generate`, until the RoPE tables were built on the CPU."""
    import subprocess
    import sys

    code = ("import sys, specdecode as sd\n"
            f"m = sd.load_model({str(tiny_dirs['llama'])!r}, weight_dtype='int4')\n"
            "sd.models.loading.quantized_copy(m, 'int8', n_layers=1)\n"
            "print(m.module.rope_cos.device, 'sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["cpu", "False"]
