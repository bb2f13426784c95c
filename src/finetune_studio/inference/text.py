"""From a growing list of token ids to the text deltas a client sees, and `stop` strings.

Each new token's text is found by decoding every completion id so far and taking
what is new at the end: a token's text alone may be part of a multi-byte
character, or depend on its neighbour (a leading space). Two things are held back
until they can no longer change: a trailing U+FFFD (the first bytes of a character
whose rest has not been generated yet), and a tail that may be the beginning of a
`stop` string (so text past a stop is never sent). Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextStream:
    """The completion's text, as deltas. `push` takes each new (non-eos) token id;
    `finish` sends what was held back. `stopped` is set once a stop string appears:
    the text ends before it."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self._stops = [stop for stop in stops if stop]
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        """The text that can be sent now that `token_id` is generated (may be "")."""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            return self._take(text[:cut])
        return self._take(text[: len(text) - self._held_back(text)])

    def finish(self) -> str:
        """The rest of the text, when generation ended for another reason than a stop."""
        if self.stopped:
            return ""
        return self._take(self._decode(self._ids))

    def _take(self, text: str) -> str:
        # What was sent is never taken back: if decoding ever rewrites earlier text
        # (a tokenizer's clean-up of spaces), only what is past it is sent.
        delta = text[len(self.sent) :]
        self.sent += delta
        return delta

    def _first_stop(self, text: str) -> int | None:
        # A stop cannot begin inside the text already sent (its beginning would have
        # been held back), so the search starts just before the end of it.
        start = max(0, len(self.sent) - self._longest)
        found = [index for stop in self._stops if (index := text.find(stop, start)) >= 0]
        return max(min(found), len(self.sent)) if found else None

    def _held_back(self, text: str) -> int:
        held = len(text) - len(text.rstrip(REPLACEMENT))
        visible = text[: len(text) - held]
        partial = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(visible)), partial, -1):
                if visible.endswith(stop[:size]):
                    partial = size
                    break
        return held + partial
