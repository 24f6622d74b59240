"""Streaming: one event per target pass, with the tokens the target accepted from the draft marked.

    python examples/streaming.py                          # the bundled code pair: offline, a few seconds
    python examples/streaming.py --target path/to/model.gguf --prompt "Once upon a time"

Each ``StepEvent`` holds the tokens one target pass produced: the accepted draft tokens, then the
target's own token (its correction, or a bonus when every draft token was accepted). Here the
accepted draft text of each pass is printed in [brackets]; the CLI colours it green instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import specdecode

MODELS = Path(__file__).resolve().parents[1] / "models"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="stream a completion, marking the accepted draft tokens")
    ap.add_argument("--target", help="HF folder, .gguf file or pulled name (default: the bundled models/code-target)")
    ap.add_argument("--prompt", default="class Stack:\n    def __init__(self):\n",
                    help="text to continue (default: a Python class)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    args = ap.parse_args(argv)

    target = specdecode.load_model(args.target or MODELS / "code-target")
    if args.target:  # a target of your own: no second model needed
        drafter = specdecode.build_drafter("auto", specdecode.DrafterOptions())
    else:
        drafter = specdecode.DraftModelDrafter(specdecode.load_model(MODELS / "code-draft"))
    generation = specdecode.GenerationConfig(max_new_tokens=args.max_new_tokens)

    sys.stdout.write(args.prompt)
    passes = 0
    for event in specdecode.stream(target, args.prompt, drafter, generation=generation):
        if isinstance(event, specdecode.StepEvent):
            passes += 1
            n = sum(event.from_draft)  # the accepted draft tokens come first in a step
            drafted, own = "".join(event.pieces[:n]), "".join(event.pieces[n:])
            sys.stdout.write(f"[{drafted}]{own}" if drafted else own)
            sys.stdout.flush()
        else:  # the FinishEvent: why it stopped, and the run's figures
            print(f"\n\n{passes} target passes for {len(event.token_ids)} tokens; finish: {event.reason}")
            print(event.stats.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
