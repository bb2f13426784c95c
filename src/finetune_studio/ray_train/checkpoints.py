"""Checkpoints of a Ray job whose files travel through a URI (storage.py): each one is
uploaded as it is saved, by every rank, and marked complete by rank 0.

Every rank saves its own part of a checkpoint in its own scratch folder (rank 0 the
weights, optimizer and trainer state; each rank its RNG state). On each save, every
rank uploads what it wrote; then all ranks agree, by one all-reduce, that every part
is there, and rank 0 writes the marker and tells the driver, which copies the
checkpoint to the server's machine. A failed upload on any rank fails the job on all
of them at the same step (so no rank waits forever in a collective for another).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_studio.child.channel import JobFailure
from finetune_studio.ray_train.storage import StorageError, Store, put_checkpoint_part
from finetune_studio.wire import checkpoint_name


def everyone_ok(ok: bool) -> bool:
    """True when every rank says ok (an all-reduce: also a barrier); `ok` alone without torch.distributed."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class CheckpointUpload(TrainerCallback):
    def __init__(self, store: Store, job_id: str, rank: int, announce: Callable[[str], None],
                 warn: Callable[[str], None]) -> None:
        self.store = store
        self.job_id = job_id
        self.rank = rank
        self.announce = announce
        self.warn = warn

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        name = checkpoint_name(int(state.global_step))
        local = Path(args.output_dir) / name
        problem = ""
        try:
            if local.is_dir():
                put_checkpoint_part(self.store, self.job_id, local)
        except StorageError as exc:
            problem = str(exc)
        if not everyone_ok(not problem):
            raise JobFailure("storage_unavailable", problem or f"Another worker could not upload its part of {name}; see its log")
        if self.rank == 0:
            try:
                self.store.mark(f"jobs/{self.job_id}/checkpoints/{name}")
                self.announce(name)
            except StorageError as exc:  # the checkpoint is not usable to resume from; training goes on
                self.warn(f"{name} was uploaded but could not be marked complete, so it will not be resumed from: {exc}")
        if args.load_best_model_at_end and self.rank != 0:
            # The trainer loads the best checkpoint at the end on every rank: each needs all of it.
            try:
                self.store.get_tree(f"jobs/{self.job_id}/checkpoints/{name}", local)
            except StorageError as exc:
                problem = str(exc)
        if args.load_best_model_at_end and not everyone_ok(not problem):
            raise JobFailure("storage_unavailable", problem or f"Another worker could not copy {name} back; see its log")
