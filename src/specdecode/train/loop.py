"""The outer training loop and checkpoint resume shared by ``pretrain`` and ``distill``.

The two commands differ only in the work of one optimizer step; everything around it (step count or
``--max-minutes`` budget with a bar counting steps or seconds, warmup + cosine LR from progress, the CPU
thread governor, checkpoint-on-signal, the loss finiteness check, loss and tokens/s EMAs, periodic
checkpoints, ``--stop-after`` and ``--resume``) lives here once so their run and resume semantics
cannot drift apart.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import torch
from tqdm import tqdm

from .checkpoint import install_stop_handler, load_checkpoint, save_checkpoint
from .common import ThreadGovernor, cosine_lr, rng_state, set_rng_state


def log(msg: str) -> None:
    """A plain stderr line that does not break the progress bar."""
    tqdm.write(msg, file=sys.stderr)


class LoopConfig(Protocol):
    """The recipe fields the loop reads (``PretrainConfig`` and ``DistillConfig`` both have them)."""

    steps: int
    lr: float
    warmup: int
    min_lr_ratio: float
    max_minutes: Optional[float]
    log_every: int
    ckpt_every: int
    ckpt_minutes: float
    stop_after: Optional[int]


@dataclass
class LoopState:
    """Where a run stands: the loop updates it, ``save`` and log callbacks read it."""

    step: int = 0
    elapsed_before: float = 0.0  # seconds trained by earlier invocations of this run
    tokens_seen: int = 0
    loss_ema: Optional[float] = None
    tok_s: float = 0.0  # EMA of training tokens per second
    stopped: bool = False  # --stop-after ended this invocation before the run was done
    t0: float = 0.0  # wall clock when this invocation's loop started
    progress: float = 0.0  # the schedule's progress (0..1) at the step running now: steps or time, the further

    def elapsed(self) -> float:
        """Seconds trained so far, this invocation and earlier ones together."""
        return self.elapsed_before + time.time() - self.t0


def save_run(run_dir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, model_config: dict[str, Any],
             state: LoopState, extra: dict[str, Any]) -> None:
    """Checkpoint what ``resume`` restores (model, optimizer, step, RNG, shape, time trained) plus ``extra``."""
    save_checkpoint(run_dir, {"model": model.state_dict(), "optim": opt.state_dict(), "step": state.step,
                              "rng": rng_state(), "model_config": model_config, "elapsed": state.elapsed(), **extra})


def resume(run_dir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, model_config: dict[str, Any],
           what: str) -> LoopState:
    """Restore model, optimizer and RNG from the checkpoint in ``run_dir``; ``what`` names the model in errors."""
    ck = load_checkpoint(run_dir)
    if ck["model_config"] != model_config:
        raise ValueError(f"--resume: checkpoint in {run_dir} was trained with a different {what} shape "
                         f"({ck['model_config']}); pass the same flags or use a fresh --run-dir")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optim"])
    set_rng_state(ck["rng"])
    log(f"resumed from {run_dir / 'ckpt.pt'} at step {ck['step']}")
    return LoopState(step=ck["step"], elapsed_before=ck.get("elapsed", 0.0), tokens_seen=ck.get("tokens_seen", 0))


def train_loop(cfg: LoopConfig, desc: str, state: LoopState, opt: torch.optim.Optimizer,
               governor: Optional[ThreadGovernor], step_fn: Callable[[int], tuple[float, int]],
               save: Callable[[LoopState], None], log_line: Callable[[LoopState, float, float], str]) -> LoopState:
    """Run steps ``state.step .. cfg.steps`` (or until the time budget ends), checkpointing via ``save``.

    ``step_fn(step)`` does one optimizer step and returns (loss value, tokens trained on); the LR is
    already set on ``opt``. ``log_line(state, loss, lr)`` formats the every-``log_every``-steps line.
    Returns ``state`` after a final save; ``state.stopped`` is set when ``--stop-after`` ended the run
    early. A SIGINT/SIGTERM saves a checkpoint and raises ``KeyboardInterrupt``.
    """
    budget_s = cfg.max_minutes * 60 if cfg.max_minutes else None
    start = state.step
    # Under a time budget the bar counts seconds, so its ETA is the budget's end.
    bar = tqdm(total=int(budget_s) if budget_s else cfg.steps,
               initial=int(state.elapsed_before) if budget_s else start, unit="s" if budget_s else "step",
               dynamic_ncols=True, mininterval=1 if sys.stderr.isatty() else 30, file=sys.stderr, desc=desc)
    state.t0 = last_save = time.time()
    stop = install_stop_handler()
    while state.step < cfg.steps:
        step = state.step
        if stop.requested:
            save(state)
            bar.close()
            log(f"interrupted: checkpoint saved at step {step}; continue with --resume")
            raise KeyboardInterrupt
        elapsed = state.elapsed()
        progress = step / cfg.steps
        if budget_s:
            if elapsed >= budget_s:
                log(f"time budget of {cfg.max_minutes} min reached at step {step}")
                break
            progress = max(progress, elapsed / budget_s)
        state.progress = progress
        lr = cosine_lr(step, progress, cfg.lr, cfg.warmup, cfg.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        if governor is not None:
            governor.update(step)
        ts = time.time()
        loss, tokens = step_fn(step)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {step}; lower --lr")
        state.step = step = step + 1
        state.tokens_seen += tokens
        state.loss_ema = loss if state.loss_ema is None else 0.95 * state.loss_ema + 0.05 * loss
        rate = tokens / max(1e-9, time.time() - ts)
        state.tok_s = rate if state.tok_s == 0 else 0.9 * state.tok_s + 0.1 * rate
        bar.set_postfix(step=step, loss=f"{state.loss_ema:.4f}", lr=f"{lr:.2e}", tok_s=f"{state.tok_s:,.0f}",
                        refresh=False)
        bar.update(min(int(budget_s), int(state.elapsed())) - bar.n if budget_s else 1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            log(log_line(state, loss, lr))
        if step % cfg.ckpt_every == 0 or time.time() - last_save > cfg.ckpt_minutes * 60:
            save(state)
            last_save = time.time()
        if cfg.stop_after is not None and step - start >= cfg.stop_after:
            save(state)
            bar.close()
            log(f"stopping after {cfg.stop_after} steps this run (at step {step}); continue with --resume")
            state.stopped = True
            return state
    bar.close()
    save(state)
    return state
