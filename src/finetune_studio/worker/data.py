"""Kept so that `from finetune_studio.worker.data import ...` still works.

The dataset code lives in `finetune_studio.worker.datasets`; import from there.
"""

from finetune_studio.worker.datasets import (
    DatasetError,
    LoadedData,
    detect_shape,
    load_eval_data,
    load_local,
    load_training_data,
    measure,
)

__all__ = [
    "DatasetError",
    "LoadedData",
    "detect_shape",
    "load_eval_data",
    "load_local",
    "load_training_data",
    "measure",
]
