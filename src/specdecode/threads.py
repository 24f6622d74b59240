"""Intra-op threads that follow what the machine has free, so a busy core slows decoding down, never stalls it.

An OpenMP team of T threads meets at a barrier after every parallel region, hundreds of times a decode
step. When another process holds a core, a member that lost its core waits a whole scheduler slice before
it reaches the barrier, and the rest of the team waits with it: on 2 cores with two busy processes, plain
decoding of SmolLM2 ran 11-64 tok/s with torch's 2 threads against 100-124 with one. Passive waiting does
not save it (44-89) and costs half the speed on an idle machine; only a smaller team does.

``ThreadGovernor`` watches the run delay of this process's threads (time spent runnable but not running,
``/proc/self/task/*/schedstat``). A team whose threads wait for a core more than ``cut_share`` of the time is
cut to one thread at once; the full team is tried again after a back-off that doubles while tries keep
failing, and not while even one thread waits for a core; a team tried after one thread ran is kept only if its
passes are faster (low-priority work on the other core delays a team without much run delay). Before there is
a run delay to read (the first tick, which ``load_model`` gives), the count of runnable tasks decides where it
starts. Where the kernel keeps no schedstat (not Linux), the count stays as set. The decode core ticks it once
a step, on the thread that runs the step (a torch thread count belongs to the thread that sets it), so
``generate``, ``chat`` and the server all pass here.

Changing the count changes no output: every kernel splits work by whole output rows, never a sum.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

TASKS = "/proc/self/task"
_LOCAL = threading.local()


def run_delay_s() -> Optional[float]:
    """Seconds this process's threads have spent runnable but waiting for a CPU (None: not known here)."""
    try:
        total = 0
        for tid in os.listdir(TASKS):
            try:
                with open(f"{TASKS}/{tid}/schedstat", "rb") as f:
                    total += int(f.read().split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue  # a thread that ended between the listing and the read
        return total / 1e9
    except OSError:
        return None


def others_running() -> Optional[int]:
    """Tasks runnable right now outside this thread (``/proc/loadavg``'s 4th field less the reader itself)."""
    try:
        with open("/proc/loadavg") as f:
            return max(0, int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return None


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class ThreadGovernor:
    """The stepping thread's torch thread count: ``most`` (None: torch's count on that thread at the first
    tick) while the machine has the cores, one while other processes hold them.

    ``window_s``: how long each reading of the run delay spans; ``cut_share``: the share of a window the
    team's threads may wait for a core, on average, before it is cut; ``backoff_s``: the first wait before the
    full team is tried again (doubled after each try that is cut, up to ``max_backoff_s``)."""

    most: Optional[int] = None
    adaptive: bool = True
    window_s: float = 0.05
    cut_share: float = 0.15
    try_s: float = 0.25
    backoff_s: float = 0.5
    max_backoff_s: float = 16.0
    clock: Callable[[], float] = time.monotonic
    delay: Callable[[], Optional[float]] = run_delay_s
    set_threads: Callable[[int], None] = torch.set_num_threads
    get_threads: Callable[[], int] = torch.get_num_threads
    others: Callable[[], Optional[int]] = others_running
    cores: Callable[[], int] = cpus
    threads: int = field(default=0, init=False)  # the count set now (0 before the first tick)
    cuts: int = field(default=0, init=False)  # times the team was cut (a figure for the bench and logs)
    _t0: float = field(default=0.0, init=False)
    _d0: Optional[float] = field(default=None, init=False)
    _next_try: float = field(default=0.0, init=False)
    _wait: float = field(default=0.0, init=False)
    _tried_at: Optional[float] = field(default=None, init=False)
    _judged: bool = field(default=True, init=False)  # the last try's speed was compared
    _pass_s: dict[tuple[int, int], float] = field(default_factory=dict, init=False)  # (threads, width) -> s

    def __post_init__(self) -> None:
        if self.most is not None and self.most < 1:
            raise ValueError(f"threads must be >= 1, got {self.most}")
        self._wait = self.backoff_s

    def tick(self) -> None:
        """Called once a step; reads the clock, and the run delay once a window."""
        if self.threads == 0 or self.get_threads() != self.threads:
            self._start()  # first tick, or the caller set a count itself (``torch.set_num_threads``): it is the most
            return
        if not self.adaptive or (self.most or 1) < 2:
            return
        now = self.clock()
        if now - self._t0 < self.window_s:
            return
        d = self.delay()
        if d is None or self._d0 is None:
            self.adaptive = False
            return
        share = (d - self._d0) / (now - self._t0) / self.threads
        self._t0, self._d0 = now, d
        if self.threads > 1 and (share > self.cut_share or self._team_no_faster(now)):
            self._set(1)
            self.cuts += 1
            failed_try = self._tried_at is not None and now - self._tried_at < 4 * self._wait
            self._wait = min(2 * self._wait, self.max_backoff_s) if failed_try else self.backoff_s
            self._next_try, self._tried_at = now + self._wait, None
        elif self.threads == 1:
            if share > self.cut_share:  # even one thread waits: a larger team would only wait longer
                self._next_try = max(self._next_try, now + self._wait)
            elif now >= self._next_try:
                self._set(self.most or 1)
                self._tried_at, self._judged = now, False

    def observe(self, width: int, seconds: float) -> None:
        """A target pass over ``width`` tokens per row took ``seconds`` at the count set now."""
        key = (self.threads, width)
        old = self._pass_s.get(key)
        self._pass_s[key] = seconds if old is None else old + 0.3 * (seconds - old)

    def _team_no_faster(self, now: float) -> bool:
        """A team tried after one thread ran passes no faster than it, for the widths both ran (low-priority
        work on the other core makes a team wait without much run delay); judged once the try is a
        ``try_s`` old."""
        if self._judged or self._tried_at is None or now - self._tried_at < self.try_s:
            return False
        self._judged = True
        pairs = [(t, self._pass_s[(1, w)]) for (n, w), t in self._pass_s.items()
                 if n == self.threads and (1, w) in self._pass_s]
        return bool(pairs) and sum(t for t, _ in pairs) > 0.95 * sum(one for _, one in pairs)

    def _start(self) -> None:
        if self.most is None or self.threads != 0:
            self.most = self.get_threads()
        most = self.most
        self._t0, self._d0 = self.clock(), self.delay()
        if self._d0 is None:
            self.adaptive = False  # no schedstat here: the count stays as set
        # no run delay to read yet: a machine whose cores other tasks fill now starts on one thread (a model
        # loaded and measured by a waiting team took 2-4x the wall time), tried as a team after the back-off
        others = self.others() if self.adaptive and most > 1 else None
        if others is not None and others > self.cores() - most:
            self._set(1)
            self._next_try = self._t0 + self._wait
        else:
            self._set(most)

    def _set(self, n: int) -> None:
        if n != self.get_threads():
            self.set_threads(n)
        self.threads = n


def governor() -> ThreadGovernor:
    """This thread's governor: one per thread, as torch's thread count is, kept across requests so that a
    back-off learnt in one ``generate`` call holds in the next."""
    g: Optional[ThreadGovernor] = getattr(_LOCAL, "governor", None)
    if g is None:
        g = _LOCAL.governor = ThreadGovernor()
    return g
