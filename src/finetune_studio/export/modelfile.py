"""The Ollama `Modelfile` written beside a GGUF export (`ollama create NAME -f Modelfile`).

`FROM` names the GGUF file (relative, so the folder can move as a whole). The chat
template is Jinja in the model and a Go template in Ollama: a ChatML template (the
`<|im_start|>role ... <|im_end|>` turns of SmolLM2, Qwen and others) is written as
its Go equivalent, with the default system prompt the Jinja template adds when the
conversation has none; any other template is left to the GGUF file itself (which
carries it as `tokenizer.chat_template`, and Ollama reads it from there), and the
file says so. `PARAMETER stop` lists the tokens that end a turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_DEFAULT_SYSTEM = re.compile(re.escape(IM_START) + r"system(?:\n|\\n)(.*?)" + re.escape(IM_END), re.DOTALL)


def is_chatml(chat_template: Optional[str]) -> bool:
    return bool(chat_template) and IM_START in str(chat_template) and IM_END in str(chat_template)


def default_system_prompt(chat_template: str) -> Optional[str]:
    """The system text a ChatML template puts first when the messages have none (a
    literal in the template, as in SmolLM2's), or None."""
    match = _DEFAULT_SYSTEM.search(chat_template)
    if match is None or "{{" in match.group(1) or "{%" in match.group(1):
        return None
    return match.group(1).replace("\\n", "\n")


def chatml_go_template(system: Optional[str]) -> str:
    """ChatML as a Go template over Ollama's `.Messages`, ending with the assistant's turn opened."""
    first = ""
    if system:
        first = f'{{{{- if and (eq $i 0) (ne .Role "system") }}}}{IM_START}system\n{system}{IM_END}\n{{{{ end }}}}'
    return (
        "{{- range $i, $_ := .Messages }}"
        + first
        + f"{IM_START}{{{{ .Role }}}}\n{{{{ .Content }}}}{IM_END}\n"
        + "{{ end }}"
        + f"{IM_START}assistant\n"
    )


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def modelfile_text(
    gguf_name: str,
    *,
    chat_template: Optional[str],
    end_tokens: Sequence[str],
    others: Sequence[str] = (),
    adapter_name: Optional[str] = None,
) -> str:
    """The Modelfile. With adapter_name, gguf_name is the base model (FROM) and the
    adapter is applied on it (ADAPTER)."""
    lines = ["# Made by finetune-studio. Create the model with:  ollama create NAME -f Modelfile"]
    lines.append(f"FROM {gguf_name if gguf_name.startswith('/') else './' + gguf_name}")
    for other in others:
        lines.append(f"# another file of this export (use it in FROM instead): ./{other}")
    if adapter_name:
        lines.append(f"ADAPTER ./{adapter_name}")
    stops = list(dict.fromkeys(t for t in end_tokens if t))
    if is_chatml(chat_template):
        template = chatml_go_template(default_system_prompt(chat_template or ""))
        lines.append('TEMPLATE """' + template + '"""')
        stops = list(dict.fromkeys([IM_START, IM_END, *stops]))
    elif chat_template:
        lines.append("# The chat template is not ChatML: Ollama uses the one the GGUF file carries (tokenizer.chat_template).")
    else:
        lines.append("# The model has no chat template: Ollama will use it for plain completion.")
    lines.extend(f"PARAMETER stop {_quoted(token)}" for token in stops)
    return "\n".join(lines) + "\n"
