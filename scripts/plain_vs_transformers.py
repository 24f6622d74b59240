"""Plain decoding: our runtime vs transformers' generate on the same ~30M llama checkpoint, same threads,
interleaved in one run; plus v(γ) = T(target pass over γ+1 tokens) / T(pass over 1 token).

    python scripts/plain_vs_transformers.py [--model DIR] [--threads 2] [--tokens 128] [--reps 3]

Without --model it builds a random ~30M-parameter llama (dim 512, 8 layers, vocab 8192) in a temp dir
(--bf16: stored in bf16, as most HF checkpoints are; every runtime still computes in fp32).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import specdecode as sd


def build_30m(root: Path, bf16: bool) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import transformers
    from tiny import build_model

    path = build_model(root / "llama30m", "llama", vocab_size=8192, hidden=512, layers=8, tokenizer=False,
                       intermediate_size=1408, num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=2048, tie_word_embeddings=True)
    if bf16:  # stored as most HF checkpoints are; both runtimes compute in fp32
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.to(torch.bfloat16).save_pretrained(path)
    return path


def time_ours(model: sd.Model, prompt: list[int], n: int) -> float:
    t = time.perf_counter()
    r = sd.generate(model, prompt, max_new_tokens=n, ignore_eos=True)
    assert len(r.token_ids) == n
    return n / (time.perf_counter() - t)


def time_hf(hf: torch.nn.Module, prompt: list[int], n: int) -> float:
    ids = torch.tensor([prompt])
    t = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)
    assert out.shape[1] == len(prompt) + n
    return n / (time.perf_counter() - t)


def v_gamma(model: sd.Model, gammas: range, reps: int = 30) -> dict[int, float]:
    cache = model.new_cache(1, 512)
    model.forward(torch.arange(100).unsqueeze(0), cache)

    def t_pass(k: int) -> float:
        ids = torch.arange(k).unsqueeze(0)
        best = []
        for _ in range(reps):
            t = time.perf_counter()
            float(model.forward(ids, cache)[0, -1, 0])
            best.append(time.perf_counter() - t)
            cache.trim(k)
        return statistics.median(best)

    base = t_pass(1)
    return {g: t_pass(g + 1) / base for g in gammas}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="store the built checkpoint in bf16 (compute stays fp32)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    path = Path(args.model) if args.model else build_30m(Path(tempfile.mkdtemp()), args.bf16)
    fast = sd.load_model(path)  # the default: the kernel where it builds; a bf16 checkpoint keeps bf16 matrices
    eager = sd.load_model(path, weight_dtype="same", fast=False)  # eager PyTorch, side by side in this process
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(f"model: {path} ({fast.num_parameters() / 1e6:.1f}M params), threads={args.threads}, "
          f"kernels: {fast.kernels.describe()}, weights {fast.weight_dtype}")

    prompt = list(range(1, 33))
    time_ours(fast, prompt, 8), time_ours(eager, prompt, 8), time_hf(hf, prompt, 8)  # warm-up
    a, e, b = [], [], []
    for _ in range(args.reps):  # interleaved so background load hits all alike
        a.append(time_ours(fast, prompt, args.tokens))
        e.append(time_ours(eager, prompt, args.tokens))
        b.append(time_hf(hf, prompt, args.tokens))
    fast_name = "ours, fast path" if fast.fast else "ours, fast (absent)"
    for name, xs in ((fast_name, a), ("ours, eager (fast=False)", e), ("transformers generate", b)):
        print(f"{name:24s} {statistics.mean(xs):7.1f} ± {statistics.pstdev(xs):.1f} tok/s")
    print(f"ratio ours(fast)/transformers: {statistics.mean(a) / statistics.mean(b):.2f}x; "
          f"ours(eager)/transformers: {statistics.mean(e) / statistics.mean(b):.2f}x; "
          f"fast/eager: {statistics.mean(a) / statistics.mean(e):.2f}x")
    for name, m in (("fast", fast), ("eager", eager)):
        v = v_gamma(m, range(1, 9))
        print(f"v(gamma) {name:5s}: " + "  ".join(f"{g}:{x:.2f}" for g, x in v.items()))


if __name__ == "__main__":
    main()
