"""``specdecode train | distill | eval-draft``: argparse front end for the training side.

``add_subcommands(subparsers)`` is called by the main ``specdecode`` CLI;
``python -m specdecode.train.cli ...`` runs the same commands standalone.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, TypeVar

from ..config import ConfigError
from .distill import distill
from .distill_common import LOSSES, DistillConfig
from .distill_common import QUICK as DISTILL_QUICK
from .eval_cli import add_draft_vocab, add_eval
from .export_engines import add_export
from .pretrain import PretrainConfig, pretrain
from .pretrain import QUICK as PRETRAIN_QUICK

if TYPE_CHECKING:
    from .selfdistill import SelfDistillConfig

Cfg = TypeVar("Cfg", bound="PretrainConfig | DistillConfig | SelfDistillConfig")
Result = TypeVar("Result")


def _explicit(argv: Optional[Sequence[str]], parser: argparse.ArgumentParser) -> set[str]:
    """Dest names of the flags actually typed, so --quick only fills in what the user left out."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = set()
    for action in parser._actions:
        if any(opt in argv or any(a.startswith(opt + "=") for a in argv) for opt in action.option_strings):
            out.add(action.dest)
    return out


def _layer_ids(text: str) -> tuple[int, ...]:
    """"1,4,6" -> (1, 4, 6), for --eagle-layers (the range is checked against the target later)."""
    try:
        ids = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three comma-separated layer numbers such as 1,4,6, got {text!r}")
    if len(ids) != 3 or list(ids) != sorted(ids) or ids[0] < 0:
        raise argparse.ArgumentTypeError(f"expected three layer numbers (0-based, low to high) such as 1,4,6, "
                                         f"got {text!r}")
    return ids


def _fraction(text: str) -> float:
    """A share in [0, 1), for --eagle-warm-frac."""
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"expected a share of the training schedule from 0 up to (not including) 1, "
                                         f"such as 0.5, got {text!r}")
    return x


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", nargs="+", default=[], metavar="PATH",
                   help="folders (walked for text files), globs or files to train on; default: this Python's "
                        "standard library .py files (test suites excluded). 5%% of files, chosen by a hash of "
                        "their relative path, are held out and never trained on")
    p.add_argument("--seed", type=int, default=0, help="random seed (init, batches, sampling)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch; 0 = adaptive: all cores while the machine is otherwise idle, 1 while "
                        "other processes keep it busy (multi-threaded ops stall on a contended CPU)")
    p.add_argument("--no-amp", dest="amp", action="store_false",
                   help="train in fp32 instead of bf16 autocast (autocast keeps fp32 master weights)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --run-dir at its saved step")
    p.add_argument("--run-dir", default=None,
                   help="where checkpoints, the tokenizer and token caches go (default: runs/<name of --out>)")
    p.add_argument("--save-dtype", choices=["bf16", "fp32", "fp16"], default="bf16",
                   help="dtype of the exported model.safetensors")
    p.add_argument("--ckpt-every", type=int, default=None, help="save a resumable checkpoint every N steps")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="wall-clock budget: the cosine schedule follows elapsed time and training stops when it "
                        "runs out (whichever of --steps and the budget ends first)")
    p.add_argument("--stop-after", type=int, default=None,
                   help="stop (with a checkpoint) after N steps of this invocation; continue later with --resume")


def _shape(p: argparse.ArgumentParser, d: PretrainConfig | DistillConfig, who: str) -> None:
    """Shape flags of the model being trained (``who`` prefixes the help: "" for the target, "draft ")."""
    p.add_argument("--dim", type=int, default=d.dim, help=f"{who}hidden size (default: %(default)s)")
    p.add_argument("--layers", type=int, default=d.layers, help=f"{who}decoder layers (default: %(default)s)")
    p.add_argument("--heads", type=int, default=d.heads, help=f"{who}attention heads (default: %(default)s)")
    p.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"{who}key/value heads, GQA (default: %(default)s)")
    p.add_argument("--ffn", type=int, default=d.ffn, help=f"{who}MLP intermediate size (default: %(default)s)")


def _run_training(args: argparse.Namespace, argv: Optional[Sequence[str]], cfg: Cfg, quick: Mapping[str, Any],
                  train: Callable[[Cfg], Result]) -> Optional[Result]:
    """The part ``train`` and ``distill`` share: apply --ckpt-every and the --quick preset (to flags not typed),
    then run ``train``; None when Ctrl-C/SIGTERM stopped it (the run's checkpoint is saved by then)."""
    if args.ckpt_every:
        cfg.ckpt_every = args.ckpt_every
    if args.quick:
        explicit = _explicit(argv, args._parser)
        for name, value in quick.items():
            if name not in explicit:
                setattr(cfg, name, value)
    try:
        return train(cfg)
    except KeyboardInterrupt:
        print("interrupted; the checkpoint in the run directory continues with --resume", file=sys.stderr)
        return None


def _add_train(sub) -> None:
    d = PretrainConfig()
    p = sub.add_parser("train", help="pretrain a Llama-architecture target from scratch on a text/code corpus",
                       description="Train a byte-level BPE tokenizer and a Llama-architecture model from scratch, "
                                   "then write a Hugging Face directory that specdecode and transformers both load.")
    p.add_argument("--out", default=d.out, help="output Hugging Face directory (default: %(default)s)")
    _common(p)
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=d.seq_len,
                   help="tokens per training sequence; also the model's context length (default: %(default)s)")
    _shape(p, d, "")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size, help="BPE vocabulary size (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="linear warmup steps (default: %(default)s)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help="AdamW weight decay (default: %(default)s)")
    p.add_argument("--grad-clip", type=float, default=d.grad_clip,
                   help="clip gradient norm to this (default: %(default)s)")
    p.add_argument("--eval-tokens", type=int, default=d.eval_tokens,
                   help="held-out tokens scored for the final loss/perplexity (default: %(default)s)")
    p.add_argument("--log-every", type=int, default=d.log_every,
                   help="log a plain line every N steps (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="tiny recipe that finishes in seconds (tests, smoke runs); explicit flags still win")
    p.set_defaults(func=_run_train, _parser=p)


def _run_train(args: argparse.Namespace, argv: Optional[Sequence[str]] = None) -> int:
    cfg = PretrainConfig(out=args.out, run_dir=args.run_dir, corpus=list(args.corpus), steps=args.steps,
                         batch_size=args.batch_size, seq_len=args.seq_len, dim=args.dim, layers=args.layers,
                         heads=args.heads, kv_heads=args.kv_heads, ffn=args.ffn, vocab_size=args.vocab_size,
                         lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                         seed=args.seed, device=args.device, threads=args.threads, amp=args.amp,
                         save_dtype=args.save_dtype, max_minutes=args.max_minutes, stop_after=args.stop_after,
                         resume=args.resume, eval_tokens=args.eval_tokens, quick=args.quick,
                         log_every=args.log_every)
    r = _run_training(args, argv, cfg, PRETRAIN_QUICK, pretrain)
    if r is None:
        return 130
    if r.held_out_tokens:
        print(f"held-out loss {r.held_out_loss:.4f}  perplexity {r.held_out_ppl:.2f}  -> {r.out}")
    return 0


def _add_distill(sub) -> None:
    d = DistillConfig()
    p = sub.add_parser("distill", help="distill a small draft model for a target (DistillSpec: on-policy data + KL)",
                       description="Train a small Llama-architecture draft that imitates --target: the target "
                                   "continues corpus prompts (cached on disk), its top-k distributions are the "
                                   "teacher, and the draft minimises forward KL (or TV) to them. The draft shares "
                                   "the target's tokenizer. Reports held-out acceptance α at the end.")
    p.add_argument("--target", default=d.target,
                   help="target model: any checkpoint directory specdecode loads (default: %(default)s)")
    p.add_argument("--out", default=d.out, help="output Hugging Face directory for the draft (default: %(default)s)")
    _common(p)
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="on-policy sequences per step; corpus steps use the same number of tokens "
                        "(default: %(default)s)")
    _shape(p, d, "draft ")
    p.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="linear warmup steps (default: %(default)s)")
    p.add_argument("--loss", choices=LOSSES, default=d.loss,
                   help="fkl: forward KL(target || draft); tv: total variation = 1 - α at T=1 (default: %(default)s)")
    p.add_argument("--onpolicy-seqs", type=int, default=d.onpolicy_seqs,
                   help="target rollouts to generate and train on (default: %(default)s)")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len,
                   help="corpus tokens in each rollout's prompt (default: %(default)s)")
    p.add_argument("--gen-len", type=int, default=d.gen_len,
                   help="tokens the target writes per rollout (default: %(default)s)")
    p.add_argument("--greedy-frac", type=float, default=d.greedy_frac,
                   help="fraction of rollouts decoded greedily; the rest are sampled at T=1 (default: %(default)s)")
    p.add_argument("--corpus-seqs", type=int, default=d.corpus_seqs,
                   help="plain corpus windows at the target's full context length (default: %(default)s)")
    p.add_argument("--corpus-mix", type=float, default=d.corpus_mix,
                   help="fraction of steps trained on corpus windows instead of rollouts (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=d.top_k,
                   help="teacher log-probs kept per position (the rest is one tail bucket) (default: %(default)s)")
    p.add_argument("--gen-batch", type=int, default=d.gen_batch,
                   help="rollouts generated together (default: %(default)s)")
    p.add_argument("--target-dtype", default=d.target_dtype,
                   help="dtype the target runs in for rollouts and teacher logits (default: %(default)s)")
    p.add_argument("--eval-prompts", type=int, default=d.eval_prompts,
                   help="held-out prompts for the final α report (default: %(default)s)")
    p.add_argument("--eval-prompt-len", type=int, default=d.eval_prompt_len,
                   help="tokens per held-out prompt in the final α report (default: %(default)s)")
    p.add_argument("--eval-new-tokens", type=int, default=d.eval_new_tokens,
                   help="target tokens per prompt in the final α report (default: %(default)s)")
    p.add_argument("--method", choices=DISTILL_METHODS, default="draft",
                   help="draft: a small draft model (the flags above); medusa: Medusa-1 heads on the frozen target "
                        "(drafters/medusa.py), trained on its cached hidden states and top-k laws; --out then "
                        "defaults to models/code-medusa and the draft-shape flags do not apply; eagle: an EAGLE-3 "
                        "draft layer (drafters/eagle.py) on the target's low/mid/high features, trained with the "
                        "training-time test; --out defaults to models/code-eagle; early-exit: an exit adapter "
                        "(drafters/exit_adapter.py) that makes the target's first --exit-layer layers a good "
                        "layerskip draft; --out defaults to "
                        "models/code-exit-adapter (default: %(default)s)")
    p.add_argument("--medusa-heads", type=int, default=None,
                   help="medusa: number of heads K (head k predicts the token k+1 positions ahead; default: 4)")
    p.add_argument("--medusa-vocab", type=int, default=None,
                   help="medusa: proposal vocabulary cut recorded in the heads' draft_vocab.json, the N tokens the "
                        "target writes most often (--draft-vocab auto uses it; default: 2048)")
    p.add_argument("--eagle-depth", type=int, default=None,
                   help="eagle: training-time-test steps (the draft learns to continue from its own outputs this "
                        "many times; default: 3)")
    p.add_argument("--eagle-warm-frac", type=_fraction, default=None,
                   help="eagle: share of the training schedule (steps, or the time or CPU budget) run at depth 1 "
                        "(the target's features only, ~2.5x the positions per CPU-second of depth 3) before the full "
                        "training-time test (default: 0)")
    p.add_argument("--eagle-vocab", type=int, default=None,
                   help="eagle: the draft vocabulary (EAGLE-3's d2t): the N tokens the target writes most often "
                        "(default: 2048)")
    p.add_argument("--eagle-ffn", type=int, default=None,
                   help="eagle: MLP width of the draft layer (default: half the target's)")
    p.add_argument("--eagle-layers", type=_layer_ids, default=None, metavar="LOW,MID,HIGH",
                   help="eagle: the three target layers whose output residuals the draft reads, 0-based (default: "
                        "EAGLE-3's hook points 2, L/2 and L-3 as inputs of layers, i.e. outputs of 1, L/2-1, L-4). "
                        "vLLM and SGLang capture outputs of layers up to L-2 only, so keep HIGH <= L-2 to export")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                   help="medusa, eagle, early-exit: the rollouts continue these prompts instead of corpus windows "
                        "(draft with --rollouts: only its held-out prompts, for the final report): one "
                        "JSON object a line, {\"messages\": [...]} or {\"prompt\": \"...\"} rendered with the target's "
                        "chat template, or {\"text\": \"...\"} as it is; each row is the prompt plus the target's "
                        "answer up to --prompt-len + --gen-len tokens (longer prompts are skipped). One prompt in 20, "
                        "by a hash of its text, is held out for the final report (train/chat_prompts.py)")
    p.add_argument("--target-weight-dtype", default=None, choices=["auto", "fp32", "bf16", "fp16", "int8", "int4"],
                   help="medusa, eagle, early-exit: how the frozen target's weights are held for the rollouts and "
                        "features (default: auto, as generate runs it; a GGUF's Q4_1 then is int8; bf16 or fp32 "
                        "reads float weights)")
    p.add_argument("--rollouts", default=None, metavar="DATA.pt",
                   help="medusa, eagle, early-exit: reuse the token rows another of these trainers cached in its run "
                        "directory (<method>-data-<key>.pt) instead of generating rollouts; only this method's "
                        "features are computed (one generation serves every drafter). draft: train on that "
                        "file's rows and top-k teacher as they are (no target pass at all)")
    p.add_argument("--init-layers", default=None, metavar="I,J,...",
                   help="draft with --rollouts: start the draft as the target's embedding, final norm and these of "
                        "its blocks (0-based, one per --layers); the shape flags must then be the target's")
    p.add_argument("--cut-vocab", type=int, default=None, metavar="N",
                   help="draft with --rollouts: train the output over the N tokens the target writes most as its "
                        "top-1 on the rows (FR-Spec); the ranking goes to draft_vocab.json with N as its cut "
                        "(default: the whole vocabulary)")
    p.add_argument("--sample-temperature", type=float, default=None,
                   help="medusa, eagle, early-exit: temperature of the rollouts that are not greedy (default: 1.0)")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="eagle, early-exit: CPU-time budget of the whole command in minutes (rollouts, training, "
                        "evaluation; a resumed run counts its earlier invocations); training gets what the data leaves")
    p.add_argument("--exit-layer", type=int, default=None,
                   help="early-exit: the adapter reads the residual after this many of the target's layers (the "
                        "draft runs them; default: a quarter of the layers)")
    p.add_argument("--adapter-width", type=int, default=None,
                   help="early-exit: MLP width of the adapter's decoder layer (default: half the target's)")
    p.add_argument("--adapter-vocab", type=int, default=None,
                   help="early-exit: proposal vocabulary, the N tokens the target writes most often (default: 2048)")
    p.add_argument("--tokenizer-vocab", type=int, default=None,
                   help="draft: train the draft its OWN byte-level BPE of N tokens on the same corpus and distill it "
                        "on the target's rollouts as text (cross-entropy); use it with --drafter crosstok")
    p.add_argument("--quick", action="store_true", help="tiny recipe that finishes in seconds (tests, smoke runs)")
    p.set_defaults(func=_run_distill, _parser=p)


DISTILL_METHODS = ("draft", "medusa", "eagle", "early-exit")
# distill flags that shape a draft model, meaningless for a module on the frozen target (an error if typed there)
_DRAFT_ONLY = ("dim", "layers", "heads", "kv_heads", "ffn", "loss", "corpus_seqs", "corpus_mix", "target_dtype")
# flags a frozen-target method takes from the draft recipe's parser when typed (its own defaults otherwise)
_FROZEN_SHARED = ("target", "out", "run_dir", "steps", "batch_size", "lr", "warmup", "onpolicy_seqs", "prompt_len",
                  "gen_len", "greedy_frac", "top_k", "gen_batch", "eval_prompts", "eval_prompt_len",
                  "eval_new_tokens", "seed", "device", "threads", "amp", "save_dtype", "max_minutes", "stop_after",
                  "resume", "quick")
# flags only the frozen-target methods take (None when not typed; an error with --method draft)
_FROZEN_ONLY = {"prompts": "prompts", "target_weight_dtype": "target_weight_dtype",
                "sample_temperature": "sample_temperature", "rollouts": "rollouts"}
_DRAFT_TAKES = ("prompts", "rollouts")  # of those, what a draft model trained on a run's rows takes too


@dataclass(frozen=True)
class _FrozenMethod:
    """A ``distill --method`` that trains a module on the frozen target (``train/selfdistill.py``'s recipe)."""

    module: str  # the train submodule with QUICK, the config class and the train function
    config: str
    train: str
    own: tuple[tuple[str, str], ...]  # (flag dest, config field): this method's own flags
    takes: tuple[str, ...] = ()  # draft-recipe flags it also takes (plain corpus windows)
    hint: str = ""  # appended to the error for draft-only flags


_OWN_FLAGS = {"medusa_heads": "--medusa-heads", "medusa_vocab": "--medusa-vocab", "eagle_depth": "--eagle-depth",
              "eagle_warm_frac": "--eagle-warm-frac",
              "eagle_vocab": "--eagle-vocab", "eagle_ffn": "--eagle-ffn", "eagle_layers": "--eagle-layers",
              "budget_minutes": "--budget-minutes",
              "exit_layer": "--exit-layer", "adapter_width": "--adapter-width", "adapter_vocab": "--adapter-vocab"}
_FROZEN = {
    "medusa": _FrozenMethod("medusa", "MedusaTrainConfig", "train_medusa",
                            (("medusa_heads", "num_heads"), ("medusa_vocab", "vocab_cut")),
                            hint="the number of Medusa heads is --medusa-heads"),
    "eagle": _FrozenMethod("eagle", "EagleTrainConfig", "train_eagle",
                           (("eagle_depth", "depth"), ("eagle_warm_frac", "warm_frac"), ("eagle_vocab", "vocab_cut"),
                            ("eagle_ffn", "ffn"), ("eagle_layers", "aux_layers"), ("budget_minutes", "budget_minutes")),
                           takes=("corpus_seqs",),
                           hint="its own flags are --eagle-depth, --eagle-warm-frac, --eagle-vocab, --eagle-ffn, "
                                "--eagle-layers"),
    "early-exit": _FrozenMethod("early_exit", "EarlyExitTrainConfig", "train_early_exit",
                                (("exit_layer", "exit_layer"), ("adapter_width", "width"),
                                 ("adapter_vocab", "vocab_cut"), ("budget_minutes", "budget_minutes")),
                                takes=("corpus_seqs",), hint="its own flags are --exit-layer, --adapter-width, "
                                                             "--adapter-vocab"),
}


def _run_distill_frozen(method: str, args: argparse.Namespace, argv: Optional[Sequence[str]]) -> int:
    """``distill --method medusa|eagle|early-exit``: the flags the user typed override the method's recipe
    defaults (the parser's defaults are the draft model's, e.g. its learning rate and --out)."""
    spec = _FROZEN[method]
    mod = importlib.import_module(f".{spec.module}", __package__)
    typed = _explicit(argv, args._parser)
    wrong = sorted("--" + n.replace("_", "-") for n in _DRAFT_ONLY if n in typed and n not in spec.takes)
    if wrong:
        raise ConfigError(f"{', '.join(wrong)} shape a draft model and do not apply to --method {method} (it trains "
                          f"on the target's hidden size); drop them; {spec.hint}")
    if args.init_layers is not None or args.cut_vocab is not None:
        raise ConfigError(f"--init-layers and --cut-vocab shape a draft model (--method draft), not --method {method}")
    mine = {dest for dest, _ in spec.own}
    foreign = [flag for dest, flag in _OWN_FLAGS.items() if dest not in mine and getattr(args, dest) is not None]
    if foreign:
        raise ConfigError(f"{', '.join(foreign)} do not apply to --method {method}; {spec.hint}")
    cfg = getattr(mod, spec.config)(corpus=list(args.corpus))
    for name in _FROZEN_SHARED + spec.takes:
        if name in typed:
            setattr(cfg, name, getattr(args, name))
    for dest, name in _FROZEN_ONLY.items():
        if getattr(args, dest) is not None:
            setattr(cfg, name, getattr(args, dest))
    quick = dict(mod.QUICK)
    for dest, name in spec.own:
        if getattr(args, dest) is not None:
            setattr(cfg, name, getattr(args, dest))
            quick.pop(name, None)  # a typed flag wins over --quick
    r = _run_training(args, argv, cfg, quick, getattr(mod, spec.train))
    if r is None:
        return 130
    print(r)
    return 0


def _run_distill(args: argparse.Namespace, argv: Optional[Sequence[str]] = None) -> int:
    method = getattr(args, "method", "draft")
    if method in _FROZEN:
        return _run_distill_frozen(method, args, argv)
    frozen_only = ["--" + d.replace("_", "-") for d in _FROZEN_ONLY
                   if getattr(args, d) is not None and d not in _DRAFT_TAKES]
    if frozen_only:
        raise ConfigError(f"{', '.join(frozen_only)} apply to --method medusa, eagle or early-exit, "
                          "not to a draft model")
    if args.rollouts is None and (args.init_layers is not None or args.cut_vocab is not None or args.prompts):
        raise ConfigError("--init-layers, --cut-vocab and --prompts shape a draft trained on --rollouts DATA.pt; "
                          "add --rollouts (a data cache of `distill --method eagle|medusa|early-exit`)")
    typed_own = [dest for dest in _OWN_FLAGS if getattr(args, dest) is not None]
    if typed_own:  # e.g. "--medusa-heads need --method medusa"
        methods = [m for m, spec in _FROZEN.items() if any(d == typed_own[0] for d, _ in spec.own)]
        raise ConfigError(f"{', '.join(_OWN_FLAGS[d] for d in typed_own)} need --method "
                          f"{' or --method '.join(methods)}")
    names = ["target", "out", "run_dir", "steps", "batch_size", "dim", "layers", "heads", "kv_heads", "ffn", "lr",
             "warmup", "loss", "onpolicy_seqs", "prompt_len", "gen_len", "greedy_frac", "corpus_seqs", "corpus_mix",
             "top_k", "gen_batch", "target_dtype", "eval_prompts", "eval_prompt_len", "eval_new_tokens", "seed",
             "device", "threads", "amp", "save_dtype",
             "max_minutes", "stop_after", "resume", "quick", "tokenizer_vocab", "rollouts", "prompts", "init_layers"]
    cfg = DistillConfig(corpus=list(args.corpus), vocab_cut=args.cut_vocab, **{n: getattr(args, n) for n in names})
    r = _run_training(args, argv, cfg, DISTILL_QUICK, distill)
    if r is None:
        return 130
    if r.eval is not None:
        print(r.eval)
    return 0


def add_subcommands(subparsers) -> None:
    """Register ``train``, ``distill``, ``eval-draft``, ``draft-vocab`` and ``export`` on the main CLI's subparsers."""
    _add_train(subparsers)
    _add_distill(subparsers)
    add_eval(subparsers)
    add_draft_vocab(subparsers)
    add_export(subparsers)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m specdecode.train.cli",
                                     description="specdecode training: train a target, distill a draft, measure α")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    return args.func(args, argv)


if __name__ == "__main__":
    sys.exit(main())
