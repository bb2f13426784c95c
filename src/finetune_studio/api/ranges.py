"""Downloads with HTTP Range, as RFC 9110 (section 14.2) says to answer them.

Starlette's `FileResponse` answers a Range it cannot parse (`bytes=10-5`, `bytes=abc`,
another unit) with a 400; HTTP says a server ignores such a header and sends the
whole body with a 200, so that a client whose Range went wrong still gets the file.
`FileDownload` is that `FileResponse`: a well-formed range is served as before (206
with `Content-Range`; 416 when it lies past the file's end, also when one part of
several does); a malformed one is read as no Range at all. Both download routes use
it (`GET /export/download/...`, `GET /v1/files/{id}/content`).
"""

from __future__ import annotations

import re

from fastapi.responses import FileResponse
from starlette.responses import MalformedRangeHeader

# One range of a `bytes=` Range: first-last, first- or -suffix (RFC 9110's int-range and
# suffix-range), with the optional whitespace around the commas.
_RANGE = re.compile(r"^\s*(?:([0-9]+)-([0-9]*)|-([0-9]+))\s*$")


def well_formed(header: str) -> bool:
    """Whether a Range header is RFC 9110's `bytes=` ranges, each first <= last."""
    unit, equals, ranges = header.partition("=")
    if not equals or unit.strip().lower() != "bytes":
        return False
    for part in ranges.split(","):
        if not part.strip():
            continue  # an empty list element (`bytes=0-1,,5-`) is allowed and means nothing
        match = _RANGE.match(part)
        if match is None:
            return False
        first, last = match.group(1), match.group(2)
        if first is not None and last and _after(first, last):
            return False
    return any(part.strip() for part in ranges.split(","))


def _after(first: str, last: str) -> bool:
    """first > last, for numbers of any length (Python will not read past 4,300 digits)."""
    first, last = first.lstrip("0") or "0", last.lstrip("0") or "0"
    return (len(first), first) > (len(last), last)


class FileDownload(FileResponse):
    """A `FileResponse` that ignores a malformed Range (200, the whole file) instead of answering 400."""

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        if not well_formed(http_range):
            return []  # no ranges: the whole body, 200
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader:
            return []
