"""Training side: tokenizer, target pretraining, draft distillation and draft evaluation.

Everything here runs on a laptop CPU (and on CUDA when present) so the bundled
target/draft pair in ``models/`` can be rebuilt from scratch with one command each.
"""
