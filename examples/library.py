"""The library: load a target and a drafter, generate, and check the output against plain decoding.

    python examples/library.py                            # the bundled code pair: offline, a few seconds
    python examples/library.py --target smollm2-135m-instruct --chat --prompt "Reverse a string in Python."

With the bundled target the bundled draft model drafts; with a --target of your own (a Hugging Face
folder, a .gguf file or a name `specdecode pull` fetched) and no --draft, `auto` does: it needs no
second model and no training. Greedy output is the target's own, token for token, whatever drafts it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

import specdecode
from specdecode.chat import ChatFormatter

MODELS = Path(__file__).resolve().parents[1] / "models"  # the bundled pair ships in the repository


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="generate once with speculative decoding, then plainly, and compare")
    ap.add_argument("--target", help="HF folder, .gguf file or pulled name (default: the bundled models/code-target)")
    ap.add_argument("--draft", help="a draft model sharing the target's tokenizer (default: the bundled "
                                    "models/code-draft with the bundled target; none with your own target)")
    ap.add_argument("--prompt", default="def fibonacci(n):", help="text to continue (default: %(default)s)")
    ap.add_argument("--chat", action="store_true", help="send the prompt as a user message in the model's template")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    args = ap.parse_args(argv)

    target = specdecode.load_model(args.target or MODELS / "code-target")
    draft_dir = args.draft or (None if args.target else MODELS / "code-draft")
    if draft_dir is not None:
        drafter = specdecode.DraftModelDrafter(specdecode.load_model(draft_dir))  # gamma="auto": the cost model picks
    else:  # no second model: prompt lookup, suffix drafting and an int4 copy of the target, chosen per step
        drafter = specdecode.build_drafter("auto", specdecode.DrafterOptions())
    prompt = ChatFormatter.for_model(target).render([{"role": "user", "content": args.prompt}]) if args.chat \
        else args.prompt

    fast = specdecode.generate(target, prompt, drafter=drafter, max_new_tokens=args.max_new_tokens)
    plain = specdecode.generate(target, prompt, max_new_tokens=args.max_new_tokens)  # no drafter
    print(fast.text if args.chat else args.prompt + fast.text)
    print(f"speculative: {fast.stats.summary()}")
    print(f"plain:       {plain.stats.summary()}")
    print(f"identical to plain decoding: {fast.token_ids == plain.token_ids}")
    return 0 if fast.token_ids == plain.token_ids else 1


if __name__ == "__main__":
    raise SystemExit(main())
