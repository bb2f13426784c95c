"""Datasets: reading every source a request names, checking every row, and measuring them.

    load.py    load_training_data(request), load_eval_data(request, train),
               load_local(paths, format_type): the entry points, and LoadedData
    files.py   local files (.jsonl .json .csv .parquet .txt) -> records with their line or row
    hub.py     hf_dataset: a hub id (fails fast when the hub is unreachable), a
               folder `datasets` can load, or a local file
    shapes.py  alpaca, sharegpt, chatml, raw, custom_format_mapping; `auto`
               detection; the turn-order rules
    stats.py   measure(data, tokenizer, max_seq_length): token lengths and truncation
    errors.py  DatasetError and the error codes

Rows come out as `{"messages": [{"role", "content"}, ...]}` (rendered later with
the model's chat template) or `{"text": ...}`. Nothing here imports torch or
transformers; `datasets`, `huggingface_hub` and `pyarrow` are imported only when a
source needs them.
"""

from finetune_studio.child.datasets.errors import (
    CONFIG_INVALID,
    DATASET_INVALID,
    DATASET_NOT_FOUND,
    HUB_UNREACHABLE,
    DatasetError,
)
from finetune_studio.child.datasets.files import SUFFIXES
from finetune_studio.child.datasets.load import LoadedData, load_eval_data, load_local, load_training_data
from finetune_studio.child.datasets.shapes import SHAPES, detect_shape
from finetune_studio.child.datasets.stats import measure

__all__ = [
    "CONFIG_INVALID",
    "DATASET_INVALID",
    "DATASET_NOT_FOUND",
    "HUB_UNREACHABLE",
    "SHAPES",
    "SUFFIXES",
    "DatasetError",
    "LoadedData",
    "detect_shape",
    "load_eval_data",
    "load_local",
    "load_training_data",
    "measure",
]
