"""Train Medusa heads (Medusa-1: the target frozen) by self-distillation on the target's own text.

Why it is fast on a CPU: only the heads learn, and they read nothing but the target's final
hidden state. So the target runs once, up front:

1. the target continues corpus prompts (greedy and sampled at T=1; ``rollout.generate``);
2. one pass over each rollout batch keeps, per position, the final normed hidden state h_t (the
   runtime's own forward, fast kernels included, so the heads see the features they will see when
   drafting) and the target's top-k log-probs; both are cached on disk in the run directory;
3. the heads then train on those tensors alone: head k on h_t minimises forward KL from the target's
   law at position t + k (what the target says about x_{t+k+1}) to its own law, over top-k + one
   tail bucket (``restricted_fkl``), through the target's frozen output matrix restricted to the tokens
   the target itself chooses most (``--medusa-vocab``, the drafter's default proposal vocabulary; the
   teacher's mass on other tokens joins the tail bucket): about V/N times cheaper per step.

At the end the held-out acceptance by depth and rank is measured on the target's greedy path
(it is the drafter's prior for its tree shapes) and the heads directory is written
(``drafters/medusa_heads.py``) with a token ranking of the rollouts (``draft_vocab.json``), so
proposals can use a restricted output matrix.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..drafters.medusa_heads import MedusaConfig, MedusaHeads, describe_target, save_heads
from ..drafters.vocab import write_vocab_file
from ..models import Model
from .common import autocast
from .loop import LoopState, log, resume, save_run, train_loop
from .selfdistill import (SAVE_DTYPES, SelfDistillConfig, build_rollout_data, eval_sequences, held_out_prompts,
                          load_target, start_run, teacher_topk)

RANKS = 10  # candidates per head in the acceptance table (the drafter's trees use at most this many)


@dataclass
class MedusaTrainConfig(SelfDistillConfig):
    out: str = "models/code-medusa"
    num_heads: int = 4
    vocab_cut: int = 2048  # the restricted proposal vocabulary recorded in draft_vocab.json


# --quick: finishes in seconds on a tiny target (tests, smoke runs); explicit flags still win.
QUICK = dict(num_heads=2, steps=12, batch_size=64, onpolicy_seqs=8, prompt_len=8, gen_len=8, top_k=8, gen_batch=8,
             feature_batch=8, warmup=2, ckpt_every=6, log_every=6, eval_prompts=4, eval_prompt_len=8,
             eval_new_tokens=8, vocab_cut=64)

@dataclass
class MedusaTrainResult:
    out: Path
    steps: int
    alpha: list[float]  # held-out top-1 accuracy per head (empty when the run stopped early)
    rank_acceptance: list[list[float]]
    wall_minutes: float

    def __str__(self) -> str:
        if not self.alpha:
            return f"stopped at step {self.steps}; continue with --resume"
        heads = ", ".join(f"head {k + 1}: {a:.3f}" for k, a in enumerate(self.alpha))
        return f"held-out top-1 accuracy on the target's greedy path: {heads} -> {self.out}"


@torch.inference_mode()
def target_features(target: Model, seqs: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of the runtime's forward over whole sequences: final normed hidden states (fp16
    [B, T, dim]), top-k log-probs (fp16) and their ids ([B, T, k])."""
    b, t = seqs.shape
    cache = target.new_cache(b, t)
    out = target.run(seqs.to(target.device), cache, return_hidden=True)
    assert out.hidden is not None
    lp, idx = teacher_topk(out.logits, top_k, target.vocab_size)
    return out.hidden.to(torch.float16).cpu(), lp, idx


def build_features(target: Model, cfg: MedusaTrainConfig, run_dir: Path) -> dict[str, torch.Tensor]:
    """Rollouts and their teacher features, computed once per rollout batch and cached in ``run_dir``."""

    def features(seqs: torch.Tensor) -> dict[str, torch.Tensor]:
        h, lp, idx = target_features(target, seqs, cfg.top_k)
        return {"hidden": h, "lp": lp, "idx": idx}

    return build_rollout_data(target, cfg, run_dir, "medusa", features, "final hidden states")


def head_logits(heads: MedusaHeads, h: torch.Tensor, out_matrix: torch.Tensor) -> torch.Tensor:
    """[..., dim] hidden states -> [..., K, V] head logits through the target's output matrix."""
    return heads(h) @ out_matrix.t()


def proposal_ranking(ds: dict[str, torch.Tensor], vocab_size: int) -> tuple[list[int], np.ndarray]:
    """Token ids by how often the target chose them (its top-1 on every rollout position), ties broken by
    how often they occur in the rollouts: the tokens worth proposing come first."""
    top1 = np.bincount(ds["idx"][..., 0].numpy().astype(np.int64).ravel(), minlength=vocab_size)[:vocab_size]
    seen = np.bincount(ds["tokens"].numpy().astype(np.int64).ravel(), minlength=vocab_size)[:vocab_size]
    score = top1.astype(np.float64) * (seen.max() + 1) + seen
    order = np.argsort(-score, kind="stable")
    return [int(t) for t in order], (top1 + seen)[order]


def restricted_fkl(logits: torch.Tensor, teacher_lp: torch.Tensor, teacher_pos: torch.Tensor) -> torch.Tensor:
    """Mean forward KL(p || q) between top-k + tail coarsenings when q lives on a restricted vocabulary.

    ``logits`` [..., N] are the head's logits over the N proposable tokens; ``teacher_pos`` [..., k] the
    teacher's top-k tokens as indices into those N (-1: not proposable, its mass joins the tail bucket).
    With N = V and no -1 this is ``distill.bucket_divergence``'s forward KL."""
    logq = torch.log_softmax(logits.float(), -1)
    valid = teacher_pos >= 0
    lq = logq.gather(-1, teacher_pos.clamp_min(0).long()).masked_fill(~valid, 0.0)
    lp = teacher_lp.float().masked_fill(~valid, 0.0)
    p = lp.exp() * valid
    q = lq.exp() * valid
    p_rest = (1 - p.sum(-1)).clamp_min(0.0)
    q_rest = (1 - q.sum(-1)).clamp_min(1e-12)
    head = (p * (lp - lq)).sum(-1)
    tail = torch.xlogy(p_rest, p_rest) - p_rest * q_rest.log()
    return (head + tail).mean()


@torch.inference_mode()
def evaluate_heads(target: Model, heads: MedusaHeads, prompts: torch.Tensor | list[list[int]], new_tokens: int,
                   vocab_ids: Optional[torch.Tensor] = None, ranks: int = RANKS
                   ) -> tuple[list[float], list[list[float]], int]:
    """Held-out acceptance on the target's greedy path: (top-1 accuracy per head, rank table, positions).

    Head d on h_t is scored against the target's greedy token x_{t+1+d}; the rank table entry [d][r] is
    the share of positions where that token is head d's rank-r candidate, among the positions where every
    earlier head had its token in its top ``ranks`` (the event a tree's deeper nodes depend on).
    ``vocab_ids``: the proposable tokens (None: all); a token outside them is never a candidate."""
    seqs, p = eval_sequences(target, prompts, new_tokens)
    out_matrix = target.output_matrix().float()
    to_pos = torch.arange(target.vocab_size)
    if vocab_ids is not None:
        out_matrix = out_matrix.index_select(0, vocab_ids.to(out_matrix.device))
        to_pos = torch.full((target.vocab_size,), -1, dtype=torch.long)
        to_pos[vocab_ids] = torch.arange(len(vocab_ids))
    k = heads.num_heads
    all_ranks = []
    for j in range(0, len(seqs), 8):
        s = seqs[j:j + 8]
        h, _, _ = target_features(target, s, 1)
        t_idx = torch.arange(p - 1, s.shape[1] - 1 - k)  # positions whose K future tokens are all known
        logits = head_logits(heads, h[:, t_idx].float(), out_matrix)  # [b, n, K, V]
        truth = to_pos[torch.stack([s[:, t_idx + 1 + d + 1] for d in range(k)], dim=-1).long()]  # [b, n, K]
        true_logit = logits.gather(-1, truth.clamp_min(0).unsqueeze(-1))
        rank = (logits > true_logit).sum(-1).masked_fill(truth < 0, ranks)  # not proposable: never a candidate
        all_ranks.append(rank.reshape(-1, k))
    r = torch.cat(all_ranks)
    alpha = [float((r[:, d] == 0).float().mean()) for d in range(k)]
    table = []
    covered = torch.ones(len(r), dtype=torch.bool)
    for d in range(k):
        sel = r[covered, d]
        table.append([float((sel == q).float().mean()) if len(sel) else 0.0 for q in range(ranks)])
        covered &= r[:, d] < ranks
    return alpha, table, len(r)


def train_medusa(cfg: MedusaTrainConfig) -> MedusaTrainResult:
    if cfg.num_heads < 1:
        raise ValueError(f"--medusa-heads must be at least 1, got {cfg.num_heads}")
    if cfg.gen_len <= cfg.num_heads + 1:
        raise ValueError(f"--gen-len {cfg.gen_len} leaves no position with {cfg.num_heads} future tokens; raise it")
    run = start_run(cfg)
    run_dir, device, governor = run.run_dir, run.device, run.governor
    t_start = time.time()
    target = load_target(cfg, device)  # as the runtime runs it unless --target-weight-dtype says
    ds = build_features(target, cfg, run_dir)
    dim, k = target.config.dim, cfg.num_heads
    heads = MedusaHeads(k, dim).to(device).train()
    ranked, counts = proposal_ranking(ds, target.vocab_size)
    cut = min(cfg.vocab_cut, target.vocab_size)
    # train over the proposable tokens only (the runtime's default output matrix): ~V/N times cheaper per step
    vocab_ids = torch.tensor(sorted(ranked[:cut]), dtype=torch.long)
    out_matrix = target.output_matrix().detach().float().index_select(0, vocab_ids.to(target.device)).to(device)
    to_pos = torch.full((target.vocab_size,), -1, dtype=torch.long)
    to_pos[vocab_ids] = torch.arange(cut)
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    shape = {"num_heads": k, "dim": dim}
    state = resume(run_dir, heads, opt, shape, "Medusa heads") if cfg.resume else LoopState()
    hidden, lp, idx = ds["hidden"], ds["lp"], ds["idx"]
    n, t_len = hidden.shape[:2]
    log(f"Medusa heads: {k} x ({dim}x{dim} + {dim}) = {sum(p.numel() for p in heads.parameters()):,} params on "
        f"{target.name}; {n} rollouts x {t_len} positions; {cfg.steps} steps of {cfg.batch_size} positions on "
        f"{device} threads={torch.get_num_threads()}")
    offsets = torch.arange(1, k + 1)
    acc_ema = [0.0] * k

    def save(s: LoopState) -> None:
        save_run(run_dir, heads, opt, shape, s, {"medusa_config": asdict(cfg), "tokens_seen": s.tokens_seen})

    def train_step(step: int) -> tuple[float, int]:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(0, n, (cfg.batch_size,), generator=g)
        pos = torch.randint(0, t_len - k, (cfg.batch_size,), generator=g)
        h = hidden[rows, pos].to(device).float()
        ahead = (pos.unsqueeze(1) + offsets).clamp_max(t_len - 1)  # [B, K]: the teacher's position per head
        t_lp = lp[rows.unsqueeze(1), ahead].to(device)
        t_pos = to_pos[idx[rows.unsqueeze(1), ahead].long()].to(device)
        with autocast(device, cfg.amp):
            logits = head_logits(heads, h, out_matrix)
        loss = restricted_fkl(logits, t_lp, t_pos)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), cfg.grad_clip)
        opt.step()
        with torch.no_grad():
            hit = (logits.argmax(-1) == t_pos[..., 0]).float().mean(0)
            for d in range(k):
                acc_ema[d] = hit[d].item() if step == 0 else 0.9 * acc_ema[d] + 0.1 * hit[d].item()
        return loss.item(), cfg.batch_size

    def log_line(s: LoopState, loss: float, lr: float) -> str:
        accs = " ".join(f"{a:.3f}" for a in acc_ema)
        return (f"step {s.step} fkl {loss:.4f} (ema {s.loss_ema:.4f}) top-1 agreement per head {accs} lr {lr:.2e} "
                f"{s.tok_s:,.0f} pos/s elapsed {s.elapsed() / 60:.1f} min")

    state = train_loop(cfg, "medusa heads", state, opt, governor, train_step, save, log_line)
    if state.stopped:
        return MedusaTrainResult(Path(cfg.out), state.step, [], [], state.elapsed() / 60)
    heads.eval()
    alpha, table, positions = evaluate_heads(target, heads, held_out_prompts(target, cfg), cfg.eval_new_tokens,
                                             vocab_ids)
    wall = (time.time() - t_start) / 60
    recipe = {**asdict(cfg), "steps_done": state.step, "train_minutes": round(state.elapsed() / 60, 2),
              "wall_minutes_this_invocation": round(wall, 2), "threads": torch.get_num_threads(),
              "eval_positions": positions}
    config = MedusaConfig(num_heads=k, dim=dim, vocab_size=target.vocab_size, target=describe_target(target),
                          recipe=recipe, rank_acceptance=[[round(x, 5) for x in row] for row in table],
                          alpha=[round(a, 5) for a in alpha])
    save_heads(cfg.out, heads, config, SAVE_DTYPES[cfg.save_dtype])
    write_vocab_file(cfg.out, ranked, counts, cut, "the target's top-1 tokens on its training-split rollouts")
    (run_dir / "result.json").write_text(json.dumps({"alpha": alpha, "rank_acceptance": table, "recipe": recipe},
                                                    indent=2, default=str) + "\n")
    return MedusaTrainResult(Path(cfg.out), state.step, alpha, table, wall)
