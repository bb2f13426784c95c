"""The dataset inspection child (its own process, `python -m finetune_studio.inspection.child`):
reads a training request's data fields as a job would and answers what it found
(`POST /datasets/inspect`, `finetune-studio inspect`). It reads datasets through
`finetune_studio.child.datasets`, as the training child does, and trains nothing."""
