"""Write models/README.md from the artifacts of the actual runs (no number is typed by hand).

    python scripts/write_model_card.py --target-run runs/target --draft-run runs/draft \
        --alpha runs/alpha.json --cost runs/cost.json --notes runs/card_notes.md
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path


def load(p: Path | None) -> dict | None:
    return json.loads(p.read_text()) if p and p.is_file() else None


def mb(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:.1f} MiB"


def arch(cfg: dict) -> str:
    return (f"{cfg['num_hidden_layers']} layers x {cfg['hidden_size']}, {cfg['num_attention_heads']} heads / "
            f"{cfg['num_key_value_heads']} KV heads (head dim {cfg['head_dim']}), FFN {cfg['intermediate_size']}, "
            f"vocab {cfg['vocab_size']}, context {cfg['max_position_embeddings']}, tied embeddings")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target-run", type=Path, default=Path("runs/target"))
    ap.add_argument("--draft-run", type=Path, default=Path("runs/draft"))
    ap.add_argument("--target", type=Path, default=Path("models/code-target"))
    ap.add_argument("--draft", type=Path, default=Path("models/code-draft"))
    ap.add_argument("--alpha", type=Path, default=None, help="eval-draft --json output (default: distill's report)")
    ap.add_argument("--cost", type=Path, default=None, help="scripts/measure_cost_ratio.py output")
    ap.add_argument("--notes", type=Path, default=None, help="markdown appended verbatim (what was actually run)")
    ap.add_argument("--out", type=Path, default=Path("models/README.md"))
    a = ap.parse_args()
    t = load(a.target_run / "result.json")
    d = load(a.draft_run / "result.json")
    if t is None or d is None:
        sys.exit("missing result.json in the run directories")
    alpha = load(a.alpha) or d["held_out_alpha"]
    cost = load(a.cost)
    tcfg = json.loads((a.target / "config.json").read_text())
    dcfg = json.loads((a.draft / "config.json").read_text())
    tr, dr = t["recipe"], d["recipe"]
    rows = {r["drafter"]: r for r in alpha["rows"]}
    L = []
    w = L.append
    w("# Bundled models: `code-target` and `code-draft`\n")
    w("A Llama-architecture target trained from scratch on Python source code, and a small draft distilled from it "
      "for speculative decoding. Both are ordinary Hugging Face directories (bf16 `model.safetensors`, "
      "`config.json` with `LlamaForCausalLM`, `tokenizer.json`, `generation_config.json`) that "
      "`specdecode.models.load_model` and `transformers.AutoModelForCausalLM` / `AutoTokenizer` both load. "
      "They are demo models: small enough to train on a 2-core CPU in under two hours and to ship in the repository, "
      "not useful code generators.\n")
    w("| | code-target | code-draft |\n|---|---|---|")
    w(f"| parameters | {t['params']:,} | {d['params']:,} |")
    w(f"| architecture | {arch(tcfg)} | {arch(dcfg)} |")
    w(f"| weights | {mb(a.target / 'model.safetensors')} (bf16) | {mb(a.draft / 'model.safetensors')} (bf16) |")
    w(f"| trained | {t['steps']:,} steps, {t['train_tokens_seen']:,} tokens, {t['wall_minutes']:.0f} min | "
      f"{d['steps']:,} steps, {d['tokens_seen']:,} tokens, {d['wall_minutes']:.0f} min (+ rollouts) |\n")
    w("## Results (held-out)\n")
    w(f"- Target held-out loss **{t['held_out_loss']:.3f} nats/token**, perplexity **{t['held_out_ppl']:.1f}** "
      f"({t['held_out_tokens_scored']:,} tokens from {t['held_out_files']} held-out files, "
      f"non-overlapping {tr['seq_len']}-token windows).")
    w(f"- Acceptance rate α (Leviathan et al. 2023) on {alpha['prompts']} held-out prompts of "
      f"{alpha['prompt_len']} tokens, {alpha['new_tokens']} target tokens each "
      f"({alpha['positions_t0']:,} positions per temperature). T=0: fraction of positions where the drafter's argmax "
      "equals the target's along the target's greedy path. T=1: mean of Σx min(p(x), q(x)) along a path the target "
      "samples. Unigram and bigram drafters are fitted on the training split.\n")
    w("| drafter | parameters | α at T=0 | α at T=1 |\n|---|---|---|---|")
    top = next((n for n in rows if n.startswith("draft/top")), None)
    labels = [("draft", "code-draft (full vocabulary)" if top else "code-draft")]
    if top:
        labels.append((top, f"code-draft over its {top.removeprefix('draft/top')} most frequent tokens (runtime default)"))
    labels += [("unigram", "unigram (train split)"), ("bigram", "bigram (train split)")]
    for name, label in labels:
        if name in rows:
            r = rows[name]
            params = f"{r['params']:,}" if r.get("params") else "-"
            if name == "bigram":
                params += " nonzero counts"
            w(f"| {label} | {params} | {r['alpha_t0']:.3f} | {r['alpha_t1']:.3f} |")
    w("")
    if cost:
        c = cost["c"]
        w(f"- Cost ratio **c = {c:.3f}**: median single-token decode step (KV cache holding {cost['context']} tokens, "
          f"{cost['reps']} interleaved repetitions, {cost['device']}, {cost['threads']} thread(s), the runtime's "
          f"CPU fast path with --matmul {cost.get('matmul', 'bf16')}) draft {cost['draft_ms']:.3f} ms "
          f"(output layer over {cost.get('draft_vocab', dcfg['vocab_size'])} tokens) vs target "
          f"{cost['target_ms']:.3f} ms; each draft step follows a target step, as when the engine drafts.")
        a0 = rows[top or "draft"]["alpha_t0"]
        best = max(range(1, 9), key=lambda g: (1 - a0 ** (g + 1)) / ((1 - a0) * (g * c + 1)))
        pred = (1 - a0 ** (best + 1)) / ((1 - a0) * (best * c + 1))
        w(f"- Predicted (not measured) greedy speedup from Leviathan et al.'s formula "
          f"(1 - α^(γ+1)) / ((1 - α)(γc + 1)) with these α and c (it assumes verification is free, v = 1): "
          f"{pred:.2f}x at γ = {best}. Measured speedups: `docs/lab-notes.md`.\n")
    else:
        w("- Cost ratio c: TODO (measure with `scripts/measure_cost_ratio.py`).\n")
    w("## Corpus and split\n")
    w(f"- The standard library `.py` files of the Python that ran the training (CPython {platform.python_version()}, "
      "`sysconfig.get_paths()['stdlib']`), excluding `site-packages`, the test suites (`test/`, `tests/`, "
      "`idle_test/`: ~60% of the bytes, mostly assertion boilerplate and data blobs) and `pydoc_data/` "
      "(one 750 KB string of prose).")
    w(f"- Split by file: a file is held out when the first 8 bytes of sha1(its path relative to the stdlib root) "
      f"are below 5% of 2^64. {t['train_files']} training files ({t['train_split_tokens']:,} tokens), "
      f"{t['held_out_files']} held-out files. Training, the tokenizer, rollout prompts and the n-gram baselines "
      "use only the training files; the loss, perplexity and α prompts use only the held-out files.")
    w(f"- Tokenizer: byte-level BPE (`tokenizers`), {tcfg['vocab_size']} entries, trained on the training split. "
      "`<|endoftext|>` (id 0) is BOS, EOS, PAD and the document separator; encoding prepends it, exactly as "
      "every training document is preceded by it.\n")
    w("## Recipe\n")
    w("Reproduce with `scripts/train_default.sh` (commands below). Training uses bf16 autocast with fp32 master "
      "weights, AdamW (β = 0.9, 0.95), gradient clipping at 1.0, linear warmup then cosine decay to 10% of the peak "
      "learning rate. Both runs are time-budgeted (`--max-minutes`): the schedule follows the wall clock, so the "
      "number of steps, and with it the exact weights, depends on the machine's speed and load.\n")
    w(f"- Target: batch {tr['batch_size']} x {tr['seq_len']} tokens, peak lr {tr['lr']}, warmup {tr['warmup']} "
      f"steps, weight decay {tr['weight_decay']}, seed {tr['seed']}, budget {tr['max_minutes']} min; "
      f"{t['steps']:,} steps = {t['train_tokens_seen']:,} tokens "
      f"({t['train_tokens_seen'] / t['train_split_tokens']:.2f} epochs).")
    w(f"- Draft (DistillSpec, arXiv:2310.08461): the target continued {dr['onpolicy_seqs']} training-split prompts "
      f"of {dr['prompt_len']} tokens by {dr['gen_len']} tokens ({dr['greedy_frac']:.0%} greedy, the rest sampled at "
      f"T=1), plus {dr['corpus_seqs']} corpus windows at full context; the target's top-{dr['top_k']} log-probs "
      f"(+ one tail bucket) on every position are the teacher. Loss: {dr['loss']} "
      f"(forward KL(target || draft)); {dr['corpus_mix']:.0%} of steps on corpus windows; batch "
      f"{dr['batch_size']} rollouts; peak lr {dr['lr']}, warmup {dr['warmup']}, budget {dr['max_minutes']} min; "
      f"{d['steps']:,} steps, {d['tokens_seen']:,} tokens.\n")
    w("```bash\n" + Path("scripts/train_default.sh").read_text().split("mkdir -p runs\n", 1)[1].strip() + "\n```\n")
    if a.notes and a.notes.is_file():
        w(a.notes.read_text().strip() + "\n")
    w("## License and intended use\n")
    w("Trained only on CPython's standard library (Python Software Foundation License). Intended for testing and "
      "demonstrating speculative decoding; outputs are low-quality Python-like text.")
    a.out.write_text("\n".join(L) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
