"""The Ray driver child and what its Ray Train workers run (docs/SCALE-OUT.md).

`driver.py` is a child process of the server, like the training child, speaking the
same wire; `sink.py` is the per-job actor that carries rank 0's messages and the
shared stop flag; `worker.py` is the function every Ray Train worker runs: the same
recipe as a local job. Everything here imports ray; nothing of the server does.
"""
