"""`python -m specdecode.kernels`: build every C++ kernel now (what `make setup` runs).

Otherwise each builds on first use, about 40 s apiece on 2 cores, inside a user's first `chat` or
`generate`; built here, the first command starts at once. A kernel that cannot build is reported
and the runtime falls back as it always does (eager PyTorch, dense weights)."""

from __future__ import annotations

import sys
import time

from . import load_extension
from .fused import load_fused_extension
from .quant import QuantUnavailableError, load_quant_extension
from .repack import load_repack_extension


def main() -> int:
    def quant() -> object:
        try:
            return load_quant_extension()
        except QuantUnavailableError as e:
            print(f"  {e}", file=sys.stderr)
            return None

    for name, build in (("small-M linear", load_extension), ("fused decode ops", load_fused_extension),
                        ("quantized linear", quant), ("GGUF repack", load_repack_extension)):
        t = time.perf_counter()
        ok = build() is not None
        print(f"specdecode kernels: {name}: {'ready' if ok else 'unavailable (fallback)'} "
              f"in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
