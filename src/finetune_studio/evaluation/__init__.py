"""The evaluation child (`python -m finetune_studio.evaluation.child`): one evaluation, top to bottom.

It reaches every model through the server's `/v1` over loopback, scores what the models
answer with field libraries (rouge-score, sacrebleu, lm-evaluation-harness), and never
imports FastAPI; the server never imports this package (docs/PROCESSES.md).
"""
