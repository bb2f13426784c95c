"""The chat child (its own process, `python -m finetune_studio.inference.child`).

It keeps base models warm, serves every LoRA adapter of a base from one loaded
copy (the adapter is chosen per row of a decode batch, and switched off for the
base itself), and answers every chat request the server sends it, all at once, on
one step loop. What it says is in `finetune_studio.wire` ("the inference child").

- `child.py`: the entry point: the pipes, the loop that feeds commands in.
- `engine.py`: the requests and the scheduler (one batched forward pass a step).
- `batch.py`: a decode batch: its rows' shared, left-padded KV cache.
- `logprobs.py`: the log-probabilities of chosen tokens and of a prompt.
- `models.py`: loading, the adapters of a base, the LRU and idle unloading.
- `sampling.py`: choosing the next token (greedy, or temperature and top_p).
- `text.py`: token ids to text deltas, and `stop` strings (no torch).

Imports torch, transformers and peft (after `ready` is sent); never FastAPI or
the server's packages.
"""
