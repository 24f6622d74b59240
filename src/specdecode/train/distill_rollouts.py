"""``distill --method draft --rollouts FILE.pt``: a draft model self-distilled on a frozen-target run's rows.

Why: a chat target's draft must imitate its *answers* under its chat template, which the corpus
recipe (``distill.py``) never shows it. The EAGLE, Medusa and exit-adapter trainers already cache the
target's rows on the training prompts with its top-k law at every position (``<method>-data-<key>.pt``);
training the draft on that file makes one generation serve every drafter. Two choices let it train in
CPU-minutes beside a 30-layer target:

- an FR-Spec cut in training (arXiv:2502.14856): logits over only the N tokens the target most often
  writes as its top-1 on these rows. The same ranking goes to ``draft_vocab.json``, so the runtime
  proposes from the same N tokens, and the output product costs N/V of the full one;
- ``--init-layers``: the draft starts as the target's embedding, final norm and a few of its decoder
  blocks, so it begins in the target's output space rather than from noise.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..drafters.vocab import rank_tokens, write_vocab_file
from ..models import Model, load_model
from ..models.llama import LlamaModel
from .chat_prompts import load_chat_prompts
from .common import ThreadGovernor, autocast, count_params, fmt_count, init_llama, llama_config, param_groups
from .distill_common import DistillConfig, DistillResult, bucket_divergence, optimizer_step, progress_line
from .evaluate import EVAL_SEED, chain_tau, doc_separator
from .export import save_hf
from .loop import LoopState, log, resume, save_run, train_loop
from .selfdistill import eval_sequences

MASKED_LP = -30.0  # teacher log-prob given to a top-k token outside the cut: its mass joins the tail bucket
EVAL_DEPTHS = 6


def parse_init_layers(text: Optional[str], n_layers: int) -> tuple[int, ...]:
    """``--init-layers 0,29`` -> (0, 29): the target's blocks the draft starts from, in order."""
    if not text:
        return ()
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--init-layers takes comma-separated layer numbers such as 0,29; got {text!r}")
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"--init-layers {text}: the target has layers 0..{n_layers - 1}")
    return layers


def load_rows(src: str, target: Model, top_k: int) -> dict[str, torch.Tensor]:
    """The token rows of another run's data cache and the target's top-k teacher stored with them."""
    path = Path(src)
    if not path.is_file():
        raise FileNotFoundError(f"--rollouts: no such file {path}")
    data = torch.load(path, weights_only=True, mmap=True)
    missing = [k for k in ("tokens", "lp", "idx") if k not in data]
    if missing:
        raise ValueError(f"--rollouts {path} holds no {', '.join(missing)}: pass a data cache written by "
                         "`distill --method eagle|medusa|early-exit` (runs/<name>/<method>-data-<key>.pt)")
    tokens, lp, idx = data["tokens"], data["lp"], data["idx"]
    if tokens.shape[1] > target.max_seq_len or int(tokens.max()) >= target.vocab_size:
        raise ValueError(f"--rollouts {path}: rows of {tokens.shape[1]} tokens up to id {int(tokens.max())} do not "
                         f"fit the target (context {target.max_seq_len}, vocabulary {target.vocab_size})")
    k = min(top_k, lp.shape[-1])
    return {"tokens": tokens.clone(), "lp": lp[..., :k].clone(), "idx": idx[..., :k].clone()}


def cut_ranking(idx: torch.Tensor, vocab_size: int) -> tuple[list[int], np.ndarray]:
    """Token ids by how often the target wrote them as its top-1 on the rows (FR-Spec / EAGLE-3's d2t)."""
    return rank_tokens(idx[..., 0].reshape(-1).long().numpy(), vocab_size)


def build_draft(target: Model, cfg: DistillConfig, init: tuple[int, ...]) -> LlamaModel:
    """The draft's shape from the flags; with ``init`` it must be the target's, and starts as its copy."""
    tc = target.config
    eos = min(target.eos_token_ids) if target.eos_token_ids else doc_separator(target)
    mcfg = llama_config(tc.vocab_size, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, target.max_seq_len,
                        bos=doc_separator(target), eos=eos, tie=True, rope_theta=tc.rope_theta)
    mcfg = replace(mcfg, norm_eps=tc.norm_eps)
    model = LlamaModel(mcfg, target.max_seq_len)
    init_llama(model)
    if not init:
        return model
    if len(init) != cfg.layers:
        raise ValueError(f"--init-layers names {len(init)} blocks for a draft of --layers {cfg.layers}")
    shape = (tc.dim, tc.n_heads, tc.n_kv_heads, tc.intermediate_size)
    if (cfg.dim, cfg.heads, cfg.kv_heads, mcfg.intermediate_size) != shape or tc.qkv_bias:
        raise ValueError(f"--init-layers copies the target's blocks, so the draft needs its shape: --dim {tc.dim} "
                         f"--heads {tc.n_heads} --kv-heads {tc.n_kv_heads} --ffn {tc.intermediate_size}")
    src = load_model(str(target.path), device="cpu", dtype="fp32", weight_dtype="fp32", fast=False).module
    assert isinstance(src, LlamaModel)
    with torch.no_grad():
        model.embed.copy_(src.output_matrix() if src.lm_head is not None else src.embed)
        model.norm.copy_(src.norm)
        for mine, theirs in zip(model.layers, init):
            for name, p in mine.named_parameters():
                p.copy_(dict(src.layers[theirs].named_parameters())[name])
    return model


def cut_teacher(lp: torch.Tensor, idx: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k over the cut's positions; tokens outside it get ~zero mass (the tail bucket)."""
    p = pos[idx.long()]
    return torch.where(p >= 0, lp.float(), torch.full_like(lp, MASKED_LP, dtype=torch.float32)), p.clamp_min(0)


@torch.inference_mode()
def evaluate_chain(target: Model, model: LlamaModel, ids: torch.Tensor, prompts: list[list[int]],
                   new_tokens: int) -> tuple[list[float], dict[int, float], int]:
    """Held-out greedy acceptance on the target's greedy answers: α at depth d given depths < d were
    accepted, τ(γ) of the top-1 chain, positions scored. A greedy chain's accepted prefix is the
    target's own text, so the teacher-forced argmax at each position is what the draft would propose."""
    seqs, p = eval_sequences(target, prompts, new_tokens)
    head = model.embed[ids]
    hits = []
    for j in range(0, len(seqs), 8):
        s = seqs[j:j + 8].to(model.embed.device)
        guess = ids[model(s, head=head)[:, p - 1:-1].argmax(-1)]
        hits.append(guess == s[:, p:])
    ok = torch.cat(hits)
    return depth_acceptance(ok, EVAL_DEPTHS), chain_tau(ok, (2, 3, 4, 6)), ok.numel()


def depth_acceptance(ok: torch.Tensor, depths: int) -> list[float]:
    """From per-position top-1 hits ``ok`` [rows, positions]: at every anchor with ``depths`` positions
    after it, the share of chains accepted to depth d among those accepted to depth d - 1."""
    run = torch.ones_like(ok[:, : ok.shape[1] - depths + 1])
    out = []
    for d in range(depths):
        cur = ok[:, d: d + run.shape[1]] & run
        out.append(float(cur.sum()) / max(1, int(run.sum())))
        run = cur
    return out


def distill_on_rollouts(cfg: DistillConfig, target: Model, run_dir: Path, device: torch.device,
                        governor: Optional[ThreadGovernor]) -> DistillResult:
    assert cfg.rollouts is not None
    init = parse_init_layers(cfg.init_layers, target.config.n_layers)
    ds = load_rows(cfg.rollouts, target, cfg.top_k)
    ranked, counts = cut_ranking(ds["idx"], target.vocab_size)
    n_cut = min(cfg.vocab_cut or target.vocab_size, target.vocab_size)
    ids = torch.tensor(ranked[:n_cut], dtype=torch.long)
    pos = torch.full((target.vocab_size,), -1, dtype=torch.long)
    pos[ids] = torch.arange(n_cut)
    model = build_draft(target, cfg, init).to(device).train()
    ids_d = ids.to(device)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))
    state = resume(run_dir, model, opt, asdict(model.cfg), "draft") if cfg.resume else LoopState()
    n_params = count_params(model)
    rows, seq = ds["tokens"].shape
    log(f"draft: {fmt_count(n_params)} params ({cfg.layers}x{cfg.dim}, from target blocks {list(init) or 'none'}) vs "
        f"target {fmt_count(target.num_parameters())}; {rows} rows x {seq} tokens from {cfg.rollouts}; logits over "
        f"the {n_cut} tokens the target writes most; {cfg.steps} steps, threads={torch.get_num_threads()}")

    def save(s: LoopState) -> None:
        save_run(run_dir, model, opt, asdict(model.cfg), s, {"distill_config": asdict(cfg),
                                                             "tokens_seen": s.tokens_seen})

    def train_step(step: int) -> tuple[float, int]:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        pick = torch.randint(0, rows, (cfg.batch_size,), generator=g)
        tokens = ds["tokens"][pick].long().to(device)
        lp, idx = cut_teacher(ds["lp"][pick], ds["idx"][pick], pos)
        with autocast(device, cfg.amp):
            logits = model(tokens, head=model.embed[ids_d])
        loss = bucket_divergence(logits, lp.to(device), idx.to(device), cfg.loss)
        return optimizer_step(model, opt, loss, cfg.grad_clip), tokens.numel()

    t0 = time.time()
    state = train_loop(cfg, "distill", state, opt, governor, train_step, save, progress_line(cfg))
    if state.stopped:
        return DistillResult(Path(cfg.out), state.step, n_params, None)
    model.eval()
    info: dict[str, object] = {
        "recipe": asdict(cfg), "params": n_params, "steps": state.step, "target": str(target.path),
        "target_params": target.num_parameters(), "init_layers": list(init), "rows": rows, "row_tokens": seq,
        "vocab_cut": n_cut, "tokens_seen": state.tokens_seen, "final_loss_ema": state.loss_ema,
        "train_tokens_per_s": state.tok_s, "wall_minutes": state.elapsed() / 60}
    if cfg.prompts:
        held = load_chat_prompts(target, cfg.prompts, cfg.eval_prompt_len).held_out
        g = torch.Generator().manual_seed(EVAL_SEED)
        prompts = [held[i] for i in torch.randperm(len(held), generator=g)[: cfg.eval_prompts].tolist()]
        depth, tau, n = evaluate_chain(target, model, ids_d, prompts, cfg.eval_new_tokens)
        info["held_out"] = {"prompts": len(prompts), "positions": n, "depth_acceptance": [round(a, 4) for a in depth],
                            "tau_chain": {str(k): round(v, 3) for k, v in tau.items()}}
        log(f"held-out acceptance by depth (top-1 chain, greedy): {', '.join(f'{a:.3f}' for a in depth)}; "
            f"τ(γ) {', '.join(f'{k}: {v:.2f}' for k, v in tau.items())} ({n} positions)")
    out = Path(cfg.out)
    save_hf(model, out, cfg.save_dtype, extra={"distill": info})
    if target.tokenizer is not None:
        target.tokenizer.save(str(out / "tokenizer.json"))
    write_vocab_file(out, ranked, counts, n_cut,
                     f"the target's top-1 tokens on the training rows of {Path(cfg.rollouts).name}")
    (run_dir / "result.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    log(f"wrote {out} ({fmt_count(n_params)} params, {cfg.save_dtype}) in {(time.time() - t0) / 60:.1f} min")
    return DistillResult(out, state.step, n_params, None)
