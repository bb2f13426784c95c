"""`hf_dataset`: a hub dataset, a local folder that `datasets` can load, or a local file.

- A local file (`.jsonl`, `.json`, `.csv`, `.parquet`, `.txt`) is read like a file
  in `local_datasets`, with its lines and rows named in errors.
- A local folder saved with `save_to_disk` is opened with `datasets.load_from_disk`;
  a `DatasetDict` gives the split named by `train_split` / `eval_split`.
- Any other local folder (parquet, JSON or CSV files...) goes to
  `datasets.load_dataset(folder, subset, split=...)`, which needs no network.
- Anything else is a hub id. Unless `HF_HUB_OFFLINE` (or `HF_DATASETS_OFFLINE`) is
  set, the hub is asked about the dataset first, with a short timeout
  (`HUB_TIMEOUT_SECONDS`): `datasets` itself retries an unreachable hub for about
  half a minute, and the answer also tells "not on the hub" and "gated" apart from
  "no network". With the offline flag set, only the local cache is tried. When the
  hub cannot be reached the job fails with `dataset_not_found` and the words "cannot
  reach the Hugging Face hub; name a local folder or file".

`datasets` and `huggingface_hub` are imported only when a function here runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.datasets.errors import (
    DATASET_NOT_FOUND,
    HUB_UNREACHABLE,
    DatasetError,
    config_error,
    first_line,
)
from finetune_studio.child.datasets.files import Record
from finetune_studio.paths import is_local, local_path

HUB_TIMEOUT_SECONDS = 8.0
_BATCH_ROWS = 1024


@dataclass
class HubSplit:
    """One split of a dataset that `datasets` opened; `label` names it in messages."""

    label: str
    dataset: Any  # datasets.Dataset
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.dataset)

    def records(self, start: int = 0, end: int | None = None) -> Iterator[Record]:
        """("row N", record) for rows start..end-1, read in batches; N is the row's index in the split."""
        columns = list(self.dataset.column_names)
        stop = len(self.dataset) if end is None else min(end, len(self.dataset))
        for first in range(start, stop, _BATCH_ROWS):
            batch = self.dataset[first : min(first + _BATCH_ROWS, stop)]
            for offset, values in enumerate(zip(*(batch[c] for c in columns), strict=True)):
                yield f"row {first + offset}", dict(zip(columns, values, strict=True))


def open_hf_dataset(
    name: str, *, subset: str | None, split: str, split_field: str, token: str | None
) -> Path | HubSplit:
    """A local data file to read with `files.read_records`, or the split of a dataset.

    `split_field` is the request field that named the split ("train_split" or
    "eval_split"), for messages.
    """
    path = local_path(name)
    if path.is_file():
        if split_field == "eval_split":
            raise config_error(
                f"eval_split needs hf_dataset to be a dataset with splits, but {path} is one file;"
                " name evaluation files in local_eval_datasets"
            )
        return path
    if path.is_dir():
        return _open_folder(path, subset, split, split_field)
    if is_local(name):
        raise JobFailure(DATASET_NOT_FOUND, f"hf_dataset {name}: no such file or folder")
    return _open_hub(name, subset, split, split_field, token)


def _open_folder(path: Path, subset: str | None, split: str, split_field: str) -> HubSplit:
    import datasets

    warnings: list[str] = []
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as exc:  # noqa: BLE001 - any failure here means the folder cannot be used
            raise DatasetError(path, "", f"cannot be opened with datasets.load_from_disk ({first_line(exc)})") from None
        if subset:
            warnings.append(f"subset {subset!r} is ignored: {path} was saved with save_to_disk and has no subsets")
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DatasetError(path, "", f"has no split {split!r} (it has {', '.join(loaded)}); set {split_field}")
            return HubSplit(f"{path} (split {split})", loaded[split], warnings)
        if split_field == "eval_split":
            raise config_error(
                f"eval_split needs a dataset with splits, but {path} holds one Dataset saved without splits;"
                " name evaluation files in local_eval_datasets"
            )
        if split != "train":
            warnings.append(f"train_split {split!r} is ignored: {path} holds one Dataset saved without splits")
        return HubSplit(str(path), loaded, warnings)
    try:
        dataset = datasets.load_dataset(str(path), subset or None, split=split)
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            path, "", f"datasets cannot load it ({_reason(exc)}); check {split_field} and subset"
        ) from None
    return HubSplit(f"{path} (split {split})", dataset, warnings)


def _open_hub(name: str, subset: str | None, split: str, split_field: str, token: str | None) -> HubSplit:
    offline = _flag("HF_HUB_OFFLINE") or _flag("HF_DATASETS_OFFLINE")
    if not offline:
        check_on_hub(name, token)
    import datasets

    label = f"hf_dataset {name} ({f'subset {subset}, ' if subset else ''}split {split})"
    try:
        dataset = datasets.load_dataset(name, subset or None, split=split, token=token or None)
    except ConnectionError as exc:
        reason = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else first_line(exc)
        raise JobFailure(DATASET_NOT_FOUND, f"{HUB_UNREACHABLE} (hf_dataset {name!r}: {reason})") from None
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(label, "", f"cannot be loaded ({_reason(exc)}); check {split_field} and subset") from None
    return HubSplit(label, dataset)


def check_on_hub(name: str, token: str | None, timeout: float | None = None) -> None:
    """Ask the hub about the dataset, quickly; raise JobFailure when it cannot be used."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        api.dataset_info(name, timeout=timeout or HUB_TIMEOUT_SECONDS, token=token or None)
    except GatedRepoError:
        raise JobFailure(
            DATASET_NOT_FOUND, f"hf_dataset {name!r} is gated: accept its terms on the hub, then set hf_token"
        ) from None
    except RepositoryNotFoundError:
        raise JobFailure(
            DATASET_NOT_FOUND,
            f"hf_dataset {name!r} is neither a local file or folder nor a dataset on the Hugging Face hub"
            " (if it is private, set hf_token)",
        ) from None
    except HFValidationError as exc:
        raise JobFailure(
            DATASET_NOT_FOUND, f"hf_dataset {name!r} is neither a local file or folder nor a hub id ({first_line(exc)})"
        ) from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(status, int) and status < 500:  # the hub answered, and said no (a bad token, say)
            raise JobFailure(
                DATASET_NOT_FOUND, f"the Hugging Face hub refused hf_dataset {name!r}: {first_line(exc)}"
            ) from None
        raise JobFailure(DATASET_NOT_FOUND, f"{HUB_UNREACHABLE} (hf_dataset {name!r}: {first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - every transport failure means the same to the user
        raise JobFailure(DATASET_NOT_FOUND, f"{HUB_UNREACHABLE} (hf_dataset {name!r}: {first_line(exc)})") from None


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _reason(exc: BaseException) -> str:
    """The innermost useful message: DatasetGenerationError hides the parser's error in its cause."""
    while exc.__cause__ is not None and "generating the dataset" in str(exc):
        exc = exc.__cause__
    return first_line(exc)
