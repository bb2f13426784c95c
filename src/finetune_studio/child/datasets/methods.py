"""The rows of the training methods beyond SFT (docs/API.md, Training methods), read and checked.

Every file type SFT reads carries these rows too (`.jsonl .json .csv .parquet`; not
`.txt`, which holds raw text), and each bad row is reported with its file and line by
the loader, as for SFT. A prompt, an answer or a completion is either text or a list of
chat messages (`{"role", "content"}`, OpenAI's shape; a CSV cell may hold that list as
JSON text). Text is wrapped into a message (the prompt as the user's, an answer as the
assistant's), so the model's chat template is applied to every row, as it is to SFT's
alpaca rows. An optional `system` column becomes the system message.

- `preference` (dpo, orpo): `prompt`, `chosen`, `rejected`. Without a `prompt` column,
  when `chosen` and `rejected` are whole conversations, their common beginning is the
  prompt (TRL's "implicit prompt"). OpenAI's DPO rows (`input.messages`,
  `preferred_output`, `non_preferred_output`) are read as well, so an uploaded OpenAI
  file trains as it is. A row whose chosen answer equals its rejected one teaches
  nothing: it is counted and warned about.
- `unpaired` (kto): `prompt`, `completion`, `label` (true: desirable, false: not;
  also "true"/"false", "yes"/"no", 1/0, as CSV cells hold them). A data set whose rows
  all have one label is refused: KTO learns from the contrast.
- `prompt` (grpo): `prompt`, and the columns its rewards read (`exact_match` and
  `numeric_match` read `column`, "answer" by default); a row missing one is a bad row.
  Those columns are kept as text; every other column is left out.

Rows come out in TRL's conversational shape: `{"prompt": [...], "chosen": [...],
"rejected": [...]}`, `{"prompt": [...], "completion": [...], "label": bool}` or
`{"prompt": [...], <reward columns>}`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from finetune_studio.child.datasets.errors import (
    DatasetError,
    RowProblem,
    config_error,
    kind_of,
    names,
    quote,
)
from finetune_studio.child.datasets.shapes import (
    CHATML_ROLES,
    EMPTY_FIELD,
    MISSING_FIELD,
    ORDER,
    ROLE_ALIASES,
    UNKNOWN_ROLE,
    WRONG_TYPE,
    Converter,
    Notes,
    Row,
    _content,
    _maybe_json,
    check_order,
)
from finetune_studio.child.numbers import parse_number
from finetune_studio.conversations import dpo_row

Messages = list[dict[str, str]]

PREFERENCE = "preference"
UNPAIRED = "unpaired"
PROMPT = "prompt"
METHOD_SHAPES = {"dpo": PREFERENCE, "orpo": PREFERENCE, "kto": UNPAIRED, "grpo": PROMPT}
COLUMNS = {
    PREFERENCE: "prompt, chosen, rejected",
    UNPAIRED: "prompt, completion, label",
    PROMPT: "prompt (and the columns its rewards read)",
}
# Columns TRL hands to a reward function under its own names: a reward cannot read a dataset column so named.
_RESERVED_COLUMNS = ("prompt", "prompts", "completion", "completions", "completion_ids", "trainer_state")
_TRUE = ("true", "yes", "1", "desirable")
_FALSE = ("false", "no", "0", "undesirable")


def method_converter(method: str, reward_columns: dict[str, str] | None = None) -> Converter | None:
    """The converter of a method's rows; None for sft (its shapes are `shapes.py`'s).
    `reward_columns` maps each column GRPO's rewards read to the reward that reads it."""
    shape = METHOD_SHAPES.get(method)
    if shape == PREFERENCE:
        return _preference
    if shape == UNPAIRED:
        return _unpaired
    if shape == PROMPT:
        columns = dict(reward_columns or {})
        reserved = [column for column in columns if column in _RESERVED_COLUMNS]
        if reserved:
            raise config_error(
                f"reward_functions read the column {quote(reserved[0])}, a name the trainer gives to its own"
                " values; name another column of the dataset (the reference answers, e.g. \"answer\")"
            )
        return lambda record, notes: _prompt_row(record, columns)
    return None


def reward_columns(reward_functions: Iterable[Any]) -> dict[str, str]:
    """{column: the reward that reads it} for the rewards that read a dataset column."""
    columns: dict[str, str] = {}
    for function in reward_functions:
        column = getattr(function, "column", None)
        if isinstance(column, str):
            columns.setdefault(column, function.name)
    return columns


def finish(method: str, sources: Iterable[str], rows: list[Row]) -> None:
    """Checks over the whole data set, once every row has been read."""
    if METHOD_SHAPES.get(method) != UNPAIRED or not rows:
        return
    labels = {bool(row["label"]) for row in rows}
    if len(labels) == 1:
        label = labels.pop()
        missing = "false (undesirable)" if label else "true (desirable)"
        raise DatasetError(
            ", ".join(sources),
            "",
            f"every one of the {len(rows):,} rows has label {str(label).lower()}; kto learns from the contrast"
            f" between desirable and undesirable completions: add rows labelled {missing}",
        )


# -- the shapes ---------------------------------------------------------------------


def _preference(record: Row, notes: Notes) -> Row:
    if "preferred_output" in record or "non_preferred_output" in record:
        prompt, chosen, rejected = _openai_preference(record)
    else:
        chosen = _side(record, "chosen", "assistant")
        rejected = _side(record, "rejected", "assistant")
        if "prompt" in record:
            prompt = _side(record, "prompt", "user")
        else:
            prompt, chosen, rejected = _implicit_prompt(record, chosen, rejected)
        prompt = _with_system(record, prompt)
    _check_turns("prompt", prompt, "chosen", chosen)
    _check_turns("prompt", prompt, "rejected", rejected)
    if chosen == rejected:
        notes.identical_pairs += 1
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _openai_preference(record: Row) -> tuple[Messages, Messages, Messages]:
    """OpenAI's DPO row: {"input": {"messages": [...]}, "preferred_output": [...], "non_preferred_output": [...]},
    read as the file store reads an uploaded one (conversations.dpo_row), each part checked."""
    source = _maybe_json(record.get("input"))
    if not isinstance(source, dict) or "messages" not in source:
        found = "nothing" if "input" not in record else kind_of(source)
        raise RowProblem(
            f"OpenAI's preference rows hold the prompt in \"input\": {{\"messages\": [...]}}; found {found}", MISSING_FIELD
        )

    def checked(value: Any, at: str) -> Messages:
        if at != "input.messages":  # the prompt's problems first, then the answers'
            for key in ("preferred_output", "non_preferred_output"):
                if key not in record:
                    raise RowProblem(f"missing the column {key!r} (found: {names(record) or 'nothing'})", MISSING_FIELD)
        return _messages(value, at)

    row = dpo_row({**record, "input": source}, checked)
    return row["prompt"], row["chosen"], row["rejected"]


def _implicit_prompt(record: Row, chosen: Messages, rejected: Messages) -> tuple[Messages, Messages, Messages]:
    """Without a prompt column, whole conversations in chosen and rejected share their prompt."""
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared and chosen[shared - 1]["role"] == "assistant":
        shared -= 1  # an identical answer belongs to the answers, not the prompt
    if not shared:
        raise RowProblem(
            f"missing the column 'prompt' (found: {names(record) or 'nothing'}); give the prompt, or give chosen and"
            " rejected as whole conversations that begin with the same prompt",
            MISSING_FIELD,
        )
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _unpaired(record: Row, notes: Notes) -> Row:
    if "completion" not in record and "chosen" in record:
        raise RowProblem(
            f"missing the column 'completion' (found: {names(record)}); kto reads prompt, completion and label:"
            " paired rows (chosen, rejected) are for training_method dpo or orpo",
            MISSING_FIELD,
        )
    prompt = _with_system(record, _side(record, "prompt", "user"))
    completion = _side(record, "completion", "assistant")
    _check_turns("prompt", prompt, "completion", completion)
    return {"prompt": prompt, "completion": completion, "label": _label(record)}


def _prompt_row(record: Row, columns: dict[str, str]) -> Row:
    prompt = _with_system(record, _side(record, "prompt", "user"))
    if prompt[-1]["role"] != "user":
        raise RowProblem(
            f"the prompt ends with the {prompt[-1]['role']}'s turn (prompt[{len(prompt) - 1}]); it must end with the"
            " user's turn, which the model answers",
            ORDER,
        )
    _check_turns("prompt", prompt, "answer", [{"role": "assistant", "content": "-"}])  # the order of the rest
    row: Row = {"prompt": prompt}
    for column, reward in columns.items():
        if column not in record:
            raise RowProblem(
                f"missing the column {quote(column)}, which the reward {reward} reads (found: {names(record) or 'nothing'})",
                MISSING_FIELD,
            )
        value = record[column]
        if value is None:
            raise RowProblem(f"{quote(column)} is empty (null); the reward {reward} compares with it", EMPTY_FIELD)
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (int, float)):
            value = repr(value)
        elif not isinstance(value, str):
            raise RowProblem(f"{quote(column)} must be text or a number, found {kind_of(value)}", WRONG_TYPE)
        if reward == "numeric_match" and parse_number(value) is None:
            raise RowProblem(f"{quote(column)} is {quote(value)}, which holds no number for numeric_match", WRONG_TYPE)
        row[column] = value
    return row


# -- the parts of a row ------------------------------------------------------------------


def _side(record: Row, key: str, role: str) -> Messages:
    """A prompt or an answer: text (one message of `role`) or a list of messages."""
    if key not in record:
        raise RowProblem(f"missing the column {key!r} (found: {names(record) or 'nothing'})", MISSING_FIELD)
    value = _maybe_json(record[key])
    if value is None:
        raise RowProblem(f"{key!r} is empty (null)", EMPTY_FIELD)
    if isinstance(value, str):
        if not value.strip():
            raise RowProblem(f"{key!r} is empty", EMPTY_FIELD)
        return [{"role": role, "content": value}]
    return _messages(value, key)


def _messages(value: Any, at: str) -> Messages:
    value = _maybe_json(value)
    if not isinstance(value, list) or not value:
        raise RowProblem(
            f"{at!r} must be text or a non-empty list of messages ({{\"role\", \"content\"}}), found {kind_of(value)}",
            WRONG_TYPE,
        )
    messages: Messages = []
    for index, turn in enumerate(value):
        here = f"{at}[{index}]"
        if not isinstance(turn, dict) or "role" not in turn:
            found = f"the keys {names(turn)}" if isinstance(turn, dict) else kind_of(turn)
            raise RowProblem(f"{here} must be an object with 'role' and 'content', found {found}", WRONG_TYPE)
        name = turn["role"]
        role = None
        if isinstance(name, str):
            role = CHATML_ROLES.get(name) or ROLE_ALIASES.get(name.strip().lower())
        if role is None:
            expected = ", ".join(dict.fromkeys([*CHATML_ROLES, *ROLE_ALIASES]))
            raise RowProblem(f"{here}.role is {quote(name)}; expected one of {expected}", UNKNOWN_ROLE)
        content = _content(turn.get("content"), f"{here}.content")
        if not content.strip():
            raise RowProblem(f"{here}.content is empty", EMPTY_FIELD)
        messages.append({"role": role, "content": content})
    return messages


def _with_system(record: Row, prompt: Messages) -> Messages:
    system = record.get("system")
    if system is None or (isinstance(system, str) and not system.strip()):
        return prompt
    if not isinstance(system, str):
        raise RowProblem(f"'system' must be a string, found {kind_of(system)}", WRONG_TYPE)
    if prompt[0]["role"] == "system":
        raise RowProblem("the row has a 'system' column and its prompt starts with a system message; keep one", WRONG_TYPE)
    return [{"role": "system", "content": system}, *prompt]


def _check_turns(first: str, prompt: Messages, second: str, answer: Messages) -> None:
    """The prompt then the answer must read as one conversation (shapes.check_order's rules)."""
    places = [f"{first}[{i}]" for i in range(len(prompt))] + [f"{second}[{i}]" for i in range(len(answer))]
    check_order([m["role"] for m in prompt + answer], lambda index: places[index])


def _label(record: Row) -> bool:
    if "label" not in record:
        raise RowProblem(f"missing the column 'label' (found: {names(record) or 'nothing'})", MISSING_FIELD)
    value = record["label"]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise RowProblem(
        f"'label' is {quote(value)}; it must be true (a desirable completion) or false (an undesirable one)", WRONG_TYPE
    )
