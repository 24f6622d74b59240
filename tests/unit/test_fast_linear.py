"""The small-M CPU linear kernel (specdecode.kernels) against F.linear."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdecode import kernels, ops
from specdecode.kernels import enable_fast_linear, fast_linear, fast_linear_available, fast_linear_enabled

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import build_model  # noqa: E402


@pytest.fixture(scope="module")
def ext():
    """The compiled extension; skips the module's kernel tests only if it cannot be built here."""
    e = kernels.load_extension()
    if e is None:
        pytest.skip(f"fast linear kernel unavailable: {kernels._load_error}")
    return e


@pytest.fixture(autouse=True)
def restore_linear_impl(monkeypatch):
    # the kernel is tested whatever SPECDECODE_FAST_LINEAR says (test_env_var_disables sets it)
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    previous = ops._linear_impl
    try:
        yield
    finally:
        ops.set_linear_impl(None)
        assert ops._linear_impl is F.linear
        ops.set_linear_impl(previous)


def _tol(k: int) -> dict:
    # fp32 rounding of a K-term dot product in a different summation order
    return dict(rtol=1e-5, atol=1e-5 * max(1.0, k ** 0.5))


SHAPES = [(7, 5), (33, 13), (257, 100), (64, 24), (512, 37)]  # (K, N): odd K, N not a multiple of 8/12


@pytest.mark.parametrize("m", list(range(1, 17)) + [23, 32, 48, 64])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_matches_f_linear(ext, m, wdtype, with_bias):
    g = torch.Generator().manual_seed(m)
    for k, n in SHAPES:
        x = torch.randn(m, k, generator=g)
        w = torch.randn(n, k, generator=g).to(wdtype)
        b = torch.randn(n, generator=g) if with_bias else None
        ref = F.linear(x, w.float(), b)
        y = fast_linear(x, w, b)
        assert y.dtype == torch.float32 and y.shape == (m, n)
        torch.testing.assert_close(y, ref, **_tol(k))
        # the kernel itself (not a silent fallback), AVX2 and portable scalar paths
        torch.testing.assert_close(ext.smallm_linear(x, w, b), ref, **_tol(k))
        torch.testing.assert_close(ext.smallm_linear(x, w, b, force_scalar=True), ref, **_tol(k))


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_leading_shapes(ext, wdtype):
    g = torch.Generator().manual_seed(1)
    k, n = 257, 100
    w = torch.randn(n, k, generator=g).to(wdtype)
    b = torch.randn(n, generator=g)
    for shape in [(1, 1, k), (1, 5, k), (1, 9, k), (2, 3, k), (4, 2, 2, k), (k,)]:
        x = torch.randn(*shape, generator=g)
        y = fast_linear(x, w, b)
        assert y.shape == (*shape[:-1], n)
        torch.testing.assert_close(y, F.linear(x, w.float(), b), **_tol(k))


def test_non_contiguous_input(ext):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 6, 70, generator=g)[..., 3:67]  # strided view, K=64
    w = torch.randn(40, 64, generator=g)
    torch.testing.assert_close(fast_linear(x, w), F.linear(x, w), **_tol(64))


def test_fallbacks_match_eager():
    """Cases the kernel does not take still give F.linear's answer (also without the kernel)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(24, 33, generator=g)
    b = torch.randn(24, generator=g)
    big = torch.randn(1, 70, 33, generator=g)  # M > 64: eager
    torch.testing.assert_close(fast_linear(big, w, b), F.linear(big, w, b))
    xd = torch.randn(3, 33, generator=g, dtype=torch.float64)  # fp64 x
    torch.testing.assert_close(fast_linear(xd, w.double(), b.double()), F.linear(xd, w.double(), b.double()))
    wt = torch.randn(33, 24, generator=g).t()  # non-contiguous weight
    x = torch.randn(2, 33, generator=g)
    torch.testing.assert_close(fast_linear(x, wt, b), F.linear(x, wt, b))
    # bf16 activations with bf16 weights: eager bf16
    xb, wb = x.bfloat16(), w.bfloat16()
    torch.testing.assert_close(fast_linear(xb, wb), F.linear(xb, wb))
    # bf16 weight (and bias) with fp32 x above 64 rows: cast to fp32, as the kernel computes
    torch.testing.assert_close(fast_linear(big, w.bfloat16(), b.bfloat16()),
                               F.linear(big, w.bfloat16().float(), b.bfloat16().float()), **_tol(33))
    empty = torch.randn(0, 33)
    assert fast_linear(empty, w, b).shape == (0, 24)


def test_autograd_falls_back(ext):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 16, generator=g, requires_grad=True)
    w = torch.randn(8, 16, generator=g, requires_grad=True)
    y = fast_linear(x, w)
    assert y.requires_grad
    y.sum().backward()
    torch.testing.assert_close(w.grad, x.detach().sum(0).expand(8, 16))


def test_inference_mode_parameters(ext):
    w = torch.nn.Parameter(torch.randn(20, 9), requires_grad=False)
    with torch.inference_mode():
        x = torch.randn(1, 4, 9)
        torch.testing.assert_close(fast_linear(x, w), F.linear(x, w), **_tol(9))


def test_enable_and_disable(ext):
    assert enable_fast_linear() is True
    assert fast_linear_enabled()
    assert ops._linear_impl is ext.linear
    x, w = torch.randn(2, 5), torch.randn(3, 5)
    torch.testing.assert_close(ops.linear(x, w), F.linear(x, w), **_tol(5))
    assert enable_fast_linear(False) is False
    assert ops._linear_impl is F.linear and not fast_linear_enabled()


def test_env_var_disables(ext, monkeypatch):
    monkeypatch.setenv(kernels.ENV_VAR, "0")
    assert fast_linear_available() is False
    assert enable_fast_linear() is False
    assert ops._linear_impl is F.linear
    x, w = torch.randn(2, 5), torch.randn(3, 5)
    torch.testing.assert_close(fast_linear(x, w), F.linear(x, w))


def test_build_failure_warns_once_and_falls_back(monkeypatch, caplog):
    """No compiler: one warning, enable returns False, F.linear stays."""
    import torch.utils.cpp_extension as cpp

    def broken_load(*args, **kwargs):
        raise RuntimeError("Error building extension 'x':\nc++: error: no such compiler")

    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    monkeypatch.setattr(cpp, "load", broken_load)
    monkeypatch.setattr(kernels, "_ext", None)
    monkeypatch.setattr(kernels, "_load_error", None)
    monkeypatch.setattr(kernels, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="specdecode.kernels"):
        assert fast_linear_available() is False
        assert enable_fast_linear() is False
        x, w, b = torch.randn(2, 5), torch.randn(3, 5).bfloat16(), torch.randn(3)
        torch.testing.assert_close(fast_linear(x, w, b), F.linear(x, w.float(), b))
    assert ops._linear_impl is F.linear
    warnings = [r for r in caplog.records if r.name == "specdecode.kernels"]
    assert len(warnings) == 1
    assert "no such compiler" in warnings[0].getMessage()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from specdecode.models import load_model

    path = build_model(tmp_path_factory.mktemp("fast_linear") / "m", "llama")
    return load_model(path)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])  # biases on the projections
def test_other_archs_logits_match(ext, tmp_path, arch):
    from specdecode.models import load_model

    model = load_model(build_model(tmp_path / arch, arch))
    ids = torch.randint(0, model.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    ops.set_linear_impl(None)
    ref = model.forward(ids, model.new_cache(1, 64))
    assert enable_fast_linear() is True
    got = model.forward(ids, model.new_cache(1, 64))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("t", [1, 2, 5, 9, 16, 20])
def test_llama_logits_match(ext, tiny_llama, t):
    model = tiny_llama
    ids = torch.randint(0, model.vocab_size, (1, t), generator=torch.Generator().manual_seed(t))
    ops.set_linear_impl(None)
    ref = model.forward(ids, model.new_cache(1, 64))
    assert enable_fast_linear() is True
    got = model.forward(ids, model.new_cache(1, 64))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_llama_decode_steps_match(ext, tiny_llama):
    """Prefill, then verify blocks of 1..5 tokens against the cache, both impls."""
    model = tiny_llama
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, model.vocab_size, (1, 20), generator=g)
    blocks = [torch.randint(0, model.vocab_size, (1, n), generator=g) for n in (1, 3, 5, 2)]

    def run() -> list[torch.Tensor]:
        cache = model.new_cache(1, 64)
        outs = [model.forward(prompt, cache)]
        outs += [model.forward(b, cache) for b in blocks]
        return outs

    ops.set_linear_impl(None)
    ref = run()
    assert enable_fast_linear() is True
    got = run()
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [1, 3, 7, 9, 16])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_multithreaded_shapes(ext, m, wdtype):
    """Big enough to be split across threads (and to use the next-tile prefetch)."""
    g = torch.Generator().manual_seed(10 + m)
    k, n = 515, 1003
    x = torch.randn(1, m, k, generator=g)
    w = torch.randn(n, k, generator=g).to(wdtype)
    b = torch.randn(n, generator=g)
    torch.testing.assert_close(fast_linear(x, w, b), F.linear(x, w.float(), b), **_tol(k))


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_independent_of_m(ext, wdtype):
    """Each output row is bit-identical whatever M is and wherever the row sits (same summation
    order), so verifying gamma+1 tokens at once gives exactly the logits of one-at-a-time decoding."""
    g = torch.Generator().manual_seed(5)
    k, n = 515, 1003
    w = torch.randn(n, k, generator=g).to(wdtype)
    b = torch.randn(n, generator=g)
    x = torch.randn(16, k, generator=g)
    singles = torch.cat([fast_linear(x[i:i + 1], w, b) for i in range(16)])
    for m in range(1, 17):
        assert torch.equal(fast_linear(x[:m], w, b), singles[:m])
        assert torch.equal(fast_linear(x[16 - m:], w, b), singles[16 - m:])
