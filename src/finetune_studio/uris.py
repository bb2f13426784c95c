"""Storage locations that may be URIs (`ray_storage_path`): which are, how to extend one,
and how to show one. Plain string work, for the server (GET /system) and the Ray
children (ray_train/storage.py) alike."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def is_uri(location: str) -> bool:
    """Whether `location` is a URI (s3://...) rather than a folder. file:// names a folder:
    outputs then go to the job folder as with any folder."""
    scheme = urlsplit(location).scheme
    return "://" in location and len(scheme) > 1 and scheme != "file"


def join(uri: str, *parts: str) -> str:
    """`uri` with path parts added before its query (`?endpoint_override=...` stays at the end)."""
    split = urlsplit(uri)
    path = "/".join([split.path.rstrip("/"), *(p.strip("/") for p in parts)])
    return urlunsplit((split.scheme, split.netloc, path, split.query, split.fragment))


def redacted(uri: str) -> str:
    """The URI fit to show: without keys (`user:secret@` before the bucket) or its query."""
    split = urlsplit(uri)
    return urlunsplit((split.scheme, split.netloc.rpartition("@")[2], split.path, "", ""))
