"""One chat stream through the server against llama.cpp serving the same model as a GGUF
(issue 26): f16 and q8_0, on the same machine.

    .venv/bin/python bench/gguf_chat.py [--reps 3] [--models-dir DIR]

SmolLM2-135M-Instruct (the demo's GGUF, dequantized into a folder once) is converted to an
f16 GGUF by llama.cpp's own `convert_hf_to_gguf.py` and quantized to q8_0 by
`llama_model_quantize`. Then, alternating, `--reps` times each after a warm-up, a request for
64 tokens at temperature 0 with the same prompt:

- **the server**: `POST /v1/chat/completions` on the base model (the transformers chat
  child, its default precision here, and with `--precision fp32` in a second server);
- **llama.cpp**: `Llama(model_path, n_threads=<cores>, n_ctx=2048).create_chat_completion`
  (llama-cpp-python, the library the server's GGUF chat uses) on the f16 and on the q8_0
  file, each in its own process, timed from the messages to the answer.

Reported (no budget): decode tokens/s of each, and the server's one stream divided by each
of llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batched_chat import PROMPTS, TOKENS, api_answer, rate  # noqa: E402
from chat import train  # noqa: E402
from common import load_average, machine_line, server, smollm2_gguf, table  # noqa: E402

LLAMA = r'''
import json, sys, time
import llama_cpp
path, prompt, tokens, reps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model = llama_cpp.Llama(model_path=path, n_threads=threads, n_ctx=2048, verbose=False)
samples = []
for _ in range(reps + 1):  # the first is the warm-up
    started = time.perf_counter()
    answer = model.create_chat_completion(messages=[{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0)
    samples.append((answer["usage"]["completion_tokens"], time.perf_counter() - started))
print(json.dumps(samples[1:]))
'''


def convert(model_dir: Path, out: Path) -> dict[str, Path]:
    import ctypes

    import llama_cpp

    from finetune_studio.export.quantize import FTYPES
    from finetune_studio.export.tools import find_tools

    tools = find_tools()
    f16 = out / "smollm2-f16.gguf"
    subprocess.run([sys.executable, str(tools.convert_hf), str(model_dir), "--outtype", "f16", "--outfile", str(f16)],
                   check=True, env={**os.environ, "PYTHONPATH": str(tools.gguf_py)}, capture_output=True)
    q8 = out / "smollm2-q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES["q8_0"]
    if llama_cpp.llama_model_quantize(str(f16).encode(), str(q8).encode(), ctypes.byref(params)) != 0:
        sys.exit("quantizing to q8_0 failed")
    return {"f16": f16, "q8_0": q8}


def llama_one(path: Path, reps: int) -> list[tuple[int, float]]:
    done = subprocess.run([sys.executable, "-c", LLAMA, str(path), PROMPTS[0], str(TOKENS), str(reps), str(os.cpu_count() or 1)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"llama.cpp failed:\n{done.stderr[-2000:]}")
    return [tuple(s) for s in json.loads(done.stdout.strip().splitlines()[-1])]  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models-dir", default=None, help="where the converted SmolLM2 folder is kept (default: a temp dir)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from finetune_studio.cli.demo import prepare_smollm2

    gguf = smollm2_gguf()
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    api: dict[str, list[tuple[int, float]]] = {"auto": [], "fp32": []}
    llama: dict[str, list[tuple[int, float]]] = {"f16": [], "q8_0": []}
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-gguf-chat-") as tmp:
        work = Path(tmp)
        model_dir = prepare_smollm2(gguf, Path(args.models_dir).expanduser() if args.models_dir else work / "models")
        files = convert(model_dir, work)
        for precision in ("auto", "fp32"):
            env = {"FINETUNE_STUDIO_INFERENCE_PRECISION": precision}
            with server(work / f"data-{precision}", env=env) as (url, _), httpx.Client(base_url=url, timeout=1800) as http:
                train(url, http, model_dir)
                api_answer(http, str(model_dir))  # warm-up: the chat child loads the model
                for rep in range(args.reps):  # alternating with llama.cpp's runs, one of each per rep
                    api[precision].append(api_answer(http, str(model_dir)))
                    if precision == "auto":
                        for kind, path in files.items():
                            llama[kind] += llama_one(path, 1)
                    print(f"  rep {rep + 1}: server ({precision}) {api[precision][-1]}", flush=True)
    rows = [(f"1 stream through POST /v1/chat/completions, precision {p}", f"{rate(s):,.1f} tokens/s", "", "") for p, s in api.items()]
    rows += [(f"1 stream: llama.cpp on the {k} GGUF (llama-cpp-python, {os.cpu_count()} threads)", f"{rate(s):,.1f} tokens/s", "", "")
             for k, s in llama.items()]
    for p, s in api.items():
        for k, ls in llama.items():
            rows.append((f"server ({p}) / llama.cpp {k}", f"{rate(s) / rate(ls):.3f}", "", "reported"))
    print(table(f"One chat stream: SmolLM2-135M-Instruct, {TOKENS} tokens at temperature 0 ({args.reps} repetitions, medians)", rows))
    print(load_average("after"))


if __name__ == "__main__":
    main()
