"""finetune-studio: a local-first server that fine-tunes language models."""

__version__ = "0.1.0"
