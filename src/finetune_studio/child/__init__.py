"""What every child process shares, and nothing of the server:

    channel.py        the child's side of the wire (status, progress, stop) and JobFailure
    models.py         loading a model and its tokenizer from a folder, a cache or a GGUF
    precision.py      bf16 or fp32, following the CPU (or the GPU) and the request
    chat_template.py  the rule a model's prompt follows
    completions.py    the assistant spans of a rendered conversation
    datasets/         reading every dataset source and checking every row
    tiny_model.py     a tiny model built offline (tests, the CLI's `tiny-model`)

The training, export, chat, inspection and evaluation children, and the Ray workers,
import it; the server never does, and it imports none of them.
"""
