"""The export child's small parts, without a model: the tools folder, atomic files, the Modelfile,
and reading llama.cpp's log lines as progress."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from finetune_studio.atomic import partial_path, write_atomically
from finetune_studio.export import tools
from finetune_studio.export.convert import _Reader, safetensors_count
from finetune_studio.export.files import remove_partials
from finetune_studio.export.modelfile import chatml_go_template, default_system_prompt, modelfile_text

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def fake_sdist(path: Path, version: str = "9.9.9") -> Path:
    """A tar.gz laid out as llama-cpp-python's sdist, with the parts the export takes and others."""
    members = {
        f"llama_cpp_python-{version}/vendor/llama.cpp/convert_hf_to_gguf.py": b"print('convert')\n",
        f"llama_cpp_python-{version}/vendor/llama.cpp/convert_lora_to_gguf.py": b"print('lora')\n",
        f"llama_cpp_python-{version}/vendor/llama.cpp/conversion/__init__.py": b"",
        f"llama_cpp_python-{version}/vendor/llama.cpp/gguf-py/gguf/__init__.py": b"",
        f"llama_cpp_python-{version}/vendor/llama.cpp/LICENSE": b"MIT\n",
        f"llama_cpp_python-{version}/vendor/llama.cpp/ggml/src/ggml.c": b"/* not wanted */\n",
        f"llama_cpp_python-{version}/llama_cpp/llama.py": b"# not wanted\n",
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_the_tools_are_extracted_from_the_sdist_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "share" / "llama.cpp"
    found = tools.extract_tools(fake_sdist(tmp_path / "sdist.tar.gz"), target, version="9.9.9")
    assert found.root == target.resolve()
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == [
        "LICENSE", "LLAMA_CPP_PYTHON_VERSION", "conversion/__init__.py", "convert_hf_to_gguf.py",
        "convert_lora_to_gguf.py", "gguf-py/gguf/__init__.py",
    ]
    assert not list(tmp_path.joinpath("share").glob(".*partial"))  # written beside, then renamed
    assert found.script_env()["PYTHONPATH"].split(":")[0] == str(found.gguf_py)


def test_an_archive_without_the_scripts_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as handle:
        info = tarfile.TarInfo("something-1.0/README")
        handle.addfile(info, io.BytesIO(b""))
    with pytest.raises(tools.ToolsMissing, match="convert_hf_to_gguf.py"):
        tools.extract_tools(archive, tmp_path / "target")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.tar.gz"]


def test_missing_tools_say_how_to_install_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tools.TOOLS_ENV, str(tmp_path / "nowhere"))
    problem = tools.tools_problem()
    if problem is None:
        pytest.fail("an empty tools folder was taken for a complete one")
    assert "scripts/install.sh" in problem and "--install" in problem
    with pytest.raises(tools.ToolsMissing):
        tools.find_tools()


def test_tools_of_another_release_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if tools._installed_version() is None:
        pytest.skip("llama-cpp-python is not installed")
    target = tmp_path / "tools"
    tools.extract_tools(fake_sdist(tmp_path / "sdist.tar.gz"), target, version="0.0.1")
    monkeypatch.setenv(tools.TOOLS_ENV, str(target))
    assert "0.0.1" in str(tools.tools_problem())


def test_the_tools_module_imports_nothing_heavy() -> None:
    code = (
        "import sys; import finetune_studio.export.tools as t; t.tools_problem();"
        "print([m for m in ('llama_cpp', 'torch', 'transformers', 'numpy') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_file_is_renamed_when_whole_and_removed_when_not(tmp_path: Path) -> None:
    final = tmp_path / "model-q8_0.gguf"
    with pytest.raises(RuntimeError), write_atomically(final) as partial:
        partial.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []
    with write_atomically(final) as partial:
        assert partial == partial_path(final) and partial.name == ".model-q8_0.gguf.partial"
        partial.write_bytes(b"whole")
    assert final.read_bytes() == b"whole" and list(tmp_path.iterdir()) == [final]
    (tmp_path / ".work.partial" / "merged").mkdir(parents=True)
    (tmp_path / ".x.gguf.partial").write_bytes(b"")
    remove_partials(tmp_path)
    assert list(tmp_path.iterdir()) == [final]


def test_a_chatml_template_becomes_its_go_template_with_the_default_system_prompt() -> None:
    assert default_system_prompt(SMOLLM2_TEMPLATE) == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    text = modelfile_text("model-q4_k_m.gguf", chat_template=SMOLLM2_TEMPLATE, end_tokens=["<|im_end|>"], others=["model-q8_0.gguf"])
    lines = text.splitlines()
    assert "FROM ./model-q4_k_m.gguf" in lines
    assert "# another file of this export (use it in FROM instead): ./model-q8_0.gguf" in lines
    assert 'TEMPLATE """' + chatml_go_template(default_system_prompt(SMOLLM2_TEMPLATE)) + '"""' in text
    assert [line for line in lines if line.startswith("PARAMETER")] == ['PARAMETER stop "<|im_start|>"', 'PARAMETER stop "<|im_end|>"']
    # The Go template renders a user turn the way the Jinja template does.
    go = chatml_go_template(None)
    assert go == (
        "{{- range $i, $_ := .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
    )


def test_another_template_is_left_to_the_gguf_and_an_adapter_names_its_base() -> None:
    llama3 = "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{{ m['content'] }}<|eot_id|>{% endfor %}"
    text = modelfile_text("/models/base.gguf", chat_template=llama3, end_tokens=["<|eot_id|>"], adapter_name="adapter-f16.gguf")
    assert "FROM /models/base.gguf\n" in text and "ADAPTER ./adapter-f16.gguf\n" in text
    assert "TEMPLATE" not in text and "uses the one the GGUF file carries" in text
    assert 'PARAMETER stop "<|eot_id|>"' in text


def test_the_converter_log_reads_as_per_tensor_progress(tmp_path: Path) -> None:
    header = json.dumps({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
                         "b": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}, "__metadata__": {}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    assert safetensors_count(tmp_path) == 2
    seen: list[tuple[int, int, float]] = []
    reader = _Reader(2, lambda planned, total, written: seen.append((planned, total, written)))
    for line in [
        "INFO:hf-to-gguf:Loading model: merged",
        "INFO:hf-to-gguf:token_embd.weight,           torch.float16 --> F16, shape = {576, 49152}",
        "INFO:hf-to-gguf:blk.0.attn_norm.weight,      torch.float16 --> F32, shape = {576}",
        "INFO:hf-to-gguf:output_norm.weight,          torch.float16 --> F32, shape = {576}",
        "INFO:gguf.gguf_writer:/x/.model-f16.gguf.partial: n_tensors = 3, total_size = 269.1M",
        "Writing:   0%|          | 0.00/269M [00:00<?, ?byte/s]",
        "Writing:  47%|####      | 127M/269M [00:00<00:00, 166Mbyte/s]",
        "Writing:  47%|####      | 128M/269M [00:00<00:00, 166Mbyte/s]",
        "Writing: 100%|##########| 269M/269M [00:01<00:00, 164Mbyte/s]",
    ]:
        reader(line)
    assert seen == [(1, 2, 0.0), (2, 2, 0.0), (3, 3, 0.0), (3, 3, 0.0), (3, 3, 0.0), (3, 3, 0.47), (3, 3, 1.0)]
