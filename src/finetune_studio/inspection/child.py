"""A dataset inspection's process: `python -m finetune_studio.inspection.child`.

One inspection per process, then it exits (the server's side is
`supervisor/inspector.py`; `finetune-studio inspect` calls `run_inspection` in its
own process instead):

- stdin: one JSON line, a `DatasetInspectRequest` (secrets included, so they never
  touch disk or the environment).
- stdout: one JSON line, `{"type": "inspection", "inspection": DatasetInspection}`,
  or `{"type": "failed", "message": ...}` when something unexpected broke.
  Whatever libraries print goes to stderr.

With `model_name`, the model's tokenizer (and chat template) is loaded, never its
weights: a local folder, a `.gguf` file (its tokenizer, read by transformers), or
a hub id (from the local cache first; the hub only when it answers).
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from finetune_studio.child.channel import JobFailure, keep_stdout_for_messages
from finetune_studio.child.datasets.errors import first_line
from finetune_studio.child.models import from_local_cache, pretrained_args, resolve_source
from finetune_studio.inspection.inspect import inspect_dataset
from finetune_studio.schemas import DatasetInspection, DatasetInspectRequest


def load_tokenizer(name: str, *, trust_remote_code: bool = False, token: str | None = None) -> Any:
    """The tokenizer of the model `name` names, as a job would load it; JobFailure (model_not_found) if none."""
    from transformers import AutoTokenizer

    source = resolve_source(name)
    location, kwargs = pretrained_args(source, trust_remote_code=trust_remote_code, token=token)
    cached = from_local_cache(source, lambda given: AutoTokenizer.from_pretrained(location, **given), kwargs)
    if cached is not None:
        return cached
    try:
        return AutoTokenizer.from_pretrained(location, **kwargs)
    except (ImportError, OSError, ValueError, KeyError) as exc:  # ImportError: the gguf package, for a .gguf file
        raise JobFailure("model_not_found", f"cannot load the tokenizer of {name}: {first_line(exc)}") from None


def run_inspection(request: DatasetInspectRequest) -> DatasetInspection:
    """Inspect the data, with the model's tokenizer when the request names a model."""
    tokenizer = None
    failure = None
    if request.model_name:
        try:
            tokenizer = load_tokenizer(request.model_name, trust_remote_code=request.trust_remote_code, token=request.hf_token)
        except JobFailure as exc:
            failure = exc
    report = inspect_dataset(request, tokenizer)
    if failure is not None:
        # The data is still reported; the model's problem is the error when the data has none.
        report.ok = False
        if report.error is None:
            report.error, report.error_code = failure.message, failure.error_code
        else:
            report.warnings.append(f"model_name: {failure.message}")
    return report


def main() -> int:
    answer = keep_stdout_for_messages()  # anything a library prints goes to stderr
    try:
        request = DatasetInspectRequest.model_validate_json(sys.stdin.readline())
        message: dict[str, Any] = {"type": "inspection", "inspection": run_inspection(request).model_dump(mode="json")}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - the server must hear why, whatever it was
        traceback.print_exc()
        message = {"type": "failed", "message": f"{type(exc).__name__}: {first_line(exc)}"}
        code = 1
    answer.write(json.dumps(message, separators=(",", ":"), default=str) + "\n")
    answer.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
