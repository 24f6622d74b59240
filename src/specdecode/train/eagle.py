"""Train an EAGLE-3 draft (Li et al., arXiv:2503.01840) for a frozen target, by self-distillation.

The target runs once, up front, as for Medusa (``train/medusa.py``):

1. it continues training-split prompts (greedy and sampled at T=1; ``rollout.generate``), and a
   few plain corpus windows are added for variety;
2. one pass of the runtime's own forward over each sequence keeps, per position, the residual
   after the three ``aux_layers`` (the draft's input features) and the target's top-k log-probs
   (the teacher); both are cached in the run directory;
3. the draft layer trains on those tensors alone with EAGLE-3's training-time test
   (``EagleNet.unroll``): step 0 reads the target's features, steps 1..D-1 read the draft's own
   outputs, under exactly the tree attention the drafter uses, so the draft learns to go on from
   its own mistakes. Each step minimises forward KL from the target's law of the token two
   positions on to the draft's, over the draft vocabulary (the tokens the target writes most;
   EAGLE-3's d2t) plus a tail bucket; step k weighs 0.8^k.

``--budget-minutes`` bounds the CPU time of the whole command (rollouts, training, evaluation):
the training steps get what the data left, the cosine schedule follows the CPU time spent, and a
resumed run counts the CPU time of its earlier invocations. At the end, acceptance by depth on
held-out greedy continuations is measured (the drafter's prior) and the directory is written.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from ..drafters.eagle_model import EagleConfig, EagleNet, default_aux_layers, input_embedding, save_eagle
from ..drafters.medusa_heads import describe_target
from ..drafters.vocab import write_vocab_file
from ..models import Model
from .common import autocast
from .loop import LoopState, log, resume, save_run, train_loop
from .medusa import proposal_ranking, restricted_fkl
from .selfdistill import (SAVE_DTYPES, CpuBudget, SelfDistillConfig, build_rollout_data, eval_sequences,
                          held_out_prompts, load_target, start_run, teacher_topk)

STEP_DECAY = 0.8  # EAGLE-3's weight of training-time-test step k: 0.8^k
EVAL_DEPTH = 6


@dataclass
class EagleTrainConfig(SelfDistillConfig):
    out: str = "models/code-eagle"
    depth: int = 3  # training-time-test steps
    warm_frac: float = 0.0  # share of the schedule at depth 1 first (the features only: more positions per CPU-second)
    ffn: Optional[int] = None  # the draft layer's MLP width (default: half the target's)
    aux_layers: Optional[tuple[int, ...]] = None  # the target layers read, 0-based outputs (default: EAGLE-3's)
    steps: int = 100000
    batch_size: int = 8  # sequences per step
    lr: float = 2e-3
    warmup: int = 20
    onpolicy_seqs: int = 512
    corpus_seqs: int = 128
    greedy_frac: float = 0.75
    ckpt_every: int = 50
    ckpt_minutes: float = 2.0
    log_every: int = 25


QUICK = dict(steps=10, batch_size=4, onpolicy_seqs=8, corpus_seqs=4, prompt_len=8, gen_len=16, top_k=8, gen_batch=8,
             feature_batch=8, warmup=2, ckpt_every=5, log_every=5, eval_prompts=4, eval_prompt_len=8,
             eval_new_tokens=12, vocab_cut=64, depth=2)

@dataclass
class EagleTrainResult:
    out: Path
    steps: int
    depth_acceptance: list[float]  # held-out top-1 acceptance at depth d given depths < d were accepted
    tau: float  # held-out mean accepted chain length + 1 (top-1 chain, greedy)
    cpu_minutes: float

    def __str__(self) -> str:
        if not self.depth_acceptance:
            return f"stopped at step {self.steps}; continue with --resume"
        acc = ", ".join(f"{a:.3f}" for a in self.depth_acceptance)
        return (f"held-out acceptance by depth (top-1 chain, greedy): {acc}; tau {self.tau:.2f}; "
                f"{self.cpu_minutes:.1f} CPU-minutes -> {self.out}")


@torch.inference_mode()
def target_features(target: Model, seqs: torch.Tensor, aux: tuple[int, ...], top_k: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of the runtime's forward: the aux layers' residuals concatenated (fp16 [B, T, 3H]),
    top-k log-probs (fp16) and their ids ([B, T, k])."""
    b, t = seqs.shape
    cache = target.new_cache(b, t)
    out = target.run(seqs.to(target.device), cache, hidden_layers=aux)
    feats = torch.cat([out.layers[i] for i in aux], dim=-1)
    lp, idx = teacher_topk(out.logits, top_k, target.vocab_size)
    return feats.to(torch.float16).cpu(), lp, idx


def build_data(target: Model, cfg: EagleTrainConfig, run_dir: Path, aux: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Rollouts plus corpus windows with their features and teacher law, cached in ``run_dir``."""

    def features(seqs: torch.Tensor) -> dict[str, torch.Tensor]:
        f, lp, idx = target_features(target, seqs, aux, cfg.top_k)
        return {"aux": f, "lp": lp, "idx": idx}

    return build_rollout_data(target, cfg, run_dir, "eagle", features, f"features of layers {list(aux)}",
                              extra_key=list(aux))


def ttt_loss(net: EagleNet, emb: torch.Tensor, aux: torch.Tensor, tokens: torch.Tensor, lp: torch.Tensor,
             t_pos: torch.Tensor, depth: int) -> tuple[torch.Tensor, list[float]]:
    """The training-time-test loss on sequences [B, T] and each step's top-1 agreement with the teacher.
    Step k at position p predicts x_{p+2} (the teacher's row p + 1); positions p < k have no anchor."""
    b, t = tokens.shape
    nxt = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
    outs = net.unroll(aux, emb[nxt.long()], depth)
    total, weights, agree = aux.new_zeros(()), 0.0, []
    for k, h in enumerate(outs):
        sel = slice(k, t - 1)
        logits = net.logits(h[:, sel])
        loss = restricted_fkl(logits, lp[:, k + 1 : t], t_pos[:, k + 1 : t])
        w = STEP_DECAY ** k
        total = total + w * loss
        weights += w
        with torch.no_grad():
            agree.append(float((logits.argmax(-1) == t_pos[:, k + 1 : t, 0]).float().mean()))
    return total / weights, agree


@torch.inference_mode()
def evaluate_eagle(target: Model, net: EagleNet, prompts: torch.Tensor | list[list[int]], new_tokens: int,
                   depth: int = EVAL_DEPTH) -> tuple[list[float], float, int]:
    """Held-out acceptance of the top-1 chain on the target's greedy continuations: (α by depth given the
    earlier depths were accepted, τ = 1 + mean accepted chain length, anchors). Depth k from anchor a is
    the draft's step k at position a + k (``unroll``), scored against the greedy token x_{a+k+2}."""
    seqs, p = eval_sequences(target, prompts, new_tokens)
    emb = input_embedding(target).float()
    aux_ids = tuple(net.cfg.aux_layers)
    runs = []
    for j in range(0, len(seqs), 8):
        s = seqs[j:j + 8]
        f, _, _ = target_features(target, s, aux_ids, 1)
        t = s.shape[1]
        nxt = torch.cat([s[:, 1:], s[:, -1:]], dim=1)
        outs = net.unroll(f.float(), emb[nxt], depth)
        anchors = torch.arange(p - 1, t - 2 - depth)
        hits = []
        for k, h in enumerate(outs):
            guess = net.draft_ids[net.logits(h[:, anchors + k]).argmax(-1)]
            hits.append(guess == s[:, anchors + k + 2])
        ok = torch.stack(hits, -1).reshape(-1, depth)  # [anchors, depth]
        runs.append(ok.long().cumprod(-1))
    r = torch.cat(runs)
    alive = torch.ones(len(r), dtype=torch.bool)
    alpha = []
    for k in range(depth):
        alpha.append(float(r[alive, k].float().mean()) if alive.any() else 0.0)
        alive &= r[:, k] > 0
    return alpha, 1.0 + float(r.sum(-1).float().mean()), len(r)


def train_eagle(cfg: EagleTrainConfig) -> EagleTrainResult:
    if cfg.depth < 1:
        raise ValueError(f"--eagle-depth must be at least 1, got {cfg.depth}")
    if not 0.0 <= cfg.warm_frac < 1.0:
        raise ValueError(f"--eagle-warm-frac must be in [0, 1), got {cfg.warm_frac}")
    run = start_run(cfg)
    run_dir, device, governor = run.run_dir, run.device, run.governor
    t_start = time.time()
    budget = CpuBudget.for_run(cfg, run_dir, reserve_s=60.0)
    target = load_target(cfg, device)  # as the runtime runs it unless --target-weight-dtype says
    aux = tuple(cfg.aux_layers) if cfg.aux_layers else default_aux_layers(target.config.n_layers)
    EagleConfig.for_target(target, 1, aux_layers=aux)  # a bad layer set fails here, before the rollouts
    ds = build_data(target, cfg, run_dir, aux)
    ranked, counts = proposal_ranking(ds, target.vocab_size)
    cut = min(cfg.vocab_cut, target.vocab_size)
    draft_ids = torch.tensor(sorted(ranked[:cut]), dtype=torch.long)
    ecfg = EagleConfig.for_target(target, cut, ffn=cfg.ffn or max(16, target.config.intermediate_size // 2),
                                  aux_layers=aux)
    net = EagleNet(ecfg, draft_ids).to(device)
    with torch.no_grad():  # the draft's head starts as the target's own output rows (the d2t subset)
        net.lm_head.copy_(target.output_matrix().detach().float().index_select(0, draft_ids.to(target.device)))
    net.train()
    emb = input_embedding(target).detach().float().to(device)
    to_pos = torch.full((target.vocab_size,), -1, dtype=torch.long)
    to_pos[draft_ids] = torch.arange(cut)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    shape = {"dim": ecfg.dim, "ffn": ecfg.ffn, "draft_vocab": cut, "aux_layers": list(aux), "depth": cfg.depth}
    state = resume(run_dir, net, opt, shape, "EAGLE draft") if cfg.resume else LoopState()
    tokens, feats, lp, idx = ds["tokens"], ds["aux"], ds["lp"], ds["idx"]
    n, t_len = tokens.shape
    log(f"EAGLE-3 draft: one layer {ecfg.dim} wide (FFN {ecfg.ffn}), fc {3 * ecfg.dim}->{ecfg.dim}, draft vocabulary "
        f"{cut}: {sum(p.numel() for p in net.parameters()):,} params on {target.name} (features after layers "
        f"{list(aux)}); {n} sequences x {t_len}; training-time test depth {cfg.depth}; batch {cfg.batch_size} on "
        f"{device} threads={torch.get_num_threads()}"
        + (f"; CPU budget {cfg.budget_minutes} min ({budget.used() / 60:.1f} spent)" if cfg.budget_minutes else ""))
    agree_ema: list[float] = []

    def save(s: LoopState) -> None:
        save_run(run_dir, net, opt, shape, s, {"eagle_config": asdict(cfg), "tokens_seen": s.tokens_seen,
                                               "cpu_seconds": budget.used()})

    def train_step(step: int) -> tuple[float, int]:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(0, n, (cfg.batch_size,), generator=g)
        s_tok = tokens[rows].to(device)
        depth = 1 if state.progress < cfg.warm_frac else cfg.depth  # the schedule's: steps, CPU or wall time
        with autocast(device, cfg.amp):
            loss, agree = ttt_loss(net, emb, feats[rows].to(device).float(), s_tok, lp[rows].to(device),
                                   to_pos[idx[rows].long()].to(device), depth)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
        opt.step()
        if len(agree_ema) < len(agree):  # the first step, or the first at full depth
            agree_ema[:] = agree_ema + agree[len(agree_ema):]
        agree_ema[: len(agree)] = [0.9 * a + 0.1 * b for a, b in zip(agree_ema, agree)]
        budget.after_step(step)
        return loss.item(), cfg.batch_size * t_len

    def log_line(s: LoopState, loss: float, lr: float) -> str:
        accs = " ".join(f"{a:.3f}" for a in agree_ema)
        return (f"step {s.step} fkl {loss:.4f} (ema {s.loss_ema:.4f}) top-1 agreement per TTT step {accs} lr {lr:.2e} "
                f"{s.tok_s:,.0f} pos/s elapsed {s.elapsed() / 60:.1f} min, CPU {budget.used() / 60:.1f} min")

    if budget.spent():
        log(f"the CPU budget of {cfg.budget_minutes} min was spent before training ({budget.used() / 60:.1f} min)")
        cfg.steps = state.step
    state = train_loop(cfg, "eagle draft", state, opt, governor, train_step, save, log_line)
    if state.stopped:
        return EagleTrainResult(Path(cfg.out), state.step, [], 0.0, budget.used() / 60)
    net.eval()
    net_cpu = net.float()
    alpha, tau, anchors = evaluate_eagle(target, net_cpu, held_out_prompts(target, cfg), cfg.eval_new_tokens)
    cpu_min = budget.used() / 60
    recipe = {**asdict(cfg), "steps_done": state.step, "train_minutes": round(state.elapsed() / 60, 2),
              "wall_minutes_this_invocation": round((time.time() - t_start) / 60, 2),
              "cpu_minutes_total": round(cpu_min, 2), "threads": torch.get_num_threads(), "eval_anchors": anchors,
              "eval_tau_chain": round(tau, 4)}
    net_cpu.cfg.target = describe_target(target)
    net_cpu.cfg.recipe = recipe
    net_cpu.cfg.depth_acceptance = [round(a, 5) for a in alpha]
    save_eagle(cfg.out, net_cpu, SAVE_DTYPES[cfg.save_dtype])
    write_vocab_file(cfg.out, ranked, counts, cut, "the target's top-1 tokens on its training-split rollouts")
    (run_dir / "result.json").write_text(json.dumps({"depth_acceptance": alpha, "tau_chain": tau, "recipe": recipe},
                                                    indent=2, default=str) + "\n")
    return EagleTrainResult(Path(cfg.out), state.step, alpha, tau, cpu_min)


__all__ = ["EagleTrainConfig", "EagleTrainResult", "QUICK", "evaluate_eagle", "train_eagle", "ttt_loss"]
