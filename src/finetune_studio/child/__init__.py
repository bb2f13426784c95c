"""What every child process shares, and nothing of the server: the child's side of
the wire (`channel`), loading a model and its tokenizer (`models`), and the rules a
model's prompt follows (`chat_template`). The training, export, chat, inspection
and evaluation children, and the Ray workers, import it; the server never does."""
