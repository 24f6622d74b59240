"""Distill a small draft from a target, DistillSpec style (Zhou et al., 2023, arXiv:2310.08461).

DistillSpec's finding: to maximise acceptance, train the draft on the *target's
own* outputs (on-policy data) with a divergence between the two distributions,
rather than on corpus text with cross-entropy. We therefore

1. let the target continue corpus prompts (greedy and sampled; batched with its
   KV cache) and cache those sequences on disk, so reruns and resumes reuse them;
2. run the target once over every training sequence and keep its top-k
   log-probabilities plus the leftover mass as a tail bucket. The divergence
   between these (k+1)-bucket coarsenings is a lower bound on the full one and is
   exact where it matters (the head); it lets the draft train for many epochs
   at draft speed instead of paying a target forward per step;
3. minimise forward KL (or total variation, whose complement is α at T=1)
   on the on-policy sequences, mixed with plain corpus windows at full context
   length so the draft also sees every position the target can reach.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from ..models import Model, load_model
from ..models.llama import LlamaModel
from . import data as D
from .checkpoint import has_checkpoint, load_checkpoint
from .common import (autocast, count_params, fmt_count, init_llama, llama_config, param_groups, pick_device,
                     seed_everything, ThreadGovernor)
from .distill_common import LOSSES, DistillConfig, DistillResult, bucket_divergence, optimizer_step, progress_line
from .distill_rollouts import distill_on_rollouts
from .distill_xtok import distill_new_tokenizer
from .draft_vocab import build_draft_vocab
from .evaluate import EVAL_SEED, doc_separator, evaluate_draft
from .export import save_hf
from .loop import LoopState, log, resume, save_run, train_loop
from .rollout import full_logits, generate, sample_windows
from .tokenizer import encode_batch_fn


def _target_key(target: Model, cfg: DistillConfig, corpus_fp: str) -> str:
    """Cache key: which target (weights file identity), which corpus, which rollout settings."""
    root = Path(target.path)
    h = hashlib.sha1()
    for f in sorted(root.glob("*.safetensors")) + [root / "config.json"]:
        st = f.stat()
        h.update(f"{f.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(json.dumps([corpus_fp, cfg.onpolicy_seqs, cfg.prompt_len, cfg.gen_len, cfg.greedy_frac,
                         cfg.corpus_seqs, cfg.top_k, cfg.seed, cfg.target_dtype]).encode())
    return h.hexdigest()[:16]


@torch.inference_mode()
def _teacher_topk(target: Model, seqs: torch.Tensor, k: int, batch: int, desc: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Target top-k log-probs (fp16) and ids for every position of every sequence."""
    vals, idx = [], []
    idx_dtype = torch.int16 if target.vocab_size <= 32767 else torch.int32
    for i in tqdm(range(0, len(seqs), batch), desc=desc, file=sys.stderr, mininterval=10, leave=False):
        lp = torch.log_softmax(full_logits(target, seqs[i:i + batch]), -1)
        v, j = lp.topk(k, dim=-1)
        vals.append(v.half().cpu())
        idx.append(j.to(idx_dtype).cpu())
    return torch.cat(vals), torch.cat(idx)


def build_dataset(target: Model, cfg: DistillConfig, run_dir: Path) -> dict[str, torch.Tensor]:
    """On-policy rollouts + corpus windows with the target's top-k teacher, cached in ``run_dir``."""
    train_files, _ = D.split_corpus(D.list_corpus(cfg.corpus or None))
    key = _target_key(target, cfg, D.corpus_fingerprint(train_files))
    path = run_dir / f"distill-data-{key}.pt"
    if path.is_file():
        log(f"reusing cached on-policy data and teacher distributions: {path}")
        return torch.load(path, weights_only=True)
    if target.tokenizer is None:
        raise ValueError(f"target {target.path} has no tokenizer.json; distillation needs corpus text prompts")
    stream = D.token_stream(train_files, encode_batch_fn(target.tokenizer), doc_separator(target))
    seq_len = cfg.prompt_len + cfg.gen_len
    ctx = target.max_seq_len
    if seq_len > ctx:
        raise ValueError(f"--prompt-len + --gen-len = {seq_len} exceeds the target's context of {ctx}")
    prompts = sample_windows(stream, cfg.onpolicy_seqs, cfg.prompt_len, cfg.seed)
    n_greedy = int(round(cfg.greedy_frac * cfg.onpolicy_seqs))
    g = torch.Generator().manual_seed(cfg.seed + 1)
    rows = []
    t0 = time.time()
    bar = tqdm(total=cfg.onpolicy_seqs, desc="target rollouts", unit="seq", file=sys.stderr, mininterval=10)
    for i in range(0, cfg.onpolicy_seqs, cfg.gen_batch):
        chunk = prompts[i:i + cfg.gen_batch]
        temps = torch.tensor([0.0 if i + r < n_greedy else 1.0 for r in range(len(chunk))])
        for temp in temps.unique().tolist():  # greedy and sampled rows of one chunk go separately
            sel = (temps == temp).nonzero().squeeze(1)
            rows.append(generate(target, chunk[sel], cfg.gen_len, temp, g))
        bar.update(len(chunk))
    bar.close()
    onpolicy = torch.cat(rows)
    log(f"generated {onpolicy.shape[0]} x {cfg.gen_len} target tokens ({n_greedy} greedy, "
        f"{cfg.onpolicy_seqs - n_greedy} sampled at T=1) in {time.time() - t0:.0f}s")
    corpus_len = min(ctx, len(stream) - 1)
    corpus = sample_windows(stream, cfg.corpus_seqs, corpus_len, cfg.seed + 2)
    k = min(cfg.top_k, target.vocab_size)
    on_v, on_i = _teacher_topk(target, onpolicy, k, max(1, cfg.gen_batch // 2), "teacher (on-policy)")
    co_v, co_i = _teacher_topk(target, corpus, k, max(1, cfg.gen_batch * seq_len // corpus_len // 2),
                               "teacher (corpus)")
    ds = {"onpolicy": onpolicy.to(torch.int32), "onpolicy_lp": on_v, "onpolicy_idx": on_i,
          "corpus": corpus.to(torch.int32), "corpus_lp": co_v, "corpus_idx": co_i}
    tmp = path.with_suffix(".tmp")
    torch.save(ds, tmp)
    tmp.replace(path)
    log(f"cached distillation data to {path} ({time.time() - t0:.0f}s)")
    return ds


def distill(cfg: DistillConfig) -> DistillResult:
    if cfg.loss not in LOSSES:
        raise ValueError(f"unknown --loss {cfg.loss!r}; use one of {', '.join(LOSSES)}")
    run_dir = cfg.resolved_run_dir()
    if cfg.resume and not has_checkpoint(run_dir):
        load_checkpoint(run_dir)  # raises the clear "no checkpoint" error
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.device)
    governor = ThreadGovernor(cfg.threads) if device.type == "cpu" else None
    seed_everything(cfg.seed)
    target = load_model(cfg.target, device=str(device), dtype=cfg.target_dtype)
    if cfg.tokenizer_vocab is not None:
        return distill_new_tokenizer(cfg, target, run_dir, device, governor)
    if cfg.rollouts is not None:
        return distill_on_rollouts(cfg, target, run_dir, device, governor)
    ds = build_dataset(target, cfg, run_dir)
    tc = target.config
    eos = min(target.eos_token_ids) if target.eos_token_ids else doc_separator(target)
    mcfg = llama_config(tc.vocab_size, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, target.max_seq_len,
                        bos=doc_separator(target), eos=eos, tie=True, rope_theta=tc.rope_theta)
    model = LlamaModel(mcfg, target.max_seq_len)
    init_llama(model)
    model.to(device).train()
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95),
                            fused=device.type == "cuda")
    state = resume(run_dir, model, opt, asdict(mcfg), "draft") if cfg.resume else LoopState()
    n_params = count_params(model)
    on_len = ds["onpolicy"].shape[1]
    co_len = ds["corpus"].shape[1]
    co_batch = max(1, cfg.batch_size * on_len // co_len)
    log(f"draft: {fmt_count(n_params)} params ({mcfg.n_layers}x{mcfg.dim}, heads {mcfg.n_heads}/{mcfg.n_kv_heads}, "
        f"ffn {mcfg.intermediate_size}) vs target {fmt_count(target.num_parameters())}; loss {cfg.loss}; "
        f"{len(ds['onpolicy'])} on-policy x {on_len} + {len(ds['corpus'])} corpus x {co_len} tokens; "
        f"{cfg.steps} steps on {device} threads={torch.get_num_threads()}")

    def save(s: LoopState) -> None:
        save_run(run_dir, model, opt, asdict(mcfg), s, {"distill_config": asdict(cfg), "tokens_seen": s.tokens_seen})

    def train_step(step: int) -> tuple[float, int]:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        use_corpus = len(ds["corpus"]) > 0 and torch.rand((), generator=g).item() < cfg.corpus_mix
        kind = "corpus" if use_corpus else "onpolicy"
        rows = torch.randint(0, len(ds[kind]), (co_batch if use_corpus else cfg.batch_size,), generator=g)
        tokens = ds[kind][rows].long().to(device)
        with autocast(device, cfg.amp):
            logits = model(tokens)
        loss = bucket_divergence(logits, ds[kind + "_lp"][rows].to(device), ds[kind + "_idx"][rows].to(device),
                                 cfg.loss)
        return optimizer_step(model, opt, loss, cfg.grad_clip), tokens.numel()

    state = train_loop(cfg, "distill", state, opt, governor, train_step, save, progress_line(cfg))
    step = state.step
    if state.stopped:
        return DistillResult(Path(cfg.out), step, n_params, None)
    info = {"recipe": asdict(cfg), "params": n_params, "steps": step, "target": str(target.path),
            "target_params": target.num_parameters(), "tokens_seen": state.tokens_seen,
            "final_loss_ema": state.loss_ema, "onpolicy_tokens": int(ds["onpolicy"].numel()),
            "corpus_tokens": int(ds["corpus"].numel()), "train_tokens_per_s": state.tok_s,
            "wall_minutes": state.elapsed() / 60}
    save_hf(model, Path(cfg.out), cfg.save_dtype, tokenizer_dir=Path(target.path), extra={"distill": info})
    vocab_file = build_draft_vocab(cfg.out, corpus=cfg.corpus or None)
    log(f"wrote {cfg.out} ({fmt_count(n_params)} params, {cfg.save_dtype}) and its token ranking {vocab_file.name}; "
        "measuring held-out α")
    draft = load_model(cfg.out, device=str(device))
    target_eval = load_model(cfg.target, device=str(device))
    res = evaluate_draft(target_eval, draft, corpus=cfg.corpus or None, prompts=cfg.eval_prompts, batch_size=32,
                         prompt_len=cfg.eval_prompt_len, new_tokens=cfg.eval_new_tokens, seed=EVAL_SEED)
    info["held_out_alpha"] = json.loads(res.to_json())
    (run_dir / "result.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    d = res.row("draft")
    log(f"held-out α of the draft: {d.alpha_t0:.3f} at T=0, {d.alpha_t1:.3f} at T=1")
    return DistillResult(Path(cfg.out), step, n_params, res)
