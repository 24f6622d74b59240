"""Pretrain a Llama-architecture target from scratch on a code corpus (``specdecode train``).

One process does everything: tokenizer, token cache, AdamW + warmup/cosine,
bf16 autocast, grad clipping, atomic checkpoints with exact resume, and the
final Hugging Face export plus a held-out loss/perplexity report.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..models.config import ModelConfig
from ..models.llama import LlamaModel
from . import data as D
from .checkpoint import has_checkpoint, load_checkpoint
from .common import (autocast, count_params, fmt_count, init_llama, llama_config, param_groups, pick_device,
                     seed_everything, ThreadGovernor)
from .export import save_hf
from .loop import LoopState, log, resume, save_run, train_loop
from .tokenizer import (DEFAULT_VOCAB_SIZE, encode_batch_fn, eot_id, load_tokenizer, save_tokenizer,
                        train_tokenizer)


@dataclass
class PretrainConfig:
    out: str = "models/code-target"
    run_dir: Optional[str] = None  # default: runs/<basename of out>
    corpus: list[str] = field(default_factory=list)  # empty = the interpreter's stdlib
    steps: int = 1500
    batch_size: int = 4
    seq_len: int = 512
    dim: int = 384
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    ffn: Optional[int] = 1024
    vocab_size: int = DEFAULT_VOCAB_SIZE
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"
    threads: int = 0
    amp: bool = True
    save_dtype: str = "bf16"
    ckpt_every: int = 50
    ckpt_minutes: float = 5.0  # also checkpoint on a wall-clock cadence: slow shared CPUs
    log_every: int = 25
    max_minutes: Optional[float] = None
    stop_after: Optional[int] = None
    resume: bool = False
    eval_tokens: int = 200_000
    quick: bool = False

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / Path(self.out).name


# --quick: a tiny recipe that finishes in seconds on a CPU (tests, smoke runs); explicit flags still win.
QUICK = dict(steps=30, batch_size=4, seq_len=64, dim=64, layers=2, heads=4, kv_heads=2, ffn=128,
             vocab_size=512, lr=3e-3, warmup=5, ckpt_every=10, log_every=10, eval_tokens=4096)


@dataclass
class PretrainResult:
    out: Path
    steps: int
    params: int
    held_out_loss: float
    held_out_ppl: float
    held_out_tokens: int
    train_tokens_per_s: float


def prepare_tokens(cfg: PretrainConfig, run_dir: Path) -> tuple[np.ndarray, np.ndarray, int, list, list]:
    """Corpus split, tokenizer (trained once per run, on the training split only) and cached token streams."""
    files = D.list_corpus(cfg.corpus or None)
    train, held = D.split_corpus(files)
    tok_path, meta_path = run_dir / "tokenizer.json", run_dir / "tokenizer_request.json"
    if tok_path.is_file():
        tok = load_tokenizer(run_dir)
        requested = json.loads(meta_path.read_text())["vocab_size"] if meta_path.is_file() else tok.get_vocab_size()
        if requested != cfg.vocab_size:
            raise ValueError(f"{tok_path} was trained for --vocab-size {requested} but this run asks for "
                             f"{cfg.vocab_size}; pass the same value or use a fresh --run-dir")
        cfg.vocab_size = tok.get_vocab_size()
    else:
        log(f"training byte-level BPE tokenizer (vocab {cfg.vocab_size}) on {len(train)} files")
        tok = train_tokenizer(D.iter_texts(train), cfg.vocab_size)
        meta_path.write_text(json.dumps({"vocab_size": cfg.vocab_size}) + "\n")
        if tok.get_vocab_size() != cfg.vocab_size:
            log(f"note: corpus too small for vocab {cfg.vocab_size}; got {tok.get_vocab_size()}")
            cfg.vocab_size = tok.get_vocab_size()
        save_tokenizer(tok, run_dir, cfg.seq_len)
    eot = eot_id(tok)
    streams = []
    for name, fs in (("train", train), ("heldout", held)):
        cache = run_dir / f"tokens-{name}-{D.corpus_fingerprint(fs)}.npy"
        if cache.is_file():
            streams.append(np.load(cache))
        else:
            s = D.token_stream(fs, encode_batch_fn(tok), eot)
            np.save(cache, s)
            streams.append(s)
    return streams[0], streams[1], eot, train, held


@torch.no_grad()
def held_out_loss(model: LlamaModel, stream: np.ndarray, seq_len: int, device: torch.device, amp: bool,
                  max_tokens: int, batch_size: int = 8) -> tuple[float, int]:
    """Mean next-token loss (nats) over non-overlapping held-out blocks; returns (loss, tokens scored)."""
    blocks = D.pack_blocks(stream, seq_len + 1)
    blocks = blocks[: max(1, max_tokens // seq_len)]
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        b = blocks[i:i + batch_size].to(device)
        with autocast(device, amp):
            logits = model(b[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        n += b[:, 1:].numel()
    model.train()
    return total / n, n


def _model_config(cfg: PretrainConfig, eot: int) -> ModelConfig:
    return llama_config(cfg.vocab_size, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.seq_len,
                        bos=eot, eos=eot, tie=True)


def pretrain(cfg: PretrainConfig) -> PretrainResult:
    run_dir = cfg.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.resume and not has_checkpoint(run_dir):
        load_checkpoint(run_dir)  # raises the clear "no checkpoint" error
    device = pick_device(cfg.device)
    governor = ThreadGovernor(cfg.threads) if device.type == "cpu" else None
    seed_everything(cfg.seed)
    train_stream, held_stream, eot, train_files, held_files = prepare_tokens(cfg, run_dir)
    mcfg = _model_config(cfg, eot)
    model = LlamaModel(mcfg, cfg.seq_len)
    init_llama(model)
    model.to(device).train()
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    state = resume(run_dir, model, opt, asdict(mcfg), "model") if cfg.resume else LoopState()
    n_params = count_params(model)
    sampler = D.BlockSampler(train_stream, cfg.seq_len, cfg.batch_size, cfg.seed)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    log(f"target: {fmt_count(n_params)} params ({mcfg.n_layers}x{mcfg.dim}, heads {mcfg.n_heads}/{mcfg.n_kv_heads}, "
        f"ffn {mcfg.intermediate_size}, vocab {mcfg.vocab_size}) on {device} "
        f"threads={torch.get_num_threads()} amp={cfg.amp}; corpus {len(train_files)} train files "
        f"({len(train_stream):,} tokens), {len(held_files)} held-out files ({len(held_stream):,} tokens); "
        f"{cfg.steps} steps x {tokens_per_step} tokens")

    def save(s: LoopState) -> None:
        save_run(run_dir, model, opt, asdict(mcfg), s, {"train_config": asdict(cfg)})

    gnorm = torch.zeros(())

    def train_step(step: int) -> tuple[float, int]:
        nonlocal gnorm
        batch = sampler.batch(step).to(device, non_blocking=True)
        with autocast(device, cfg.amp):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        return loss.item(), tokens_per_step

    def log_line(s: LoopState, loss: float, lr: float) -> str:
        return (f"step {s.step} loss {loss:.4f} (ema {s.loss_ema:.4f}) lr {lr:.2e} gnorm {float(gnorm):.2f} "
                f"{s.tok_s:,.0f} tok/s threads {torch.get_num_threads()} elapsed {s.elapsed() / 60:.1f} min")

    state = train_loop(cfg, "pretrain", state, opt, governor, train_step, save, log_line)
    step, tok_s = state.step, state.tok_s
    if state.stopped:
        return PretrainResult(Path(cfg.out), step, n_params, float("nan"), float("nan"), 0, tok_s)
    loss, n_eval = held_out_loss(model, held_stream, cfg.seq_len, device, cfg.amp, cfg.eval_tokens)
    info = {"recipe": asdict(cfg), "params": n_params, "steps": step, "train_tokens_seen": step * tokens_per_step,
            "train_split_tokens": int(len(train_stream)), "held_out_tokens_scored": n_eval,
            "held_out_files": len(held_files), "train_files": len(train_files),
            "held_out_loss": loss, "held_out_ppl": math.exp(loss), "train_tokens_per_s": tok_s,
            "wall_minutes": state.elapsed() / 60}
    save_hf(model, Path(cfg.out), cfg.save_dtype, tokenizer_dir=run_dir, extra={"pretrain": info})
    (run_dir / "result.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    log(f"held-out loss {loss:.4f} nats/token, perplexity {math.exp(loss):.2f} over {n_eval:,} tokens "
        f"of {len(held_files)} held-out files")
    log(f"wrote {cfg.out} ({fmt_count(n_params)} params, {cfg.save_dtype})")
    return PretrainResult(Path(cfg.out), step, n_params, loss, math.exp(loss), n_eval, tok_s)
