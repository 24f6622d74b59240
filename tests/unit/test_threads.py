"""The thread governor: cut to one thread while other processes hold the cores, the full team back when free."""

from __future__ import annotations

import threading

import pytest
import torch

from specdecode.threads import ThreadGovernor, governor, run_delay_s


class Machine:
    """A fake clock and run-delay counter: ``run(seconds, share)`` passes time during which each of our
    threads waited ``share`` of it for a core."""

    def __init__(self, threads: int = 2) -> None:
        self.now = 0.0
        self.delay = 0.0
        self.count = threads

    def run(self, seconds: float, share: float, gov: ThreadGovernor, steps: int = 10) -> None:
        for _ in range(steps):
            self.now += seconds / steps
            self.delay += seconds / steps * share * self.count
            gov.tick()

    def governor(self, most: int = 2, others: int = 0, **kw: float) -> ThreadGovernor:
        def set_threads(n: int) -> None:
            self.count = n

        return ThreadGovernor(most=most, clock=lambda: self.now, delay=lambda: self.delay,
                              set_threads=set_threads, get_threads=lambda: self.count, others=lambda: others,
                              cores=lambda: 2, **kw)


def test_idle_machine_keeps_the_team() -> None:
    m = Machine()
    g = m.governor()
    m.run(5.0, 0.0, g, steps=500)
    assert g.threads == 2 and g.cuts == 0


def test_busy_cores_cut_the_team_at_once_and_keep_it_cut_while_one_thread_waits() -> None:
    m = Machine()
    g = m.governor()
    m.run(0.2, 0.0, g)
    m.run(0.12, 0.5, g)  # two other processes: each of our threads waits half the time
    assert g.threads == 1 and m.count == 1 and g.cuts == 1
    m.run(30.0, 0.33, g, steps=3000)  # still busy: one thread waits a third of the time, no try of a team
    assert g.threads == 1 and g.cuts == 1


def test_a_freed_machine_gets_the_team_back_and_failed_tries_back_off() -> None:
    m = Machine()
    g = m.governor(backoff_s=0.5, max_backoff_s=4.0)
    m.run(0.1, 0.0, g)
    m.run(0.1, 0.5, g)
    assert g.threads == 1
    # one other process on the other core: one thread never waits, a team of two does
    tries = []
    t_end = m.now + 20.0
    while m.now < t_end:
        before = g.threads
        m.run(0.01, 0.4 if g.threads == 2 else 0.0, g, steps=1)
        if before == 1 and g.threads == 2:
            tries.append(m.now)
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert len(tries) >= 4
    assert all(b >= a - 0.1 for a, b in zip(gaps, gaps[1:]))  # doubling ...
    assert gaps[0] < 1.5 and gaps[-1] >= 3.8  # ... up to the cap
    m.run(1.0, 0.0, g, steps=100)  # the other process ends
    m.run(5.0, 0.0, g, steps=500)
    assert g.threads == 2


def test_a_machine_busy_at_the_first_tick_starts_on_one_thread_and_tries_the_team_later() -> None:
    m = Machine()
    g = m.governor(others=1)  # another task runnable when the model loads
    g.tick()
    assert g.threads == 1 and m.count == 1
    m.run(0.3, 0.0, g, steps=30)
    assert g.threads == 1
    m.run(0.5, 0.0, g, steps=50)  # the back-off passed and one thread never waited: the team is tried
    assert g.threads == 2


@pytest.mark.parametrize("team_pass_s, kept", [(0.004, False), (0.002, True)])
def test_a_tried_team_is_kept_only_if_its_passes_are_faster(team_pass_s: float, kept: bool) -> None:
    """Low-priority work on the other core: no run delay to speak of, yet the team may be no faster."""
    m = Machine()
    g = m.governor(others=1)
    g.tick()
    assert g.threads == 1
    for _ in range(200):  # 0.8 s of passes: one thread's, then the tried team's
        m.now += 0.004
        g.observe(1, 0.003 if g.threads == 1 else team_pass_s)
        g.tick()
    assert (g.threads == 2) == kept and g.cuts == (0 if kept else 1)


def test_a_count_the_caller_sets_becomes_the_most() -> None:
    m = Machine()
    g = m.governor()
    m.run(0.2, 0.0, g)
    m.count = 1  # the caller's own torch.set_num_threads(1)
    m.run(5.0, 0.0, g, steps=100)
    assert g.most == 1 and g.threads == 1


def test_no_schedstat_leaves_the_count_alone() -> None:
    calls: list[int] = []
    g = ThreadGovernor(most=2, delay=lambda: None, set_threads=calls.append, get_threads=lambda: 2,
                       others=lambda: 5, cores=lambda: 2)
    for _ in range(100):
        g.tick()
    assert g.threads == 2 and not calls and not g.adaptive


def test_bad_count_is_refused() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1"):
        ThreadGovernor(most=0)


def test_one_governor_per_thread() -> None:
    mine = governor()
    assert governor() is mine
    other: list[ThreadGovernor] = []
    t = threading.Thread(target=lambda: other.append(governor()))
    t.start()
    t.join()
    assert other[0] is not mine


def test_run_delay_reads_this_process() -> None:
    d = run_delay_s()
    if d is None:
        pytest.skip("no /proc schedstat here")
    assert d >= 0.0


@pytest.mark.parametrize("weight_dtype", ["int8", "int4", "fp32"])
def test_thread_count_changes_no_logit(weight_dtype: str) -> None:
    """The governor may change the count mid-request, so a pass must give the same bits at 1 and 2 threads
    (the bundled target: its matrices are wide enough that every parallel kernel splits its work)."""
    from specdecode import load_model
    from specdecode.bundled import DEFAULT_TARGET, default_model_dir

    target = load_model(default_model_dir(DEFAULT_TARGET), weight_dtype=weight_dtype)
    ids = torch.arange(3, 40).unsqueeze(0)
    before = torch.get_num_threads()
    try:
        logits = []
        for n in (1, 2):
            torch.set_num_threads(n)
            cache = target.new_cache(1, 64)
            logits.append(target.forward(ids, cache, rows=slice(0, 1)).clone())
    finally:
        torch.set_num_threads(before)
    assert torch.equal(logits[0], logits[1])
