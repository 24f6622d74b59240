"""What the three distillation recipes share (``distill.py`` on corpus rollouts, ``distill_rollouts.py`` on
another run's rows, ``distill_xtok.py`` with the draft's own tokenizer): the recipe, its result, the bucketed
divergence, one optimizer step and the log line. Here, below all three, so each imports it one way."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from .evaluate import DraftEvalResult
from .loop import LoopState

LOSSES = ("fkl", "tv")


@dataclass
class DistillConfig:
    target: str = "models/code-target"
    out: str = "models/code-draft"
    run_dir: Optional[str] = None  # default: runs/<basename of out>
    corpus: list[str] = field(default_factory=list)
    steps: int = 3000
    batch_size: int = 16  # on-policy sequences per step (corpus batches hold the same number of tokens)
    dim: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: Optional[int] = 384
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    loss: str = "fkl"
    onpolicy_seqs: int = 768
    prompt_len: int = 64
    gen_len: int = 128
    greedy_frac: float = 0.5  # the rest of the on-policy rollouts are sampled at T=1
    corpus_seqs: int = 384  # plain corpus windows at the target's full context length
    corpus_mix: float = 0.3  # fraction of steps that train on corpus windows
    top_k: int = 64
    gen_batch: int = 128
    target_dtype: str = "bf16"
    seed: int = 0
    device: str = "auto"
    threads: int = 0
    amp: bool = True
    save_dtype: str = "bf16"
    ckpt_every: int = 200
    ckpt_minutes: float = 5.0
    log_every: int = 50
    max_minutes: Optional[float] = None
    stop_after: Optional[int] = None
    resume: bool = False
    eval_prompts: int = 64
    eval_prompt_len: int = 64
    eval_new_tokens: int = 128
    quick: bool = False
    tokenizer_vocab: Optional[int] = None  # set: the draft gets its own BPE (train/distill_xtok.py)
    # set: train on another run's cached rows and teacher (train/distill_rollouts.py), not corpus rollouts
    rollouts: Optional[str] = None
    prompts: Optional[str] = None  # with rollouts: the JSONL whose held-out prompts the evaluation answers
    init_layers: Optional[str] = None  # with rollouts: "0,29" starts the draft from these target blocks
    vocab_cut: Optional[int] = None  # with rollouts: train logits over the N tokens the target writes most

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / Path(self.out).name


# --quick: a tiny recipe that finishes in seconds on a CPU (tests, smoke runs); explicit flags still win.
QUICK = dict(steps=20, batch_size=4, dim=32, layers=1, heads=2, kv_heads=1, ffn=64, onpolicy_seqs=8, prompt_len=8,
             gen_len=8, corpus_seqs=4, top_k=8, gen_batch=8, warmup=3, ckpt_every=10, log_every=10,
             eval_prompts=4, eval_prompt_len=8, eval_new_tokens=8)


@dataclass
class DistillResult:
    out: Path
    steps: int
    params: int
    eval: Optional[DraftEvalResult]


def bucket_divergence(draft_logits: torch.Tensor, teacher_lp: torch.Tensor, teacher_idx: torch.Tensor,
                      kind: str) -> torch.Tensor:
    """Mean forward KL(p || q) or TV(p, q) between top-k + tail-bucket coarsenings of teacher p and draft q."""
    logq = torch.log_softmax(draft_logits.float(), -1)
    lq = logq.gather(-1, teacher_idx.long())
    lp = teacher_lp.float()
    p, q = lp.exp(), lq.exp()
    p_rest = (1 - p.sum(-1)).clamp_min(0.0)
    q_rest = (1 - q.sum(-1)).clamp_min(1e-12)
    if kind == "fkl":
        head = (p * (lp - lq)).sum(-1)
        tail = torch.xlogy(p_rest, p_rest) - p_rest * q_rest.log()
        return (head + tail).mean()
    if kind == "tv":
        return 0.5 * ((p - q).abs().sum(-1) + (p_rest - q_rest).abs()).mean()
    raise ValueError(f"unknown loss {kind!r}; use one of {', '.join(LOSSES)}")


def optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float) -> float:
    """One update from ``loss`` (backward, gradient clip, step); the loss as a number."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss.item()


def progress_line(cfg: DistillConfig) -> Callable[[LoopState, float, float], str]:
    """The loop's log line for a draft's distillation."""
    def line(s: LoopState, loss: float, lr: float) -> str:
        return (f"step {s.step} {cfg.loss} {loss:.4f} (ema {s.loss_ema:.4f}) lr {lr:.2e} {s.tok_s:,.0f} tok/s "
                f"elapsed {s.elapsed() / 60:.1f} min")

    return line
