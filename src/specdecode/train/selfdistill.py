"""What every trainer of a module on a frozen target shares (Medusa heads, EAGLE-3, exit adapters).

They all learn by self-distillation from data the target writes once, up front: it continues
training-split prompts (greedy and sampled at T=1) plus, optionally, plain corpus windows; one pass of
the runtime's own forward over each batch keeps per position what the module reads (``features``)
and the target's top-k log-probs (the teacher), cached in the run directory under a key of everything
that shaped them. This module holds that recipe's common flags (``SelfDistillConfig``), the data
builder, the held-out prompts of the final evaluation, the run setup and the CPU-time budget.
"""

from __future__ import annotations

import hashlib
import json
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm import tqdm

from ..models import Model, load_model
from . import data as D
from .checkpoint import has_checkpoint, load_checkpoint
from .common import ThreadGovernor, pick_device, seed_everything
from .evaluate import EVAL_SEED, doc_separator
from .loop import log
from .chat_prompts import HELD_OUT_SHARE, load_chat_prompts
from .rollout import generate, generate_ragged, sample_windows
from .tokenizer import encode_batch_fn

SAVE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}

Features = Callable[[torch.Tensor], dict[str, torch.Tensor]]  # sequences [B, T] -> named per-position tensors


@dataclass
class SelfDistillConfig:
    """The flags every frozen-target trainer takes; each subclass sets its own defaults and adds its shape."""

    target: str = "models/code-target"
    out: str = "models/out"
    run_dir: Optional[str] = None  # default: runs/<basename of out>
    corpus: list[str] = field(default_factory=list)
    prompts: Optional[str] = None  # JSONL of (chat) prompts instead of corpus windows (train/chat_prompts.py)
    target_weight_dtype: str = "auto"  # how the target's weights are held for rollouts and features
    sample_temperature: float = 1.0  # of the sampled (non-greedy) rollouts
    rollouts: Optional[str] = None  # another run's data cache (.pt): reuse its token rows, compute only features
    steps: int = 3000
    batch_size: int = 512
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    onpolicy_seqs: int = 1024
    corpus_seqs: int = 0  # plain corpus windows of prompt_len + gen_len tokens, besides the rollouts
    prompt_len: int = 64
    gen_len: int = 128
    greedy_frac: float = 0.5  # the rest of the rollouts are sampled at T=1
    top_k: int = 32
    gen_batch: int = 64
    feature_batch: int = 16  # sequences per teacher pass (its logits are [batch, T, V] float32)
    vocab_cut: int = 2048
    seed: int = 0
    device: str = "cpu"
    threads: int = 0
    amp: bool = True
    save_dtype: str = "bf16"
    ckpt_every: int = 100
    ckpt_minutes: float = 3.0
    log_every: int = 50
    max_minutes: Optional[float] = None
    budget_minutes: Optional[float] = None  # CPU minutes for the whole command (rollouts, training, evaluation)
    stop_after: Optional[int] = None
    resume: bool = False
    eval_prompts: int = 32
    eval_prompt_len: int = 64
    eval_new_tokens: int = 128
    quick: bool = False

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / Path(self.out).name


@dataclass
class RunSetup:
    """What ``start_run`` prepared: the run directory, the device and the CPU thread governor."""

    run_dir: Path
    device: torch.device
    governor: Optional[ThreadGovernor]


def start_run(cfg: SelfDistillConfig) -> RunSetup:
    """Check --resume has a checkpoint, create the run directory, pick the device and seed everything."""
    run_dir = cfg.resolved_run_dir()
    if cfg.resume and not has_checkpoint(run_dir):
        load_checkpoint(run_dir)  # raises the clear "no checkpoint" error
    if cfg.save_dtype not in SAVE_DTYPES:
        raise ValueError(f"--save-dtype must be one of {', '.join(SAVE_DTYPES)}, got {cfg.save_dtype!r}")
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.device)
    governor = ThreadGovernor(cfg.threads) if device.type == "cpu" else None
    seed_everything(cfg.seed)
    return RunSetup(run_dir, device, governor)


def load_target(cfg: SelfDistillConfig, device: torch.device | str) -> Model:
    """The frozen target as the trainer runs it: ``--target-weight-dtype`` (default "auto": as the runtime
    holds it, e.g. a GGUF's block types in int8; "bf16"/"fp32" train on the float weights' features)."""
    return load_model(cfg.target, device=str(device), weight_dtype=cfg.target_weight_dtype)


def data_key(target: Model, cfg: SelfDistillConfig, corpus_fp: str, extra: object = None) -> str:
    """Cache key of rollouts and features: target weights, corpus, rollout and teacher settings, ``extra``."""
    root = Path(target.path)
    h = hashlib.sha1()
    files = [root] if root.is_file() else sorted(root.glob("*.safetensors")) + [root / "config.json"]  # a GGUF
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
    if cfg.sample_temperature != 1.0:  # keys of runs made before the option stay valid
        corpus_fp = f"{corpus_fp}:T={cfg.sample_temperature}"
    h.update(json.dumps([corpus_fp, cfg.onpolicy_seqs, cfg.corpus_seqs, cfg.prompt_len, cfg.gen_len, cfg.greedy_frac,
                         cfg.top_k, cfg.seed, str(target.dtype), str(target.weight_dtype), target.kernels.describe(),
                         extra], default=str).encode())
    return h.hexdigest()[:16]


@torch.inference_mode()
def teacher_topk(logits: torch.Tensor, top_k: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k log-probs (fp16) and their ids (int16 when they fit) from logits [..., V]."""
    lp, idx = torch.log_softmax(logits.float(), -1).topk(min(top_k, vocab_size), dim=-1)
    idx_dtype = torch.int16 if vocab_size <= 32767 else torch.int32
    return lp.half().cpu(), idx.to(idx_dtype).cpu()


def build_rollout_data(target: Model, cfg: SelfDistillConfig, run_dir: Path, prefix: str, features: Features,
                       describe: str, extra_key: object = None) -> dict[str, torch.Tensor]:
    """Rollouts (and ``cfg.corpus_seqs`` corpus windows) with ``features`` of each batch plus ``tokens``,
    computed once and cached in ``run_dir`` as ``<prefix>-data-<key>.pt``. ``describe`` names the
    features in the log line."""
    if cfg.rollouts:
        return features_of_rollouts(target, cfg, run_dir, prefix, features, describe, extra_key)
    seq_len = cfg.prompt_len + cfg.gen_len
    chat = load_chat_prompts(target, cfg.prompts, cfg.prompt_len) if cfg.prompts else None
    train_files = D.split_corpus(D.list_corpus(cfg.corpus or None))[0] if chat is None or cfg.corpus_seqs else []
    fp = D.corpus_fingerprint(train_files) if train_files else ""
    if chat is not None:
        fp = f"{fp}|prompts:{chat.fingerprint}"
    key = data_key(target, cfg, fp, extra_key)
    path = run_dir / f"{prefix}-data-{key}.pt"
    if path.is_file():
        log(f"reusing cached rollouts and target features: {path}")
        return torch.load(path, weights_only=True)
    if target.tokenizer is None:
        raise ValueError(f"target {target.path} has no tokenizer.json; self-distillation needs corpus text prompts")
    if seq_len > target.max_seq_len:
        raise ValueError(f"--prompt-len + --gen-len = {seq_len} exceeds the target's context of {target.max_seq_len}")
    stream = (D.token_stream(train_files, encode_batch_fn(target.tokenizer), doc_separator(target))
              if train_files else None)
    windows = sample_windows(stream, cfg.corpus_seqs, seq_len, cfg.seed + 2) if cfg.corpus_seqs and stream is not None \
        else None
    n_greedy = int(round(cfg.greedy_frac * cfg.onpolicy_seqs))
    g = torch.Generator().manual_seed(cfg.seed + 1)
    t0 = time.time()
    parts: dict[str, list[torch.Tensor]] = {}

    def keep(seqs: torch.Tensor) -> None:
        for j in range(0, len(seqs), cfg.feature_batch):
            s = seqs[j:j + cfg.feature_batch]
            for name, x in {"tokens": s.to(torch.int32), **features(s)}.items():
                parts.setdefault(name, []).append(x)

    bar = tqdm(total=cfg.onpolicy_seqs, desc="rollouts + features", unit="seq", file=sys.stderr, mininterval=10)
    temp_s = cfg.sample_temperature
    if chat is not None:
        log(f"{len(chat.train)} training prompts from {cfg.prompts} ({len(chat.held_out)} held out, {chat.too_long} "
            f"over --prompt-len {cfg.prompt_len} skipped); each row: prompt + the target's answer to {seq_len} tokens")
        picks = chat_prompt_order(len(chat.train), cfg.onpolicy_seqs, n_greedy, cfg.seed)
        for temp, idx in ((0.0, picks[:n_greedy]), (temp_s, picks[n_greedy:])):
            idx = sorted(idx, key=lambda j: len(chat.train[j]))  # similar lengths decode together
            for i in range(0, len(idx), cfg.gen_batch):
                batch = [chat.train[j] for j in idx[i:i + cfg.gen_batch]]
                keep(generate_ragged(target, batch, seq_len, temp, g))
                bar.update(len(batch))
    else:
        assert stream is not None
        prompts = sample_windows(stream, cfg.onpolicy_seqs, cfg.prompt_len, cfg.seed)
        for i in range(0, cfg.onpolicy_seqs, cfg.gen_batch):
            chunk = prompts[i:i + cfg.gen_batch]
            temps = torch.tensor([0.0 if i + r < n_greedy else temp_s for r in range(len(chunk))])
            for temp in temps.unique().tolist():  # greedy and sampled rows of one chunk go separately
                keep(generate(target, chunk[(temps == temp).nonzero().squeeze(1)], cfg.gen_len, temp, g))
            bar.update(len(chunk))
    bar.close()
    if windows is not None:
        keep(windows)
    ds = {name: torch.cat(xs) for name, xs in parts.items()}
    tmp = path.with_suffix(".tmp")
    torch.save(ds, tmp)
    tmp.replace(path)
    n_win = 0 if windows is None else len(windows)
    log(f"{cfg.onpolicy_seqs} rollouts ({n_greedy} greedy, the rest sampled at T={temp_s}) + {n_win} corpus windows "
        f"x {seq_len} tokens with {describe} and top-{cfg.top_k} teacher log-probs in {time.time() - t0:.0f}s "
        f"-> {path}")
    return ds


def features_of_rollouts(target: Model, cfg: SelfDistillConfig, run_dir: Path, prefix: str, features: Features,
                         describe: str, extra_key: object = None) -> dict[str, torch.Tensor]:
    """``--rollouts FILE.pt``: the token rows another trainer's run cached (its ``<prefix>-data-<key>.pt``),
    with this trainer's ``features`` computed over them: one generation serves every drafter. Cached in
    ``run_dir`` under a key of the target, the rows' file and the teacher settings."""
    src = Path(cfg.rollouts or "")
    if not src.is_file():
        raise FileNotFoundError(f"--rollouts: no such file {src}")
    st = src.stat()
    key = data_key(target, cfg, f"rollouts:{src.resolve()}:{st.st_size}:{int(st.st_mtime)}", extra_key)
    path = run_dir / f"{prefix}-data-{key}.pt"
    if path.is_file():
        log(f"reusing cached target features: {path}")
        return torch.load(path, weights_only=True)
    tokens = torch.load(src, weights_only=True, mmap=True)["tokens"].clone()
    if tokens.shape[1] > target.max_seq_len or int(tokens.max()) >= target.vocab_size:
        raise ValueError(f"--rollouts {src}: rows of {tokens.shape[1]} tokens up to id {int(tokens.max())} do not fit "
                         f"the target (context {target.max_seq_len}, vocabulary {target.vocab_size})")
    t0 = time.time()
    parts: dict[str, list[torch.Tensor]] = {"tokens": []}
    for j in tqdm(range(0, len(tokens), cfg.feature_batch), desc="features", unit="batch", file=sys.stderr,
                  mininterval=10):
        s = tokens[j:j + cfg.feature_batch].long()
        parts["tokens"].append(s.to(torch.int32))
        for name, x in features(s).items():
            parts.setdefault(name, []).append(x)
    ds = {name: torch.cat(xs) for name, xs in parts.items()}
    tmp = path.with_suffix(".tmp")
    torch.save(ds, tmp)
    tmp.replace(path)
    log(f"{len(tokens)} rollouts x {tokens.shape[1]} tokens from {src} with {describe} and top-{cfg.top_k} teacher "
        f"log-probs in {time.time() - t0:.0f}s -> {path}")
    return ds


def chat_prompt_order(n_prompts: int, n_seqs: int, n_greedy: int, seed: int) -> list[int]:
    """Which prompt each rollout continues: greedy rollouts take distinct prompts while they last (a repeat
    would be the same text); the sampled ones go round a reshuffled order. Seeded."""
    g = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while len(order) < n_seqs:
        order += torch.randperm(n_prompts, generator=g).tolist()
    return order[:n_seqs]


def held_out_prompts(target: Model, cfg: SelfDistillConfig) -> torch.Tensor | list[list[int]]:
    """The final evaluation's prompts: ``eval_prompts`` windows of the held-out files (a fixed seed), or
    with ``--prompts`` up to ``eval_prompts`` of the file's held-out prompts (token lists, ragged)."""
    if cfg.prompts:
        held_chat = load_chat_prompts(target, cfg.prompts, cfg.prompt_len).held_out
        if not held_chat:
            raise ValueError(f"{cfg.prompts}: no held-out prompt (one in {HELD_OUT_SHARE} is held out by a hash of its "
                             "text); add prompts")
        g = torch.Generator().manual_seed(EVAL_SEED)
        return [held_chat[i] for i in torch.randperm(len(held_chat), generator=g)[: cfg.eval_prompts].tolist()]
    _, held = D.split_corpus(D.list_corpus(cfg.corpus or None))
    assert target.tokenizer is not None
    stream = D.token_stream(held, encode_batch_fn(target.tokenizer), doc_separator(target))
    return sample_windows(stream, cfg.eval_prompts, cfg.eval_prompt_len, EVAL_SEED)


def eval_sequences(target: Model, prompts: torch.Tensor | list[list[int]], new_tokens: int
                   ) -> tuple[torch.Tensor, int]:
    """The target's greedy continuations of the evaluation prompts and the position where every row's
    generated part has begun: equal-length prompts get ``new_tokens`` each; ragged (chat) prompts are
    continued to the longest one's length + ``new_tokens``, and scoring starts after the longest."""
    if isinstance(prompts, torch.Tensor):
        return generate(target, prompts, new_tokens, 0.0), prompts.shape[1]
    p = max(len(x) for x in prompts)
    return generate_ragged(target, prompts, p + new_tokens, 0.0), p


def cpu_seconds() -> float:
    """CPU time of this process, all threads, user + system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuBudget:
    """Ends the loop when the command's CPU budget is spent; until then it keeps ``cfg.steps`` at the
    step the budget is predicted to run out, so the cosine schedule follows CPU time."""

    def __init__(self, cfg: SelfDistillConfig, spent_before: float, reserve_s: float) -> None:
        self.cfg, self.max_steps = cfg, cfg.steps
        self.limit = cfg.budget_minutes * 60 - reserve_s if cfg.budget_minutes else None
        self.base = spent_before - cpu_seconds()  # CPU of earlier invocations
        self.per_step: Optional[float] = None
        self.last = cpu_seconds()

    @classmethod
    def for_run(cls, cfg: SelfDistillConfig, run_dir: Path, reserve_s: float) -> "CpuBudget":
        """The budget of this invocation, counting the CPU time a resumed run's checkpoint recorded."""
        spent = float(load_checkpoint(run_dir).get("cpu_seconds", 0.0)) if cfg.resume else 0.0
        return cls(cfg, spent, 0.0 if cfg.quick else reserve_s)

    def used(self) -> float:
        return self.base + cpu_seconds()

    def spent(self) -> bool:
        """Whether the budget ran out before training (then the loop runs no step)."""
        return self.limit is not None and self.used() >= self.limit

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


__all__ = ["CpuBudget", "Features", "RunSetup", "SAVE_DTYPES", "SelfDistillConfig", "build_rollout_data",
           "chat_prompt_order", "cpu_seconds", "data_key", "eval_sequences", "features_of_rollouts", "held_out_prompts",
           "load_target", "start_run", "teacher_topk"]
