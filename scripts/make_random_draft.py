"""A useless draft for the "never slower than plain decoding" check: the bundled draft's architecture,
tokenizer and cost, with random weights (so its proposals are almost never accepted).

    python scripts/make_random_draft.py [--draft models/code-draft] [--out runs/random-draft]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", default="models/code-draft")
    ap.add_argument("--out", default="runs/random-draft")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    src, out = Path(args.draft), Path(args.out)
    shutil.copytree(src, out, dirs_exist_ok=True)
    weights = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(args.seed)
    randomised = {k: (torch.randn(v.shape, generator=g) * 0.02).to(v.dtype) if v.dim() == 2 else v.clone()
                  for k, v in weights.items()}
    save_file(randomised, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {out} ({sum(v.numel() for v in randomised.values()) / 1e6:.2f}M random parameters)")


if __name__ == "__main__":
    main()
