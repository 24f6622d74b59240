"""Training checkpoints: model + optimizer + step + RNG, written atomically so a kill never corrupts one."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch

CKPT_NAME = "ckpt.pt"


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CKPT_NAME
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / CKPT_NAME
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}; run without --resume first "
                                "(or point --run-dir at the run to continue)")
    # Our own file: it holds numpy/python RNG states, which weights_only loading rejects.
    return torch.load(path, map_location="cpu", weights_only=False)


def has_checkpoint(run_dir: Path) -> bool:
    return (Path(run_dir) / CKPT_NAME).is_file()


class StopFlag:
    requested: bool = False


def install_stop_handler() -> StopFlag:
    """SIGTERM/SIGINT set a flag instead of killing us, so the loop can checkpoint before exiting."""
    flag = StopFlag()

    def handler(signum, frame):  # noqa: ARG001
        if flag.requested:  # second signal: give up immediately
            raise KeyboardInterrupt
        flag.requested = True

    try:
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread (e.g. called from a server or a test runner thread)
        pass
    return flag
