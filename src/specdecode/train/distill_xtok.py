"""Distill a draft that has its OWN tokenizer (``distill --tokenizer-vocab N``).

Cross-tokenizer drafts (drafters/crosstok.py) need a draft whose vocabulary
differs from the target's. Forward KL to the target's next-token law is
undefined across vocabularies, so this is sequence-level distillation (Kim &
Rush, 2016): the target continues corpus prompts, the continuations become
*text*, the text is re-tokenized with a fresh byte-level BPE of N tokens
trained on the same corpus split, and the draft minimises next-token
cross-entropy on it (mixed with plain corpus windows). Rollout texts and the
tokenizer are cached in the run directory, so --resume reuses them.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..models import Model
from ..models.llama import LlamaModel
from . import data as D
from .common import ThreadGovernor, autocast, count_params, fmt_count, init_llama, llama_config, param_groups
from .distill_common import DistillConfig, DistillResult
from .evaluate import doc_separator
from .export import save_hf
from .loop import LoopState, log, resume, save_run, train_loop
from .rollout import generate, sample_windows
from .tokenizer import encode_batch_fn, eot_id, load_tokenizer, save_tokenizer, train_tokenizer

IGNORE = -100


def _fresh_tokenizer(cfg: DistillConfig, run_dir: Path, train_files: list) -> Path:
    """Train (or reuse) the draft's byte-level BPE of ``cfg.tokenizer_vocab`` tokens; returns its directory."""
    assert cfg.tokenizer_vocab is not None  # only a draft with its own tokenizer gets here
    tdir = run_dir / f"tokenizer-bpe{cfg.tokenizer_vocab}"
    if (tdir / "tokenizer.json").is_file():
        log(f"reusing the draft tokenizer in {tdir}")
        return tdir
    t0 = time.time()
    tok = train_tokenizer(D.iter_texts(train_files), vocab_size=cfg.tokenizer_vocab)
    save_tokenizer(tok, tdir, model_max_length=4096)
    log(f"trained a byte-level BPE of {tok.get_vocab_size()} tokens for the draft in {time.time() - t0:.0f}s")
    return tdir


def _rollout_texts(target: Model, cfg: DistillConfig, run_dir: Path, train_files: list) -> list[str]:
    """The target's continuations of corpus prompts, as text (prompt included), cached as JSON."""
    key = hashlib.sha1(json.dumps([str(Path(target.path).resolve()), D.corpus_fingerprint(train_files),
                                   cfg.onpolicy_seqs, cfg.prompt_len, cfg.gen_len, cfg.greedy_frac,
                                   cfg.seed]).encode()).hexdigest()[:16]
    path = run_dir / f"rollout-texts-{key}.json"
    if path.is_file():
        log(f"reusing cached target rollouts: {path}")
        return json.loads(path.read_text())
    if target.tokenizer is None:
        raise ValueError(f"target {target.path} has no tokenizer.json; distillation needs corpus text prompts")
    stream = D.token_stream(train_files, encode_batch_fn(target.tokenizer), doc_separator(target))
    prompts = sample_windows(stream, cfg.onpolicy_seqs, cfg.prompt_len, cfg.seed)
    n_greedy = int(round(cfg.greedy_frac * cfg.onpolicy_seqs))
    g = torch.Generator().manual_seed(cfg.seed + 1)
    t0 = time.time()
    texts: list[str] = []
    for i in range(0, cfg.onpolicy_seqs, cfg.gen_batch):
        chunk = prompts[i:i + cfg.gen_batch]
        temps = torch.tensor([0.0 if i + r < n_greedy else 1.0 for r in range(len(chunk))])
        for temp in temps.unique().tolist():
            rows = generate(target, chunk[(temps == temp).nonzero().squeeze(1)], cfg.gen_len, temp, g)
            texts += [target.tokenizer.decode(r.tolist(), skip_special_tokens=False) for r in rows]
    log(f"target wrote {len(texts)} x {cfg.gen_len} tokens ({n_greedy} greedy) in {time.time() - t0:.0f}s")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(texts))
    tmp.replace(path)
    return texts


def _pad_rows(seqs: list[list[int]], length: int) -> torch.Tensor:
    out = torch.full((len(seqs), length), IGNORE, dtype=torch.long)
    for i, s in enumerate(seqs):
        s = s[:length]
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def distill_new_tokenizer(cfg: DistillConfig, target: Model, run_dir: Path, device: torch.device,
                          governor: ThreadGovernor | None) -> DistillResult:
    """Sequence-level distillation of a draft with its own BPE; writes ``cfg.out`` (no α: vocabularies differ)."""
    train_files, _ = D.split_corpus(D.list_corpus(cfg.corpus or None))
    tdir = _fresh_tokenizer(cfg, run_dir, train_files)
    tok = load_tokenizer(tdir)
    eot = eot_id(tok)
    texts = _rollout_texts(target, cfg, run_dir, train_files)
    enc = [[eot] + ids for ids in encode_batch_fn(tok)(texts)]
    ctx = target.max_seq_len
    on_len = min(ctx, max(len(s) for s in enc))
    onpolicy = _pad_rows(enc, on_len)  # [N, L], IGNORE-padded
    corpus = D.BlockSampler(D.token_stream(train_files, encode_batch_fn(tok), eot), ctx - 1,
                            max(1, cfg.batch_size * on_len // ctx), cfg.seed + 2)
    mcfg = llama_config(tok.get_vocab_size(), cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, ctx,
                        bos=eot, eos=eot, tie=True, rope_theta=target.config.rope_theta)
    model = LlamaModel(mcfg, ctx)
    init_llama(model)
    model.to(device).train()
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95),
                            fused=device.type == "cuda")
    state = resume(run_dir, model, opt, asdict(mcfg), "draft") if cfg.resume else LoopState()
    n_params = count_params(model)
    log(f"cross-tokenizer draft: {fmt_count(n_params)} params, vocab {mcfg.vocab_size} (target's: "
        f"{target.vocab_size}); {len(enc)} rollout texts of <= {on_len} draft tokens; cross-entropy")

    def save(s: LoopState) -> None:
        save_run(run_dir, model, opt, asdict(mcfg), s, {"distill_config": asdict(cfg), "tokens_seen": s.tokens_seen})

    def train_step(step: int) -> tuple[float, int]:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        if torch.rand((), generator=g).item() < cfg.corpus_mix:
            seq = corpus.batch(step)
        else:
            seq = onpolicy[torch.randint(0, len(onpolicy), (cfg.batch_size,), generator=g)]
        inp, tgt = seq[:, :-1].clamp_min(0).to(device), seq[:, 1:].to(device)
        with autocast(device, cfg.amp):
            logits = model(inp)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        return loss.item(), int((tgt != IGNORE).sum())

    def log_line(s: LoopState, loss: float, lr: float) -> str:
        return (f"step {s.step} ce {loss:.4f} (ema {s.loss_ema:.4f}) lr {lr:.2e} {s.tok_s:,.0f} tok/s "
                f"elapsed {s.elapsed() / 60:.1f} min")

    state = train_loop(cfg, "distill", state, opt, governor, train_step, save, log_line)
    if state.stopped:
        return DistillResult(Path(cfg.out), state.step, n_params, None)
    info = {"recipe": asdict(cfg), "method": "sequence-level distillation, own tokenizer", "params": n_params,
            "steps": state.step, "target": str(target.path), "tokens_seen": state.tokens_seen,
            "final_loss_ema": state.loss_ema, "wall_minutes": state.elapsed() / 60}
    save_hf(model, Path(cfg.out), cfg.save_dtype, tokenizer_dir=tdir, extra={"distill": info})
    (run_dir / "result.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    log(f"wrote {cfg.out} ({fmt_count(n_params)} params, own BPE of {mcfg.vocab_size} tokens). The vocabularies "
        "differ, so α is not defined per token: measure the pair with "
        "`specdecode bench --methods plain,crosstok --crosstok-draft OUT`.")
    return DistillResult(Path(cfg.out), state.step, n_params, None)
