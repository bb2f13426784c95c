"""The server's side of the children: launchers, the supervisor, restart recovery.

Runs in the API server process: never imports torch, transformers, peft, trl or ray.
"""
