"""moto's S3 in server mode: a real HTTP endpoint on 127.0.0.1 that subprocesses (torch ranks,
``slurm-spot demo``) reach like any S3-compatible store (docs/testing-clouds.md)."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def moto_s3() -> Iterator[str]:
    """Start moto's server (random port); yields its endpoint URL. Sets fake credentials in
    ``os.environ`` (inherited by child processes) and restores the environment afterwards."""
    from moto.server import ThreadedMotoServer

    before = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def client(endpoint: str) -> Any:
    """A plain boto3 S3 client for ``endpoint`` (path-style addressing)."""
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}))  # type: ignore[typeddict-item]


def new_bucket(endpoint: str) -> str:
    """Create and return a fresh bucket name."""
    name = f"ckpt-{secrets.token_hex(4)}"
    client(endpoint).create_bucket(Bucket=name)
    return name


def keys(endpoint: str, bucket: str) -> list[str]:
    """Every key in ``bucket``, sorted."""
    out = []
    for page in client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


class RawBody:
    """The raw body botocore reads from a response a test makes up (``AWSResponse.raw``)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body

    def read(self, *_: Any) -> bytes:
        return self.body


def s3_error_response(url: str, status: int, code: str, message: str = "injected") -> Any:
    """An S3 error answer (``<Error><Code>...``) with HTTP ``status``, as botocore's
    ``before-send`` handlers return it instead of sending the request."""
    from botocore.awsrequest import AWSResponse

    body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
    return AWSResponse(url, status, {}, RawBody(body))
