"""The quantized CPU kernel (int8 / int4 blocks): against an fp64 reference, batch invariance, its ISA paths,
and clear errors for a bad --weight-dtype."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from specdecode.config import ConfigError, ModelLoadConfig
from specdecode.kernels import quant as Q

ext = Q.load_quant_extension()
ISAS = tuple(ext.supported_isas())  # this CPU's paths, scalar first; the others are absent here


def _case(k: int, n: int = 37, m: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g), torch.randn(m, k, generator=g), torch.randn(n, generator=g)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("k", [16, 144, 512])
@pytest.mark.parametrize("isa", ISAS)
def test_kernel_matches_reference(fmt: str, k: int, isa: str) -> None:
    w, x, b = _case(k)
    p = Q.quantize(w, fmt)
    ref = ext.reference(x, p) + b.double()
    y = ext.quant_linear(x, p, b, isa).double()
    assert (y - ref).abs().max().item() < 1e-5 * max(1.0, ref.abs().max().item())
    # and the reference is the product of the dequantized weights with (int8-rounded) activations
    dense = x.double() @ Q.dequantize(p, k).double().T + b.double()
    assert (y - dense).abs().max().item() < 0.03 * dense.abs().max().item()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantization_error_is_bounded(fmt: str) -> None:
    w, _, _ = _case(200, n=64)
    deq = Q.dequantize(Q.quantize(w, fmt), 200)
    blocks = torch.nn.functional.pad(w, (0, 56)).view(64, -1, 32).abs().amax(-1)
    step = blocks / (127 if fmt == "int8" else 8)  # a block's quantization step
    err = torch.nn.functional.pad((deq - w).abs(), (0, 56)).view(64, -1, 32).amax(-1)
    # int8: half a step; int4 (Q4_0): the peak's side has 8 steps, the other 7, so a value there can be
    # clamped by up to one step
    bound = step * (0.5 if fmt == "int8" else 1.0) * 1.01 + 1e-6
    assert bool((err <= bound).all())
    assert (deq - w).abs().mean() < step.mean() * 0.3  # and typical errors are a fraction of a step


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("isa", ISAS)
def test_rows_are_batch_invariant(fmt: str, isa: str) -> None:
    # 149 rows: two chunks of the one-row path's 4 side-by-side groups, one group alone, a plain tail
    w, x, b = _case(512, n=149, m=13)
    p = Q.quantize(w, fmt)
    for m in (5, 13):  # one register block, and several; each row against the one-row (decode) path
        y = ext.quant_linear(x[:m].contiguous(), p, b, isa)
        for i in range(m):
            assert torch.equal(y[i], ext.quant_linear(x[i:i + 1].contiguous(), p, b, isa)[0]), (m, i)


def test_isa_paths_agree_bit_for_bit() -> None:
    # every path computes acc = fma(float(exact block dot), d_w * d_x, acc) block by block per column
    if len(ISAS) < 2:
        pytest.skip("only the scalar path on this CPU")
    for fmt in ("int8", "int4"):
        # whole groups of 16 rows, groups plus a plain tail, and one token row (the decode path, which
        # reads 4 groups side by side: 149 rows are two such chunks, a group alone and a tail)
        for n, m in ((64, 5), (37, 9), (149, 1), (64, 1)):
            w, x, b = _case(1408, n=n, m=m)
            p = Q.quantize(w, fmt)
            ys = [ext.quant_linear(x, p, b, isa) for isa in ISAS]
            for isa, y in zip(ISAS[1:], ys[1:]):
                assert torch.equal(y, ys[0]), (fmt, n, isa)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("n,k", [(48, 96), (37, 144), (5, 16)])
def test_kernel_reads_the_packed_layout(fmt: str, n: int, k: int) -> None:
    # one-hot activations quantize to 127 * (1 / 127): the products read back each weight, so the
    # kernel's view of the interleaved groups and the plain tail rows must match dequantize's
    w, _, _ = _case(k, n=n)
    p = Q.quantize(w, fmt)
    deq = Q.dequantize(p, k).double()
    eye = torch.eye(k)
    assert torch.allclose(ext.reference(eye, p).T, deq, rtol=1e-6, atol=1e-9)
    for isa in ISAS:
        assert torch.allclose(ext.quant_linear(eye, p, None, isa).T.double(), deq, rtol=1e-6, atol=1e-9), isa
    assert p.shape == (n, ext.row_bytes(k, fmt == "int4"))


@pytest.mark.slow
def test_env_forces_the_avx2_path() -> None:
    if "avx2" not in ISAS:
        pytest.skip("no AVX2 here")
    code = "from specdecode.kernels.quant import quant_isa; print(quant_isa())"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SPECDECODE_KERNEL_ISA": "avx2"})
    assert out.stdout.strip().splitlines()[-1] == "avx2", out.stderr


@pytest.mark.slow
def test_env_asks_for_avx_vnni_and_steps_down_where_it_is_absent() -> None:
    if "avx2" not in ISAS:
        pytest.skip("no AVX2 here")
    code = "from specdecode.kernels.quant import quant_isa; print(quant_isa())"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SPECDECODE_KERNEL_ISA": "avxvnni"})
    assert out.stdout.strip().splitlines()[-1] == ("avxvnni" if "avxvnni" in ISAS else "avx2"), out.stderr
    assert "SPECDECODE_KERNEL_ISA" not in out.stderr  # the dense kernel's avx2 is what was asked: no warning


def test_set_isa_takes_each_path_this_cpu_has_and_refuses_the_others() -> None:
    before = Q.quant_isa()
    try:
        for isa in ("scalar", "avx2", "avxvnni", "vnni512"):
            if isa in ISAS:
                Q.set_quant_isa(isa)
                assert Q.quant_isa() == isa
            else:
                with pytest.raises(RuntimeError, match="does not support"):
                    Q.set_quant_isa(isa)
        with pytest.raises(RuntimeError, match="unknown ISA .* avxvnni"):
            Q.set_quant_isa("neon")
    finally:
        Q.set_quant_isa(before)


def test_linear_dispatches_dense_and_packed() -> None:
    from specdecode.kernels import Kernels, select_kernels

    dense = select_kernels(True, "fp32", torch.device("cpu"))
    if not dense.fast:
        pytest.skip("fast kernel unavailable")
    k8 = Q.quantized_kernels(dense, "int8")
    w, x, b = _case(64, n=8, m=3)
    assert torch.allclose(k8.linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5)
    p = Q.quantize(w, "int8")
    assert torch.equal(k8.linear(x.view(1, 3, 64), p, b)[0], ext.quant_linear(x, p, b, None))
    assert isinstance(k8, Kernels) and k8.mode.startswith("int8")


def test_bad_weight_dtype_is_a_clear_error(tiny_dirs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="weight_dtype must be one of .*int8, int4"):
        ModelLoadConfig(weight_dtype="int3")
    from specdecode.models import load_model

    with pytest.raises(ConfigError, match="int8, int4"):
        load_model(tiny_dirs["llama"], weight_dtype="q4_0")
    with pytest.raises(ConfigError, match="fp32 activations"):
        load_model(tiny_dirs["llama"], dtype="bf16", weight_dtype="int8")
    with pytest.raises(ConfigError, match="fast CPU kernel"):
        load_model(tiny_dirs["llama"], weight_dtype="int4", fast=False)


def test_cli_rejects_a_bad_weight_dtype(tiny_dirs, capsys) -> None:  # type: ignore[no-untyped-def]
    from specdecode.cli import main

    assert main(["generate", "--target", str(tiny_dirs["llama"]), "--prompt", "x", "--weight-dtype", "int3"]) != 0
    err = capsys.readouterr().err
    assert "weight_dtype must be one of" in err and "int4" in err and "Traceback" not in err


def test_results_do_not_depend_on_the_thread_count() -> None:
    w, x, b = _case(896, n=300, m=5)
    p = Q.quantize(w, "int8")
    before = torch.get_num_threads()
    try:
        for xs in (x, x[:1].contiguous()):  # a verification pass and a decode step
            torch.set_num_threads(1)
            one = ext.quant_linear(xs, p, b, None)
            torch.set_num_threads(2)
            two = ext.quant_linear(xs, p, b, None)
            assert torch.equal(one, two)  # threads split output columns only
    finally:
        torch.set_num_threads(before)
