"""Shared fixtures: tiny real checkpoints built once per session with transformers (no downloads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny import build_model  # noqa: E402

torch.set_num_threads(1)  # tiny models gain nothing from threads; avoids oversubscription


# Models come from load_model, whose default is the fast CPU kernel with bf16-dot products where it builds
# (SPECDECODE_FAST_LINEAR=0: eager path), so the exactness tests cover the code users run.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu",
                     help="where the conformance suite runs its models: cpu (default) or cuda, which "
                          "scripts/gpu_check.py passes on a GPU machine (tests skip where it is absent)")
    parser.addoption("--dtype", default="auto",
                     help="the conformance suite's compute dtype: auto (fp32 on the CPU, bf16 on CUDA), fp32, bf16")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The ``--device`` the conformance suite loads its targets and drafts on."""
    name = str(request.config.getoption("--device"))
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"--device {name}: no CUDA device here")
    return name


@pytest.fixture(scope="session")
def dtype(request: pytest.FixtureRequest) -> str:
    """The ``--dtype`` the conformance suite computes in."""
    return str(request.config.getoption("--dtype"))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Targets per architecture plus draft models that share the llama target's tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "llama": build_model(root / "llama", "llama", seed=0),
        "qwen2": build_model(root / "qwen2", "qwen2", seed=1),
        "gpt2": build_model(root / "gpt2", "gpt2", seed=2),
        "mistral": build_model(root / "mistral", "mistral", seed=3),
        "draft": build_model(root / "draft", "llama", seed=4, layers=1, hidden=32),
        "gpt2_draft": build_model(root / "gpt2_draft", "gpt2", seed=5, layers=1, hidden=32),
    }


# Test tiers (issue #28). `make test` runs the fast tier, -m "not slow"; `make test-full` (run by .ci/run after it)
# runs the full tier, -m slow, so every test is in exactly one. Whole modules and whole tests are marked `slow` in
# their files. For parametrized tests whose cases differ in cost, the split is by case id here, from durations
# measured on a 2-core machine: the fast tier keeps one cheap chi-square law test per acceptance rule (rejection,
# block, tree, coupled; greedy identity is tests/models/test_greedy_identity.py) and the cheap architectures.

# Only these cases stay in the fast tier; the test's other cases are in the full tier.
FAST_CASES: dict[str, tuple[str, ...]] = {
    "tests/exactness/test_rejection_law.py::test_output_law_is_target_law": ("1-T1.5-kNone-p0.85-mNone",),
    "tests/exactness/test_block_law.py::test_block_output_law_is_target_law": ("2-T1.0-kNone-pNone-mNone",),
    "tests/exactness/test_block_law.py::test_block_step_law_is_algorithm_2": ("T1.0-kNone-pNone-mNone",),
    "tests/exactness/test_tree_law.py::test_candidates_step_law": ("T0.7-k3-pNone-mNone",),
    "tests/exactness/test_tree_law.py::test_sampled_children_step_law": ("T1.0-kNone-pNone-mNone",),
    "tests/exactness/test_tree_law.py::test_tree_output_law_is_target_law": ("topk-T0.7-k3-pNone-mNone",),
    "tests/exactness/test_coupled_law.py::test_coupled_output_law_is_target_law":
        ("sampled-g1-T1.0-kNone-pNone-mNone",),
    "tests/conformance/test_conformance.py::test_output_law": ("model",),  # one drafter's law, ~4 s
}

# Cases whose id contains one of these parts are in the full tier; the test's other cases stay in the fast tier.
SLOW_CASES: dict[str, tuple[str, ...]] = {
    "tests/unit/test_layerskip.py::test_greedy_identity_single_row": ("gpt2",),
    "tests/unit/test_layerskip.py::test_greedy_identity_batched_rows": ("gpt2",),
    "tests/unit/test_layerskip.py::test_shared_cache_leaves_target_cache_as_without_drafter": ("skip-random",),
    "tests/unit/test_exit_adapter.py::test_greedy_identity_single_row": ("gpt2", "int4", "int8-own-cache"),
    "tests/unit/test_exit_adapter.py::test_greedy_identity_batched_rows": ("gpt2",),
    "tests/unit/test_draft_vocab.py::test_restricted_draft_is_token_identical_to_plain": ("auto",),
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        test = item.nodeid.split("[", 1)[0]
        if test in FAST_CASES:
            slow = callspec.id not in FAST_CASES[test]
        else:
            slow = any(part in callspec.id for part in SLOW_CASES.get(test, ()))
        if slow:
            item.add_marker(pytest.mark.slow)
