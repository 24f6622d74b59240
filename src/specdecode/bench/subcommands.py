"""The measurements under `specdecode bench <name>`, each a module with ``add_parser(sub)``.

Plain `specdecode bench` runs the method table (``bench/cli.py``); these are the recurring
measurements that used to live in one-off scripts. A new one is a module here plus a line in
``MODULES``.
"""

from __future__ import annotations

import argparse
import importlib

MODULES = (
    "costs",  # v(n) per weight format, kernel path and thread count (and c with --draft)
    "variants",  # registered drafters and their option values against plain decoding
    "replay",  # drafters on the target's recorded greedy answers: exact τ, a predicted speedup, no timing noise
    "load",  # `specdecode serve` under concurrent clients, speculation on vs off
    "kv_dtype",  # decode step time per KV-cache storage dtype against context length
    "llamacpp_decode",  # plain decode speed, ours against llama.cpp's, on the same GGUF files
    "kernel_ab",  # the quantized kernel against its source at a git revision
    "ab",  # the same bench on this tree and on a git revision, alternating pair by pair
    "ladder",  # random-weight GGUFs at real shapes, quantized by llama.cpp: memory, load, speed beside it
    "coldstart",  # a first `specdecode serve` with an empty cost cache: /health, first answer, first requests
    "busy",  # default threads against 1 thread and the Python API, idle and with other processes on the cores
    "ops",  # aten:: operators and host time per plain decode step on the eager path (a GPU step's launches)
)


def add_subcommands(bench: argparse.ArgumentParser) -> None:
    sub = bench.add_subparsers(dest="bench_command",
                               metavar="{costs,variants,replay,load,kv-dtype,llamacpp-decode,kernel-ab,ab,ladder,coldstart,busy,ops}")
    for name in MODULES:
        importlib.import_module(f"{__package__}.{name}").add_parser(sub)
