"""`distill --method draft --rollouts DATA.pt`: a draft model trained on another run's cached rows and teacher,
started from the target's own blocks, with an FR-Spec cut; found beside its target at run time."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from specdecode import generate
from specdecode.cli import resolve_draft_path
from specdecode.config import ConfigError
from specdecode.drafters.model import DraftModelDrafter
from specdecode.models import load_model
from specdecode.train.cli import main as train_cli
from specdecode.train.distill_rollouts import cut_teacher, depth_acceptance
from specdecode.train.evaluate import chain_tau
from specdecode.train.rollout import full_logits, generate as rollout_generate
from specdecode.train.selfdistill import teacher_topk

pytestmark = pytest.mark.slow  # full tier: make test-full


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory, quick_target: Path) -> Path:
    """What a frozen-target trainer caches: the target's greedy rows and its top-8 law at every position."""
    target = load_model(quick_target)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, target.vocab_size, (12, 8), generator=g)
    tokens = rollout_generate(target, prompts, 40, 0.0, g)
    lp, idx = teacher_topk(full_logits(target, tokens), 8, target.vocab_size)
    path = tmp_path_factory.mktemp("rows") / "exit-data-0123.pt"
    torch.save({"tokens": tokens.to(torch.int32), "lp": lp, "idx": idx.to(torch.int32)}, path)
    return path


def _shape(target: Path) -> list[str]:
    c = json.loads((target / "config.json").read_text())
    return ["--dim", str(c["hidden_size"]), "--heads", str(c["num_attention_heads"]), "--kv-heads",
            str(c["num_key_value_heads"]), "--ffn", str(c["intermediate_size"])]


def _distill(target: Path, rows: Path, out: Path, run: Path, *extra: str) -> int:
    return train_cli(["distill", "--quick", "--target", str(target), "--rollouts", str(rows), "--out", str(out),
                      "--run-dir", str(run), "--threads", "1", "--target-dtype", "fp32", *extra])


def test_draft_on_rollouts_drafts_exactly_from_its_cut(tmp_path: Path, quick_target: Path, rows_file: Path) -> None:
    out = tmp_path / "draft"
    assert _distill(quick_target, rows_file, out, tmp_path / "run", "--layers", "1", "--init-layers", "1",
                    "--cut-vocab", "40", *_shape(quick_target)) == 0
    ranking = json.loads((out / "draft_vocab.json").read_text())
    top1 = torch.load(rows_file, weights_only=True)["idx"][..., 0].reshape(-1)
    counts = torch.bincount(top1.long(), minlength=512)
    assert ranking["size"] == 40 and counts[ranking["token_ids"][0]] == counts.max()  # ranked by the teacher's top-1
    assert counts[ranking["token_ids"][:40]].sum() / counts.sum() == pytest.approx(ranking["coverage"], abs=1e-5)
    info = json.loads((out / "training_info.json").read_text())["distill"]
    assert info["init_layers"] == [1] and info["vocab_cut"] == 40 and info["steps"] == 20
    target, draft = load_model(quick_target), load_model(out)
    assert draft.tokenizer is not None and draft.config.n_layers == 1
    drafter = DraftModelDrafter(draft, gamma=3)
    assert drafter.vocab is not None and drafter.vocab.size == 40
    prompt = "def alpha_beta(alpha, beta=3):\n"
    ref = generate(target, prompt, max_new_tokens=24, ignore_eos=True)
    got = generate(target, prompt, drafter, max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == ref.token_ids and got.stats.drafted > 0


def test_init_layers_copy_the_target(tmp_path: Path, quick_target: Path, rows_file: Path) -> None:
    """With a zero learning rate the draft is the target's embedding, final norm and the named block."""
    out = tmp_path / "draft"
    assert _distill(quick_target, rows_file, out, tmp_path / "run", "--layers", "1", "--init-layers", "1",
                    "--lr", "0", "--save-dtype", "fp32", *_shape(quick_target)) == 0
    t, d = load_model(quick_target, weight_dtype="fp32").module, load_model(out, weight_dtype="fp32").module
    torch.testing.assert_close(d.embed, t.embed)
    torch.testing.assert_close(d.norm, t.norm)
    for name, p in d.layers[0].named_parameters():
        torch.testing.assert_close(p, dict(t.layers[1].named_parameters())[name])


def test_rollouts_flag_errors(tmp_path: Path, quick_target: Path, rows_file: Path) -> None:
    o, r = tmp_path / "o", tmp_path / "r"
    with pytest.raises(ConfigError, match="add --rollouts"):
        train_cli(["distill", "--quick", "--target", str(quick_target), "--init-layers", "0"])
    with pytest.raises(ConfigError, match="--init-layers and --cut-vocab shape a draft model"):
        train_cli(["distill", "--quick", "--method", "eagle", "--target", str(quick_target), "--cut-vocab", "9"])
    with pytest.raises(ValueError, match="the draft needs its shape: --dim 64"):
        _distill(quick_target, rows_file, o, r, "--layers", "1", "--init-layers", "0", "--dim", "32")
    with pytest.raises(ValueError, match="names 2 blocks for a draft of --layers 1"):
        _distill(quick_target, rows_file, o, r, "--layers", "1", "--init-layers", "0,1", *_shape(quick_target))
    with pytest.raises(ValueError, match="the target has layers 0..1"):
        _distill(quick_target, rows_file, o, r, "--layers", "1", "--init-layers", "5", *_shape(quick_target))
    bare = tmp_path / "bare.pt"
    torch.save({"tokens": torch.zeros(2, 4, dtype=torch.int32)}, bare)
    with pytest.raises(ValueError, match="holds no lp, idx"):
        _distill(quick_target, bare, o, r)


def test_cut_teacher_moves_mass_outside_the_cut_to_the_tail() -> None:
    pos = torch.tensor([-1, 0, -1, 1])  # tokens 1 and 3 are in the cut, at positions 0 and 1
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).half()
    lp_cut, idx_cut = cut_teacher(lp, torch.tensor([[3, 0, 1]]), pos)
    assert idx_cut.tolist() == [[1, 0, 0]]
    torch.testing.assert_close(lp_cut.exp(), torch.tensor([[0.5, 0.0, 0.2]]), atol=1e-3, rtol=0)


def test_depth_acceptance_and_tau_of_a_known_hit_pattern() -> None:
    ok = torch.tensor([[True, True, False, True, True, True]])
    # anchors 0..3 (3 positions after each): depth 1 hits 3 of 4, depth 2 (after a hit) 2 of 3, depth 3 1 of 2
    assert depth_acceptance(ok, 3) == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    # runs capped at γ=2 over anchors 0..4: 2, 1, 0, 2, 2
    assert chain_tau(ok, (2,))[2] == pytest.approx(1 + 7 / 5)


def test_a_draft_beside_the_target_is_found(tmp_path: Path) -> None:
    folder = tmp_path / "tgt"
    (folder / "drafters" / "model").mkdir(parents=True)
    args = argparse.Namespace(target=str(folder), draft=None, drafter="model")
    assert resolve_draft_path(args, needed=False) is None  # neither needed nor wanted: nothing loads
    with pytest.raises(Exception, match="bundled draft|--target given without --draft|config.json"):
        resolve_draft_path(argparse.Namespace(target=str(folder), draft=None, drafter=None), needed=True)
    (folder / "drafters" / "model" / "config.json").write_text("{}")
    for needed, wanted in ((True, False), (False, True)):
        assert resolve_draft_path(args, needed, wanted) == str(folder / "drafters" / "model")
    assert resolve_draft_path(argparse.Namespace(target=str(folder), draft="x", drafter=None), True) == "x"
