"""Worker processes: the supervisor (in the server) and the training child (its own process)."""
