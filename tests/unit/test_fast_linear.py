"""The small-M CPU linear kernel (specdecode.kernels) against F.linear."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdecode import kernels
from specdecode.config import ConfigError
from specdecode.kernels import EAGER, fast_linear, fast_linear_available, select_kernels

CPU = torch.device("cpu")

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
def kernel_env(monkeypatch):
    # the kernel is tested whatever SPECDECODE_FAST_LINEAR says (test_env_var_disables sets it)
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)


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


def test_select_kernels(ext):
    """fast on the CPU: the extension's entry points (C++ calls them by address); otherwise eager."""
    k = select_kernels(True, "fp32", CPU)
    assert k.fast and k.mode == "fp32" and k.linear is ext.linear
    assert k.native == (int(ext.linear_address()), False)
    x, w = torch.randn(2, 5), torch.randn(3, 5)
    torch.testing.assert_close(k.linear(x, w, None), F.linear(x, w), **_tol(5))
    assert select_kernels(False, "fp32", CPU) is EAGER and not EAGER.fast and EAGER.linear is F.linear
    assert select_kernels(True, "bf16", torch.device("meta")) is EAGER  # not a CPU: the kernel does not apply
    assert EAGER.describe() == "eager" and k.describe().startswith(f"fp32/{ext.isa()}")


def test_env_var_disables(ext, monkeypatch, tmp_path):
    monkeypatch.setenv(kernels.ENV_VAR, "0")
    assert fast_linear_available() is False
    assert select_kernels(True, "bf16", CPU) is EAGER
    from specdecode.models import load_model

    model = load_model(build_model(tmp_path / "m", "llama"))  # the default asks for fast: the env var wins
    assert model.kernels is EAGER and not model.fast
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
        assert select_kernels(True, "bf16", CPU) is EAGER
        x, w, b = torch.randn(2, 5), torch.randn(3, 5).bfloat16(), torch.randn(3)
        torch.testing.assert_close(fast_linear(x, w, b), F.linear(x, w.float(), b))
    warnings = [r for r in caplog.records if r.name == "specdecode.kernels"]
    assert len(warnings) == 1
    assert "no such compiler" in warnings[0].getMessage()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(fast, eager): one checkpoint loaded with the default kernels and with ``fast=False``."""
    from specdecode.models import load_model

    path = build_model(tmp_path_factory.mktemp("fast_linear") / "m", "llama")
    return load_model(path, kv_dtype="fp32"), load_model(path, fast=False)  # the eager one's fp32 KV cache


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])  # biases on the projections
def test_other_archs_logits_match(ext, tmp_path, arch):
    from specdecode.models import load_model

    path = build_model(tmp_path / arch, arch)
    model, eager = load_model(path, kv_dtype="fp32"), load_model(path, fast=False)
    assert model.fast and not eager.fast
    ids = torch.randint(0, model.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    ref = eager.forward(ids, eager.new_cache(1, 64))
    got = model.forward(ids, model.new_cache(1, 64))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("t", [1, 2, 5, 9, 16, 20])
def test_llama_logits_match(ext, tiny_llama, t):
    model, eager = tiny_llama
    ids = torch.randint(0, model.vocab_size, (1, t), generator=torch.Generator().manual_seed(t))
    ref = eager.forward(ids, eager.new_cache(1, 64))
    got = model.forward(ids, model.new_cache(1, 64))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_llama_decode_steps_match(ext, tiny_llama):
    """Prefill, then verify blocks of 1..5 tokens against the cache, both impls."""
    fast, eager = tiny_llama
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, fast.vocab_size, (1, 20), generator=g)
    blocks = [torch.randint(0, fast.vocab_size, (1, n), generator=g) for n in (1, 3, 5, 2)]

    def run(model) -> list[torch.Tensor]:
        cache = model.new_cache(1, 64)
        outs = [model.forward(prompt, cache)]
        outs += [model.forward(b, cache) for b in blocks]
        return outs

    ref = run(eager)
    got = run(fast)
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


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_short_calls_one_stream_or_blocks_same_bits(ext, wdtype):
    """A call of up to ``kOneStreamMaxRows`` token rows (a decode step, a short verification pass) reads its weight
    rows as one stream where asked (blocks of rows by default): both walks, on every path this CPU has and in
    bf16-dot mode, for calls of 1 to 7 rows (past the limit: blocks), give the bits a 16-row call gives those rows."""
    g = torch.Generator().manual_seed(9)
    k, n = 515, 1100  # over 1 MiB in bf16 too: the one-stream walk applies
    w = torch.randn(n, k, generator=g).to(wdtype)
    b = torch.randn(n, generator=g)
    x = torch.randn(16, k, generator=g)

    def in_calls(m: int, isa: str, dot: bool, own: int = 0) -> torch.Tensor:
        return torch.cat([ext.smallm_linear(x[i:i + m], w, b, bf16_dot=dot, isa=isa, streams=own)
                          for i in range(0, 16, m)])

    before = ext.set_streams(4)
    try:
        for isa in ISAS[: _ISA_LEVEL[ext.best_isa()] + 1]:
            for dot in (False, True):
                batch = ext.smallm_linear(x, w, b, bf16_dot=dot, isa=isa)
                for streams in (1, 4, 0):
                    ext.set_streams(streams)
                    for m in (1, 2, 3, 5, 6, 7):
                        assert torch.equal(in_calls(m, isa, dot), batch), (isa, dot, streams, m)
                        for own in (1, 4):  # a call's own choice (a model's) over the process setting
                            assert torch.equal(in_calls(m, isa, dot, own), batch), (isa, dot, streams, m, own)
        assert kernels.set_kernel_streams(0) in (1, 4) and kernels.kernel_streams() == 4  # blocks unless asked
        with pytest.raises(RuntimeError, match="streams must be 1, 4 or 0"):
            ext.set_streams(2)
    finally:
        ext.set_streams(before)


def test_a_model_past_the_last_level_cache_reads_one_stream_on_amd(ext, tmp_path, monkeypatch):
    """``for_weights``: on an AMD CPU a model whose dense weights exceed the last-level cache runs the one-stream
    linear (its decode steps read weights from memory), one held in cache keeps the blocks (bound by arithmetic,
    where one row at a time is slower), and ``SPECDECODE_KERNEL_STREAMS`` sets every model's instead. The same
    bits either way, through the fused stack's native call too (a head over 1 MiB, so the walk differs)."""
    llc = kernels.last_level_cache_bytes()
    if llc is None:
        pytest.skip("no cache sizes in sysfs here")
    monkeypatch.delenv("SPECDECODE_KERNEL_STREAMS", raising=False)
    from specdecode.models import load_model

    model = load_model(build_model(tmp_path / "m", vocab_size=9000, hidden=64))  # bf16 head: 1.1 MiB
    base = model.kernels
    assert base.streams == 0 and kernels.for_weights(base, llc // 2) is base
    big = kernels.for_weights(base, llc + 1)
    if not ext.is_amd():
        assert big is base
        return
    assert big.streams == 1 and big.linear in (ext.linear_one, ext.linear_bf16_dot_one)
    assert big.native is not None and base.native is not None and big.native[0] != base.native[0]
    monkeypatch.setenv("SPECDECODE_KERNEL_STREAMS", "4")
    assert kernels.for_weights(base, llc + 1) is base
    ids = torch.tensor([[5, 17, 3, 99, 42]])
    out = {}
    for name, k in (("blocks", base), ("one", big)):
        model.kernels = k
        with torch.inference_mode():
            cache = model.new_cache(1, 16)
            steps = [model.forward(ids, cache)[0, -1]]
            for t in (7, 8, 9):  # one-token calls: the walk the choice changes
                steps.append(model.forward(torch.tensor([[t]]), cache)[0, -1])
        out[name] = torch.stack(steps)
    assert torch.equal(out["blocks"], out["one"])


# ---------------------------------------------------------------- code paths (ISAs) and bf16-dot mode

ISAS = ["scalar", "avx2", "avx512", "avx512bf16", "amx"]
_ISA_LEVEL = {name: i for i, name in enumerate(ISAS)}


def _require(ext, isa: str) -> None:
    if _ISA_LEVEL[isa] > _ISA_LEVEL[ext.best_isa()]:
        pytest.skip(f"this CPU lacks {isa} (best path here: {ext.best_isa()})")


def test_cpu_feature_flags(ext):
    best = ext.best_isa()
    assert best in ISAS
    assert ext.has_avx2() == (_ISA_LEVEL[best] >= _ISA_LEVEL["avx2"])
    assert ext.has_avx512() == (_ISA_LEVEL[best] >= _ISA_LEVEL["avx512"])
    assert ext.has_avx512_bf16() == (_ISA_LEVEL[best] >= _ISA_LEVEL["avx512bf16"])
    assert ext.has_amx() == (best == "amx")


def test_set_isa_round_trip(ext):
    previous = ext.set_isa("scalar")
    try:
        assert ext.isa() == "scalar" and kernels.kernel_isa() == "scalar"
        x, w = torch.randn(3, 19), torch.randn(7, 19)
        torch.testing.assert_close(fast_linear(x, w), F.linear(x, w), **_tol(19))
        with pytest.raises(RuntimeError, match="unknown ISA"):
            ext.set_isa("sse9")
        if not ext.has_avx512_bf16():
            with pytest.raises(RuntimeError, match="does not support"):
                ext.set_isa("avx512bf16")
        assert kernels.set_kernel_isa("auto") == "scalar"
        assert ext.isa() == ext.best_isa()
    finally:
        ext.set_isa(previous)
    with pytest.raises(RuntimeError, match="unknown isa"):
        ext.smallm_linear(torch.randn(1, 4), torch.randn(2, 4), isa="sse9")


def test_env_var_forces_isa(ext, tmp_path):
    """SPECDECODE_KERNEL_ISA is read when the extension loads (a fresh process, the build is cached)."""
    import os
    import subprocess

    code = "from specdecode import kernels; print(kernels.load_extension().isa())"
    env = dict(os.environ, SPECDECODE_KERNEL_ISA="scalar")
    env.pop(kernels.ENV_VAR, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "scalar"


# odd K (not a multiple of 8/16/32: vector tails), N not a multiple of the register blocks or tiles; K a
# multiple of 32 with N a multiple of 16 or not (the AMX path's tiles and its tail rows)
ISA_SHAPES = [(7, 5), (33, 13), (257, 100), (64, 24), (512, 37), (95, 49), (64, 37), (96, 48), (576, 50)]
ISA_MS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 23, 33, 64]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_isa_matches_f_linear(ext, isa, wdtype):
    _require(ext, isa)
    g = torch.Generator().manual_seed(11)
    for k, n in ISA_SHAPES:
        w = torch.randn(n, k, generator=g).to(wdtype)
        b = torch.randn(n, generator=g)
        for m in ISA_MS:
            x = torch.randn(m, k, generator=g)
            ref = F.linear(x, w.float(), b)
            torch.testing.assert_close(ext.smallm_linear(x, w, b, isa=isa), ref, **_tol(k))
            if m in (1, 5, 9):
                torch.testing.assert_close(ext.smallm_linear(x, w, isa=isa), F.linear(x, w.float()), **_tol(k))


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_dot_matches_rounded_reference(ext, isa):
    """x rounded to bf16, exact products: F.linear on the rounded x up to fp32 summation order."""
    _require(ext, isa)
    g = torch.Generator().manual_seed(12)
    for k, n in ISA_SHAPES:
        w = torch.randn(n, k, generator=g).bfloat16()
        b = torch.randn(n, generator=g)
        for m in ISA_MS:
            x = torch.randn(m, k, generator=g)
            ref = F.linear(x.bfloat16().float(), w.float(), b)
            y = ext.smallm_linear(x, w, b, bf16_dot=True, isa=isa)
            torch.testing.assert_close(y, ref, **_tol(k))
    # an fp32 weight ignores the mode: the exact fp32 path, bit for bit
    x, w32 = torch.randn(5, 257, generator=g), torch.randn(40, 257, generator=g)
    assert torch.equal(ext.smallm_linear(x, w32, bf16_dot=True, isa=isa), ext.smallm_linear(x, w32, isa=isa))


def test_bf16_dot_rounding_edge_cases(ext):
    """Ties to even, a NaN and infinities in x go through as x.bfloat16() rounds them."""
    for k in (40, 64):  # 64: the AMX path's tiles where it runs
        _rounding_edge_cases(ext, k)


def _rounding_edge_cases(ext, k: int) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(13))
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (-> 1); 1 + 3 * 2^-8 ties to 1 + 2^-6
    x[0, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38])
    x[1, 5] = float("inf")
    x[2, 7] = float("nan")
    w = torch.ones(6, k).bfloat16()
    ref = F.linear(x.bfloat16().float(), w.float())
    for isa in ISAS:
        if _ISA_LEVEL[isa] > _ISA_LEVEL[ext.best_isa()]:
            continue
        y = ext.smallm_linear(x, w, bf16_dot=True, isa=isa)
        torch.testing.assert_close(y[0], ref[0], **_tol(k))
        assert torch.isinf(y[1]).all() and (y[1] > 0).all()
        assert torch.isnan(y[2]).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("mode", ["fp32w", "bf16w", "bf16dot", "bf16dot-k512"])
def test_isa_rows_independent_of_m(ext, isa, mode):
    """Bit-identical rows whatever M (including M that split into several register blocks or AMX tiles)
    and position. K 512 (a multiple of 32) is where the AMX path runs its tiles."""
    _require(ext, isa)
    g = torch.Generator().manual_seed(14)
    k, n, rows = (512 if mode.endswith("k512") else 515), 203, 64
    w = torch.randn(n, k, generator=g)
    if mode != "fp32w":
        w = w.bfloat16()
    b = torch.randn(n, generator=g)
    x = torch.randn(rows, k, generator=g)
    dot = mode.startswith("bf16dot")
    singles = torch.cat([ext.smallm_linear(x[i:i + 1], w, b, bf16_dot=dot, isa=isa) for i in range(rows)])
    for m in [2, 3, 5, 7, 8, 9, 12, 13, 16, 17, 20, 33, 49, 64]:
        assert torch.equal(ext.smallm_linear(x[:m], w, b, bf16_dot=dot, isa=isa), singles[:m]), m
        assert torch.equal(ext.smallm_linear(x[rows - m:], w, b, bf16_dot=dot, isa=isa), singles[rows - m:]), m


def test_matmul_bf16_selects_bf16_dot(ext, tmp_path):
    k = select_kernels(True, "bf16", CPU)
    assert k.linear is ext.linear_bf16_dot and k.mode == "bf16_dot"
    assert k.native == (int(ext.linear_address()), True)
    g = torch.Generator().manual_seed(15)
    w, b = torch.randn(30, 33, generator=g).bfloat16(), torch.randn(30, generator=g)
    for shape in [(1, 5, 33), (70, 33)]:  # the kernel, and the eager fallback above 64 rows
        x = torch.randn(*shape, generator=g)
        ref = F.linear(x.bfloat16().float(), w.float(), b)
        torch.testing.assert_close(k.linear(x, w, b), ref, **_tol(33))
        torch.testing.assert_close(kernels.fast_linear_bf16(x, w, b), ref, **_tol(33))
    x = torch.randn(4, 33, generator=g)
    w32 = torch.randn(30, 33, generator=g)
    assert torch.equal(k.linear(x, w32, b), fast_linear(x, w32, b))  # fp32 weights: unaffected
    from specdecode.models import load_model

    path = build_model(tmp_path / "m", "llama")
    assert load_model(path).kernels.mode == "bf16_dot"  # the default, as the CLI's --matmul
    assert load_model(path, matmul="fp32").kernels.mode == "fp32"
    with pytest.raises(ConfigError, match="matmul must be one of bf16, fp32"):
        load_model(path, matmul="fp16")


def test_fast_linear_bf16_without_kernel(monkeypatch):
    """Without the extension fast_linear_bf16 still computes the bf16-dot math (eagerly)."""
    monkeypatch.setenv(kernels.ENV_VAR, "0")
    g = torch.Generator().manual_seed(16)
    x, w, b = torch.randn(3, 21, generator=g), torch.randn(8, 21, generator=g).bfloat16(), torch.randn(8, generator=g)
    torch.testing.assert_close(kernels.fast_linear_bf16(x, w, b), F.linear(x.bfloat16().float(), w.float(), b))
    w32 = w.float()
    torch.testing.assert_close(kernels.fast_linear_bf16(x, w32, b), F.linear(x, w32, b))


@pytest.mark.parametrize("bf16_dot", [False, True])
def test_prefill_sized_bf16_calls_run_in_chunks_bit_identical_to_single_rows(bf16_dot: bool) -> None:
    """More than MAX_M rows with a bf16 weight: the kernel in chunks, each row equal to its 1-row call."""
    if not fast_linear_available():
        pytest.skip("kernel unavailable")
    ext = kernels.load_extension()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 75, 37, generator=g)  # 150 rows: 64 + 64 + 22
    w = torch.randn(29, 37, generator=g).bfloat16()
    b = torch.randn(29, generator=g)
    y = ext.linear(x, w, b, bf16_dot=bf16_dot)
    assert y.shape == (2, 75, 29)
    rows = x.reshape(-1, 37)
    singles = torch.cat([ext.linear(rows[i : i + 1], w, b, bf16_dot=bf16_dot) for i in range(rows.shape[0])])
    assert torch.equal(y.reshape(-1, 29), singles)
    xr = x.bfloat16().float() if bf16_dot else x
    torch.testing.assert_close(y, F.linear(xr, w.float(), b), rtol=1e-5, atol=1e-5)
