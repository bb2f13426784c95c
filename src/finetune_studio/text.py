"""Text that can always be encoded: the one rule for strings that are not valid Unicode.

Python's JSON parser accepts `"\\ud800"`, a lone UTF-16 surrogate, and gives back a
`str` that cannot be encoded as UTF-8. Stored and served later, such a string makes
every answer that carries it fail (a 500 on `GET /train/jobs`, for everyone, for
good). File names that are not UTF-8 arrive the same way (`os.fsdecode` turns each
bad byte into a surrogate). So:

- requests are refused at the door when any string in them (field names included)
  is not valid Unicode (`refuse_invalid_text`, used by the request models);
- everything the server stores or answers passes `clean`, which replaces each lone
  surrogate with U+FFFD, the replacement character, so that text quoted from a
  dataset or a file name still reads, minus the broken character.

Plain Python: the server and the children import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

REPLACEMENT = "\ufffd"
# In a Python str every code point in this range stands alone (json.loads joins a
# valid escaped pair into one character), so each one is a lone surrogate.
_SURROGATE = re.compile("[\ud800-\udfff]")


def is_valid(text: str) -> bool:
    """Whether `text` can be encoded as UTF-8 (holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (the same object when there is none)."""
    if is_valid(text):
        return text
    return _SURROGATE.sub(REPLACEMENT, text)


def clean(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, tuples, strings, numbers) with every string,
    dict keys included, made encodable by `clean_text`."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean(key): clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(item) for item in value]
    return value


def invalid_text_locations(value: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str, str]]:
    """(location, "value" or "name", the text cleaned) for every string in `value` that
    is not valid Unicode: a value, or a dict key (a field's name). Locations hold
    cleaned keys, so that they can be answered."""
    if isinstance(value, str):
        if not is_valid(value):
            yield where, "value", clean_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            place = (*where, clean(key))
            if isinstance(key, str) and not is_valid(key):
                yield place, "name", clean_text(key)
            yield from invalid_text_locations(item, place)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from invalid_text_locations(item, (*where, index))


def refuse_invalid_text(title: str, data: Any) -> Any:
    """`data` as it is when every string in it is valid Unicode; else pydantic's
    ValidationError (a 422, or OpenAI's 400) naming each place, for a model's
    `mode="before"` validator. `title` is the model's name."""
    errors = [
        InitErrorDetails(
            type=PydanticCustomError(
                "unicode_invalid",
                "The {what} is not valid Unicode: it holds a lone UTF-16 surrogate (\\ud800-\\udfff), which"
                " cannot be stored or sent back; send UTF-8 text",
                {"what": "field name" if what == "name" else "text"},
            ),
            loc=where,
            input=cleaned,
        )
        for where, what, cleaned in invalid_text_locations(data)
    ]
    if errors:
        raise ValidationError.from_exception_data(title, errors)
    return data


class UnicodeChecked(BaseModel):
    """A request model none of whose strings, or field names, may be invalid Unicode (a lone
    surrogate such as "\\ud800"): stored, it could never be sent back (`refuse_invalid_text`)."""

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, data: Any) -> Any:
        return refuse_invalid_text(cls.__name__, data)
