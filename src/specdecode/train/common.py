"""Small pieces shared by pretraining and distillation: device, threads, init, LR, autocast."""

from __future__ import annotations

import math
import os
import random
from contextlib import nullcontext
from typing import ContextManager, Optional

import numpy as np
import torch

from ..models.config import ModelConfig
from ..models.llama import LlamaModel


def pick_device(device: Optional[str] = None) -> torch.device:
    """``auto``/None: CUDA when present, else CPU. An explicit cuda request without a GPU is an error."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but no CUDA GPU is available; use --device cpu")
    return dev


class ThreadGovernor:
    """``--threads 0``: all our cores while the machine is otherwise idle, one thread when it is busy.

    On a shared CPU every multi-threaded op waits for its slowest thread; with
    more runnable processes than cores that thread is often descheduled, and a
    2-thread step ran ~2x slower than a 1-thread one here. The 1-minute load
    average (minus our own threads) decides, re-checked every ``every`` steps.
    """

    def __init__(self, fixed: int, every: int = 10) -> None:
        self.fixed, self.every = fixed, every
        try:
            self.cores = len(os.sched_getaffinity(0))
        except AttributeError:
            self.cores = os.cpu_count() or 1
        torch.set_num_threads(fixed if fixed > 0 else self.cores)

    def update(self, step: int) -> int:
        if self.fixed > 0 or step % self.every:
            return torch.get_num_threads()
        others = os.getloadavg()[0] - torch.get_num_threads()
        want = self.cores if others < 0.75 else 1
        if want != torch.get_num_threads():
            torch.set_num_threads(want)
        return want


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def autocast(device: torch.device, enabled: bool) -> ContextManager:
    """bf16 autocast (fp32 master weights): ~1.6x faster on AVX-512-BF16 CPUs and any recent GPU."""
    if not enabled:
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def cosine_lr(step: int, progress: float, peak: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio * peak`` as ``progress`` goes 0 -> 1.

    ``progress`` is the fraction of the run done (by steps, or by wall clock
    under a time budget), so one schedule serves both kinds of run.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, max(0.0, progress))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def llama_config(vocab_size: int, dim: int, layers: int, heads: int, kv_heads: int, ffn: Optional[int],
                 max_len: int, bos: int, eos: int, tie: bool = True, rope_theta: float = 10000.0) -> ModelConfig:
    if dim % heads:
        raise ValueError(f"--dim {dim} must be divisible by --heads {heads}")
    if heads % kv_heads:
        raise ValueError(f"--heads {heads} must be divisible by --kv-heads {kv_heads}")
    if ffn is None:  # Llama's 8/3 * dim rounded up to a multiple of 64
        ffn = int(math.ceil(8 * dim / 3 / 64) * 64)
    return ModelConfig(architecture="LlamaForCausalLM", family="llama", vocab_size=vocab_size, dim=dim,
                       n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, head_dim=dim // heads,
                       intermediate_size=ffn, max_position_embeddings=max_len, norm_eps=1e-5,
                       tie_embeddings=tie, rope_theta=rope_theta, bos_token_id=bos, eos_token_ids=(eos,))


def init_llama(model: LlamaModel, std: float = 0.02) -> None:
    """GPT-2 style init: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers)."""
    resid_std = std / math.sqrt(2 * max(1, model.cfg.n_layers))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.fill_(1.0) if name.endswith("norm") else p.zero_()
            elif name.endswith(".wo") or name.endswith(".w2"):
                p.normal_(0.0, resid_std)
            else:
                p.normal_(0.0, std)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on norms/biases (1-D params), as usual."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def fmt_count(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"
