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

import hashlib
import json
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from ..drafters.eagle_model import EagleConfig, EagleNet, default_aux_layers, input_embedding, save_eagle
from ..drafters.medusa_heads import describe_target
from ..drafters.vocab import write_vocab_file
from ..models import Model, load_model
from . import data as D
from .checkpoint import has_checkpoint, load_checkpoint
from .common import ThreadGovernor, autocast, pick_device, seed_everything
from .evaluate import EVAL_SEED, doc_separator
from .loop import LoopState, log, resume, save_run, train_loop
from .medusa import proposal_ranking, restricted_fkl
from .rollout import generate, sample_windows
from .tokenizer import encode_batch_fn

STEP_DECAY = 0.8  # EAGLE-3's weight of training-time-test step k: 0.8^k
EVAL_DEPTH = 6


@dataclass
class EagleTrainConfig:
    target: str = "models/code-target"
    out: str = "models/code-eagle"
    run_dir: Optional[str] = None  # default: runs/<basename of out>
    corpus: list[str] = field(default_factory=list)
    depth: int = 3  # training-time-test steps
    ffn: Optional[int] = None  # the draft layer's MLP width (default: half the target's)
    steps: int = 100000
    batch_size: int = 8  # sequences per step
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    onpolicy_seqs: int = 512
    corpus_seqs: int = 128
    prompt_len: int = 64
    gen_len: int = 128
    greedy_frac: float = 0.75
    top_k: int = 32
    gen_batch: int = 64
    feature_batch: int = 16
    vocab_cut: int = 2048
    seed: int = 0
    device: str = "cpu"
    threads: int = 0
    amp: bool = True
    save_dtype: str = "bf16"
    ckpt_every: int = 50
    ckpt_minutes: float = 2.0
    log_every: int = 25
    max_minutes: Optional[float] = None
    budget_minutes: Optional[float] = None  # CPU minutes for the whole command
    stop_after: Optional[int] = None
    resume: bool = False
    eval_prompts: int = 32
    eval_prompt_len: int = 64
    eval_new_tokens: int = 128
    quick: bool = False

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / Path(self.out).name


QUICK = dict(steps=10, batch_size=4, onpolicy_seqs=8, corpus_seqs=4, prompt_len=8, gen_len=16, top_k=8, gen_batch=8,
             feature_batch=8, warmup=2, ckpt_every=5, log_every=5, eval_prompts=4, eval_prompt_len=8,
             eval_new_tokens=12, vocab_cut=64, depth=2)

_SAVE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def cpu_seconds() -> float:
    """CPU time of this process, all threads, user + system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


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


def _data_key(target: Model, cfg: EagleTrainConfig, corpus_fp: str, aux: tuple[int, ...]) -> str:
    root = Path(target.path)
    h = hashlib.sha1()
    for f in sorted(root.glob("*.safetensors")) + [root / "config.json"]:
        st = f.stat()
        h.update(f"{f.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(json.dumps([corpus_fp, cfg.onpolicy_seqs, cfg.corpus_seqs, cfg.prompt_len, cfg.gen_len, cfg.greedy_frac,
                         cfg.top_k, cfg.seed, list(aux), str(target.dtype), str(target.weight_dtype),
                         target.kernels.describe()]).encode())
    return h.hexdigest()[:16]


@torch.inference_mode()
def target_features(target: Model, seqs: torch.Tensor, aux: tuple[int, ...], top_k: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of the runtime's forward: the aux layers' residuals concatenated (fp16 [B, T, 3H]),
    top-k log-probs (fp16) and their ids ([B, T, k])."""
    b, t = seqs.shape
    cache = target.new_cache(b, t)
    out = target.run(seqs.to(target.device), cache, hidden_layers=aux)
    feats = torch.cat([out.layers[i] for i in aux], dim=-1)
    lp, idx = torch.log_softmax(out.logits.float(), -1).topk(min(top_k, target.vocab_size), dim=-1)
    idx_dtype = torch.int16 if target.vocab_size <= 32767 else torch.int32
    return feats.to(torch.float16).cpu(), lp.half().cpu(), idx.to(idx_dtype).cpu()


def build_data(target: Model, cfg: EagleTrainConfig, run_dir: Path, aux: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Rollouts plus corpus windows with their features and teacher law, cached in ``run_dir``."""
    train_files, _ = D.split_corpus(D.list_corpus(cfg.corpus or None))
    key = _data_key(target, cfg, D.corpus_fingerprint(train_files), aux)
    path = run_dir / f"eagle-data-{key}.pt"
    if path.is_file():
        log(f"reusing cached rollouts and target features: {path}")
        return torch.load(path, weights_only=True)
    if target.tokenizer is None:
        raise ValueError(f"target {target.path} has no tokenizer.json; training an EAGLE draft needs corpus prompts")
    seq_len = cfg.prompt_len + cfg.gen_len
    if seq_len > target.max_seq_len:
        raise ValueError(f"--prompt-len + --gen-len = {seq_len} exceeds the target's context of {target.max_seq_len}")
    stream = D.token_stream(train_files, encode_batch_fn(target.tokenizer), doc_separator(target))
    prompts = sample_windows(stream, cfg.onpolicy_seqs, cfg.prompt_len, cfg.seed)
    windows = sample_windows(stream, cfg.corpus_seqs, seq_len, cfg.seed + 2) if cfg.corpus_seqs else None
    n_greedy = int(round(cfg.greedy_frac * cfg.onpolicy_seqs))
    g = torch.Generator().manual_seed(cfg.seed + 1)
    t0 = time.time()
    parts: dict[str, list[torch.Tensor]] = {"tokens": [], "aux": [], "lp": [], "idx": []}

    def keep(seqs: torch.Tensor) -> None:
        for j in range(0, len(seqs), cfg.feature_batch):
            s = seqs[j:j + cfg.feature_batch]
            f, lp, idx = target_features(target, s, aux, cfg.top_k)
            for name, x in (("tokens", s.to(torch.int32)), ("aux", f), ("lp", lp), ("idx", idx)):
                parts[name].append(x)

    bar = tqdm(total=cfg.onpolicy_seqs, desc="rollouts + features", unit="seq", file=sys.stderr, mininterval=10)
    for i in range(0, cfg.onpolicy_seqs, cfg.gen_batch):
        chunk = prompts[i:i + cfg.gen_batch]
        temps = torch.tensor([0.0 if i + r < n_greedy else 1.0 for r in range(len(chunk))])
        for temp in temps.unique().tolist():
            keep(generate(target, chunk[(temps == temp).nonzero().squeeze(1)], cfg.gen_len, temp, g))
        bar.update(len(chunk))
    bar.close()
    if windows is not None:
        keep(windows)
    ds = {name: torch.cat(xs) for name, xs in parts.items()}
    tmp = path.with_suffix(".tmp")
    torch.save(ds, tmp)
    tmp.replace(path)
    log(f"{cfg.onpolicy_seqs} rollouts ({n_greedy} greedy) + {cfg.corpus_seqs} corpus windows x {seq_len} tokens with "
        f"features of layers {list(aux)} and top-{cfg.top_k} teacher log-probs in {time.time() - t0:.0f}s -> {path}")
    return ds


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
def evaluate_eagle(target: Model, net: EagleNet, prompts: torch.Tensor, new_tokens: int, depth: int = EVAL_DEPTH
                   ) -> tuple[list[float], float, int]:
    """Held-out acceptance of the top-1 chain on the target's greedy continuations: (α by depth given the
    earlier depths were accepted, τ = 1 + mean accepted chain length, anchors). Depth k from anchor a is
    the draft's step k at position a + k (``unroll``), scored against the greedy token x_{a+k+2}."""
    seqs = generate(target, prompts, new_tokens, 0.0)
    emb = input_embedding(target).float()
    aux_ids = tuple(net.cfg.aux_layers)
    p = prompts.shape[1]
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


class _CpuBudget:
    """Ends the loop when the command's CPU budget is spent; until then it keeps ``cfg.steps`` at the
    step the budget is predicted to run out, so the cosine schedule follows CPU time."""

    def __init__(self, cfg: EagleTrainConfig, spent_before: float, reserve_s: float) -> None:
        self.cfg, self.max_steps = cfg, cfg.steps
        self.limit = cfg.budget_minutes * 60 - reserve_s if cfg.budget_minutes else None
        self.base = spent_before - cpu_seconds()  # CPU of earlier invocations
        self.per_step: Optional[float] = None
        self.last = cpu_seconds()

    def used(self) -> float:
        return self.base + cpu_seconds()

    def after_step(self, step: int) -> None:
        now = cpu_seconds()
        dt, self.last = now - self.last, now
        if self.limit is None:
            return
        self.per_step = dt if self.per_step is None else 0.9 * self.per_step + 0.1 * dt
        left = self.limit - self.used()
        if left <= 0:
            self.cfg.steps = step + 1  # the loop ends after this step
        else:
            self.cfg.steps = min(self.max_steps, step + 1 + max(1, int(left / max(self.per_step, 1e-6))))


def train_eagle(cfg: EagleTrainConfig) -> EagleTrainResult:
    run_dir = cfg.resolved_run_dir()
    if cfg.resume and not has_checkpoint(run_dir):
        load_checkpoint(run_dir)  # raises the clear "no checkpoint" error
    if cfg.depth < 1:
        raise ValueError(f"--eagle-depth must be at least 1, got {cfg.depth}")
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.device)
    governor = ThreadGovernor(cfg.threads) if device.type == "cpu" else None
    seed_everything(cfg.seed)
    t_start = time.time()
    spent_before = 0.0
    if cfg.resume:
        spent_before = float(load_checkpoint(run_dir).get("cpu_seconds", 0.0))
    budget = _CpuBudget(cfg, spent_before, reserve_s=60.0 if not cfg.quick else 0.0)
    target = load_model(cfg.target, device=str(device))
    aux = default_aux_layers(target.config.n_layers)
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
        with autocast(device, cfg.amp):
            loss, agree = ttt_loss(net, emb, feats[rows].to(device).float(), s_tok, lp[rows].to(device),
                                   to_pos[idx[rows].long()].to(device), cfg.depth)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
        opt.step()
        if not agree_ema:
            agree_ema.extend(agree)
        else:
            agree_ema[:] = [0.9 * a + 0.1 * b for a, b in zip(agree_ema, agree)]
        budget.after_step(step)
        return loss.item(), cfg.batch_size * t_len

    def log_line(s: LoopState, loss: float, lr: float) -> str:
        accs = " ".join(f"{a:.3f}" for a in agree_ema)
        return (f"step {s.step} fkl {loss:.4f} (ema {s.loss_ema:.4f}) top-1 agreement per TTT step {accs} lr {lr:.2e} "
                f"{s.tok_s:,.0f} pos/s elapsed {s.elapsed() / 60:.1f} min, CPU {budget.used() / 60:.1f} min")

    if budget.limit is not None and budget.used() >= budget.limit:
        log(f"the CPU budget of {cfg.budget_minutes} min was spent before training ({budget.used() / 60:.1f} min)")
        cfg.steps = state.step
    state = train_loop(cfg, "eagle draft", state, opt, governor, train_step, save, log_line)
    if state.stopped:
        return EagleTrainResult(Path(cfg.out), state.step, [], 0.0, budget.used() / 60)
    net.eval()
    _, held = D.split_corpus(D.list_corpus(cfg.corpus or None))
    assert target.tokenizer is not None
    held_stream = D.token_stream(held, encode_batch_fn(target.tokenizer), doc_separator(target))
    prompts = sample_windows(held_stream, cfg.eval_prompts, cfg.eval_prompt_len, EVAL_SEED)
    net_cpu = net.float()
    alpha, tau, anchors = evaluate_eagle(target, net_cpu, prompts, cfg.eval_new_tokens)
    cpu_min = budget.used() / 60
    recipe = {**asdict(cfg), "steps_done": state.step, "train_minutes": round(state.elapsed() / 60, 2),
              "wall_minutes_this_invocation": round((time.time() - t_start) / 60, 2),
              "cpu_minutes_total": round(cpu_min, 2), "threads": torch.get_num_threads(), "eval_anchors": anchors,
              "eval_tau_chain": round(tau, 4)}
    net_cpu.cfg.target = describe_target(target)
    net_cpu.cfg.recipe = recipe
    net_cpu.cfg.depth_acceptance = [round(a, 5) for a in alpha]
    save_eagle(cfg.out, net_cpu, _SAVE_DTYPES[cfg.save_dtype])
    write_vocab_file(cfg.out, ranked, counts, cut, "the target's top-1 tokens on its training-split rollouts")
    (run_dir / "result.json").write_text(json.dumps({"depth_acceptance": alpha, "tau_chain": tau, "recipe": recipe},
                                                    indent=2, default=str) + "\n")
    return EagleTrainResult(Path(cfg.out), state.step, alpha, tau, cpu_min)


__all__ = ["EagleTrainConfig", "EagleTrainResult", "QUICK", "evaluate_eagle", "train_eagle", "ttt_loss"]
