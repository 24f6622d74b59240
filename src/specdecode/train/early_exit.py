"""Train an exit adapter (``drafters/exit_adapter.py``) for a frozen target, by self-distillation.

The recipe of ``train/medusa.py``: the target writes the data once (``selfdistill.build_rollout_data``:
rollouts plus corpus windows), one pass of the runtime's own forward keeps per position the residual
stream after the exit layer (what the adapter reads when drafting, fast kernels included) and the
target's top-k log-probs. The adapter layer then trains on those sequences alone (causal attention over
the residuals, as it attends over its cache when drafting): forward KL from the target's next-token
law (top-k + a tail bucket) to the law of adapter -> the target's final norm -> its frozen output
matrix over the proposal vocabulary (the tokens the target writes most; the rest of the teacher's
mass joins the tail bucket).

At the end, on held-out greedy continuations: α (the adapter's argmax equals the target's token), the
same for the training-free exit, τ(γ) of a greedy chain (a draft from position a is accepted while the
adapter agrees at a, a + 1, ...: its context is then the target's), and, on a CPU, the measured c and
the speedup τ(γ) / (γc + v(γ)) they predict; all go into ``exit_adapter.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ..drafters.exit_adapter import (ExitAdapter, ExitAdapterConfig, ExitAdapterDrafter, final_norm, proposal_head,
                                     save_adapter)
from ..drafters.layerskip import DraftLayers, check_family
from ..drafters.medusa_heads import describe_target
from ..models import Model
from .common import autocast
from .evaluate import chain_tau
from .loop import LoopState, log, resume, save_run, train_loop
from .medusa import proposal_ranking, restricted_fkl
from .selfdistill import (SAVE_DTYPES, CpuBudget, SelfDistillConfig, build_rollout_data, eval_sequences,
                          held_out_prompts, load_target, start_run, teacher_topk)

EVAL_GAMMAS = (1, 2, 3, 4, 5)


@dataclass
class EarlyExitTrainConfig(SelfDistillConfig):
    out: str = "models/code-exit-adapter"
    exit_layer: Optional[int] = None  # default: a quarter of the target's layers (at least 1)
    width: Optional[int] = None  # the adapter layer's MLP width (default: half the target's)
    steps: int = 100000
    batch_size: int = 8  # sequences per step
    lr: float = 2e-3
    warmup: int = 20
    onpolicy_seqs: int = 512
    corpus_seqs: int = 1024
    greedy_frac: float = 0.75
    ckpt_every: int = 50
    ckpt_minutes: float = 2.0
    log_every: int = 25


# --quick: finishes in seconds on a tiny target (tests, smoke runs); explicit flags still win.
QUICK = dict(steps=12, batch_size=4, onpolicy_seqs=8, corpus_seqs=4, prompt_len=8, gen_len=8, top_k=8, gen_batch=8,
             feature_batch=8, warmup=2, ckpt_every=6, log_every=6, eval_prompts=4, eval_prompt_len=8,
             eval_new_tokens=8, vocab_cut=64)


@dataclass
class EarlyExitTrainResult:
    out: Path
    steps: int
    exit_layer: int
    alpha: Optional[float]  # held-out greedy acceptance with the adapter (None: the run stopped early)
    alpha_training_free: Optional[float] = None
    tau: dict[int, float] = field(default_factory=dict)  # γ -> expected tokens per target pass (greedy chain)
    cpu_minutes: float = 0.0

    def __str__(self) -> str:
        if self.alpha is None:
            return f"stopped at step {self.steps}; continue with --resume"
        taus = ", ".join(f"γ={g}: {t:.2f}" for g, t in self.tau.items())
        return (f"exit after layer {self.exit_layer}: held-out greedy α {self.alpha:.3f} with the adapter "
                f"({self.alpha_training_free:.3f} training-free); τ {taus}; {self.cpu_minutes:.1f} CPU-minutes "
                f"-> {self.out}")


def default_exit_layer(n_layers: int) -> int:
    return max(1, n_layers // 4)


@torch.inference_mode()
def exit_features(target: Model, seqs: torch.Tensor, exit_layer: int, top_k: int) -> dict[str, torch.Tensor]:
    """One pass of the runtime's forward: the residual after the exit layer (fp16 [B, T, dim]) and the
    target's top-k log-probs and ids ([B, T, k])."""
    b, t = seqs.shape
    out = target.run(seqs.to(target.device), target.new_cache(b, t), hidden_layers=(exit_layer - 1,))
    lp, idx = teacher_topk(out.logits, top_k, target.vocab_size)
    return {"hidden": out.layers[exit_layer - 1].to(torch.float16).cpu(), "lp": lp, "idx": idx}


def adapter_train_logits(target: Model, adapter: ExitAdapter, h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Differentiable logits [B, T, N] over the rows of ``head``: the adapter layer with causal attention
    over the residuals ``h`` [B, T, dim] (positions 0..T-1), the target's final norm, ``head``."""
    positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0).expand(h.shape[0], -1)
    return final_norm(target, adapter(h, positions)) @ head.t()


@torch.inference_mode()
def evaluate_exit(target: Model, adapter: ExitAdapter, prompts: torch.Tensor | list[list[int]], new_tokens: int,
                  gammas: tuple[int, ...] = EVAL_GAMMAS) -> tuple[float, float, dict[int, float], int]:
    """Held-out greedy acceptance on the target's greedy continuations: (α with the adapter, α of the
    training-free exit over the full vocabulary, τ(γ) of the adapter's greedy chain, positions scored).
    At position t the draft proposes the argmax of its logits on the residuals up to t; the target's
    token is x_{t+1}."""
    seqs, p = eval_sequences(target, prompts, new_tokens)
    k = adapter.cfg.exit_layer
    head = proposal_head(target, adapter.vocab_ids).float()
    full = target.output_matrix().float()
    ids = adapter.vocab_ids.to(full.device)
    hits, hits_free = [], []
    for j in range(0, len(seqs), 8):
        s = seqs[j:j + 8]
        h = exit_features(target, s, k, 1)["hidden"].float().to(full.device)
        truth = s[:, p:].to(full.device)
        guess = ids[adapter_train_logits(target, adapter, h, head)[:, p - 1 : -1].argmax(-1)]
        hits.append(guess == truth)
        hits_free.append((final_norm(target, h[:, p - 1 : -1]) @ full.t()).argmax(-1) == truth)
    ok = torch.cat(hits)  # [prompts, new_tokens]
    return float(ok.float().mean()), float(torch.cat(hits_free).float().mean()), chain_tau(ok, gammas), ok.numel()


def measured_speedup(target: Model, adapter: ExitAdapter, tau: dict[int, float]) -> dict[str, object]:
    """c and v of this machine (the drafter's own cost measurement, adapter included, one thread as
    ``bench --threads 1`` runs) and the speedup τ(γ) / (γc + v(γ)) they predict with the held-out τ."""
    drafter = ExitAdapterDrafter(adapter, gamma="auto")
    drafter.prepare_rows(target, 1, target.max_seq_len)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = drafter.costs_for(target)
    finally:
        torch.set_num_threads(threads)
    assert costs is not None
    return {"c": round(costs.c, 4), "v": [round(v, 3) for v in costs.v[: max(tau) + 1]], "threads": 1,
            "predicted_speedup": {str(g): round(t / (g * costs.c + costs.v_at(g)), 3) for g, t in tau.items()}}


def train_early_exit(cfg: EarlyExitTrainConfig) -> EarlyExitTrainResult:
    run = start_run(cfg)
    budget = CpuBudget.for_run(cfg, run.run_dir, reserve_s=60.0)
    t_start = time.time()
    target = load_target(cfg, run.device)  # as the runtime runs it unless --target-weight-dtype says
    check_family(target)
    n_layers, device = target.config.n_layers, run.device
    k = cfg.exit_layer if cfg.exit_layer is not None else default_exit_layer(n_layers)
    DraftLayers.exit(k, n_layers)  # the same range check and message as --exit-layer at run time
    width = cfg.width or max(16, target.config.intermediate_size // 2)
    if width < 1:
        raise ValueError(f"--adapter-width must be positive, got {width}")
    ds = build_rollout_data(target, cfg, run.run_dir, "exit", lambda s: exit_features(target, s, k, cfg.top_k),
                            f"the residual after layer {k}", extra_key=["exit", k])
    ranked, _ = proposal_ranking(ds, target.vocab_size)
    cut = min(cfg.vocab_cut, target.vocab_size)
    vocab_ids = torch.tensor(sorted(ranked[:cut]), dtype=torch.long)
    acfg = ExitAdapterConfig.for_target(target, k, width, cut)
    adapter = ExitAdapter(acfg, vocab_ids, target.max_seq_len).to(device).train()
    head = proposal_head(target, vocab_ids).detach().float().to(device)
    to_pos = torch.full((target.vocab_size,), -1, dtype=torch.long)
    to_pos[vocab_ids] = torch.arange(cut)
    opt = torch.optim.AdamW(adapter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    shape = {"exit_layer": k, "dim": acfg.dim, "width": width, "draft_vocab": cut}
    state = resume(run.run_dir, adapter, opt, shape, "exit adapter") if cfg.resume else LoopState()
    hidden, lp, idx = ds["hidden"], ds["lp"], ds["idx"]
    n, t_len = hidden.shape[:2]
    log(f"exit adapter after layer {k} of {n_layers}: one decoder layer ({acfg.n_heads} heads / {acfg.n_kv_heads} KV, "
        f"MLP {width}), proposal vocabulary {cut}: {sum(p.numel() for p in adapter.parameters()):,} params on "
        f"{target.name}; {n} sequences x {t_len}; batch {cfg.batch_size} sequences on {device} "
        f"threads={torch.get_num_threads()}"
        + (f"; CPU budget {cfg.budget_minutes} min ({budget.used() / 60:.1f} spent)" if cfg.budget_minutes else ""))
    agree_ema = [0.0]

    def save(s: LoopState) -> None:
        save_run(run.run_dir, adapter, opt, shape, s, {"early_exit_config": asdict(cfg), "tokens_seen": s.tokens_seen,
                                                       "cpu_seconds": budget.used()})

    def train_step(step: int) -> tuple[float, int]:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(0, n, (cfg.batch_size,), generator=g)
        h = hidden[rows].to(device).float()
        with autocast(device, cfg.amp):
            logits = adapter_train_logits(target, adapter, h, head)
        t_pos = to_pos[idx[rows].long()].to(device)
        loss = restricted_fkl(logits, lp[rows].to(device), t_pos)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(adapter.parameters(), cfg.grad_clip)
        opt.step()
        hit = float((logits.argmax(-1) == t_pos[..., 0]).float().mean())
        agree_ema[0] = hit if step == 0 else 0.9 * agree_ema[0] + 0.1 * hit
        budget.after_step(step)
        return loss.item(), cfg.batch_size * t_len

    def log_line(s: LoopState, loss: float, lr: float) -> str:
        return (f"step {s.step} fkl {loss:.4f} (ema {s.loss_ema:.4f}) top-1 agreement {agree_ema[0]:.3f} lr {lr:.2e} "
                f"{s.tok_s:,.0f} pos/s elapsed {s.elapsed() / 60:.1f} min, CPU {budget.used() / 60:.1f} min")

    if budget.spent():
        log(f"the CPU budget of {cfg.budget_minutes} min was spent before training ({budget.used() / 60:.1f} min)")
        cfg.steps = state.step
    state = train_loop(cfg, "exit adapter", state, opt, run.governor, train_step, save, log_line)
    if state.stopped:
        return EarlyExitTrainResult(Path(cfg.out), state.step, k, None, cpu_minutes=budget.used() / 60)
    adapter = adapter.float().eval().requires_grad_(False).to(target.device)
    alpha, alpha_free, tau, positions = evaluate_exit(target, adapter, held_out_prompts(target, cfg),
                                                      cfg.eval_new_tokens)
    acfg.recipe = {**asdict(cfg), "exit_layer": k, "width": width, "steps_done": state.step,
                   "train_minutes": round(state.elapsed() / 60, 2),
                   "wall_minutes_this_invocation": round((time.time() - t_start) / 60, 2),
                   "threads": torch.get_num_threads(), "eval_positions": positions,
                   "eval_tau": {str(g): round(t, 4) for g, t in tau.items()}}
    acfg.target, acfg.alpha, acfg.alpha_training_free = describe_target(target), round(alpha, 5), round(alpha_free, 5)
    if target.device.type == "cpu" and not cfg.quick:  # the cost model's c: seconds on the machine it ran on
        acfg.recipe["costs"] = measured_speedup(target, adapter, tau)
    acfg.recipe["cpu_minutes_total"] = round(budget.used() / 60, 2)
    save_adapter(cfg.out, adapter, SAVE_DTYPES[cfg.save_dtype])
    (run.run_dir / "result.json").write_text(json.dumps({"alpha": alpha, "alpha_training_free": alpha_free,
                                                         "tau": tau, "recipe": acfg.recipe}, indent=2, default=str)
                                             + "\n")
    return EarlyExitTrainResult(Path(cfg.out), state.step, k, alpha, alpha_free, tau, budget.used() / 60)


__all__ = ["EarlyExitTrainConfig", "EarlyExitTrainResult", "QUICK", "evaluate_exit", "exit_features",
           "train_early_exit"]
