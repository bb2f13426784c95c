"""A real S3 endpoint on 127.0.0.1 for tests: moto's server (an S3 implementation no one
here wrote), reached through pyarrow's own S3 client as a user's bucket would be."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

# Credentials moto takes; set in the environment of whatever talks to it (the server, the Ray nodes).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "finetune-studio-test", "AWS_SECRET_ACCESS_KEY": "finetune-studio-test",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@dataclass
class S3:
    endpoint: str

    def uri(self, bucket: str, prefix: str = "") -> str:
        """An s3:// URI for pyarrow, with the endpoint in its query (as a user would write it for MinIO)."""
        path = f"{bucket}/{prefix}".rstrip("/")
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"

    def make_bucket(self, bucket: str) -> None:
        from pyarrow import fs as pafs

        with credentials():
            host = self.endpoint
            s3 = pafs.S3FileSystem(endpoint_override=host, scheme="http", region="us-east-1", allow_bucket_creation=True)
            s3.create_dir(bucket)

    def files(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """{key: size} of every object under bucket/prefix."""
        from pyarrow import fs as pafs

        with credentials():
            s3 = pafs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", region="us-east-1")
            base = f"{bucket}/{prefix}".rstrip("/")
            infos = s3.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return {info.path[len(bucket) + 1:]: info.size for info in infos if info.type == pafs.FileType.File}


@contextlib.contextmanager
def credentials() -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def s3_server() -> Iterator[S3]:
    moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (finetune-studio[test])")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3(f"{host}:{port}")
    finally:
        server.stop()
