"""The training child (its own process, `python -m finetune_studio.training.child`):
the recipe, the trainer's callbacks, the methods (SFT, DPO, ORPO, KTO, GRPO), the
rewards and the throughput figures.

What other children share with it (the wire, model loading, datasets, precision, the
chat-template rule) lives in `finetune_studio.child`. Only what runs training imports
this package: the training child itself and the Ray Train workers (pyproject.toml's
import-linter contracts say so).
"""
