"""Fixtures for tests against a real S3 server (SeaweedFS `weed mini`, tests/s3server.py).

    s3_server      session: one shared server (started on first use, stopped at the end)
    s3             function: a fresh prefix in the shared bucket, the AWS_* variables set for
                   the test (monkeypatch), and .client() -> a boto3 S3 client
    s3_bucket      function: like s3, in a bucket of its own (created, deleted afterwards)
    weed_server    function: a factory of private servers, weed_server(**WeedServer kwargs),
                   for tests that kill, restart or fill a server; all stopped at teardown

A server that cannot start fails the test with the server's log tail (WeedError): never a
skip, since a skipped S3 suite would pass CI without testing anything.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import uuid

import pytest

from s3server import WeedServer


@dataclasses.dataclass
class S3Place:
    """Where a test may write: bucket + prefix on server, with the client settings."""
    server: WeedServer
    bucket: str
    prefix: str                         # "t/<test name>-<8 hex>/", ends with "/"

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    def env(self) -> dict:
        return self.server.env()

    def key(self, name: str) -> str:
        return self.prefix + name

    def client(self, **config):
        """A boto3 S3 client for this server (config: botocore.config.Config arguments)."""
        import boto3
        from botocore.config import Config
        env = self.server.env()
        return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                            region_name=env["AWS_REGION"], config=Config(**config))


def _apply_env(monkeypatch, server: WeedServer) -> None:
    for name in WeedServer.ENV_UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)


def _slug(request) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40] or "t"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    # The root under pytest's basetemp keeps weed.log after a failure (pytest keeps the
    # last three runs' basetemps).
    server = WeedServer(root=str(tmp_path_factory.mktemp("weed")))
    try:
        yield server
    finally:
        server.kill()       # a graceful stop takes 1-5 s and nothing reads the data again


@pytest.fixture
def s3(s3_server, monkeypatch, request) -> S3Place:
    if not s3_server.running:           # a test stopped the shared server: bring it back
        s3_server.start()
    _apply_env(monkeypatch, s3_server)
    return S3Place(s3_server, s3_server.bucket, f"t/{_slug(request)}-{uuid.uuid4().hex[:8]}/")


_bucket_numbers = itertools.count()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch, request) -> S3Place:
    if not s3_server.running:
        s3_server.start()
    _apply_env(monkeypatch, s3_server)
    name = f"t{next(_bucket_numbers)}-{_slug(request)}"[:54].rstrip("-") + \
        f"-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(name)
    try:
        yield S3Place(s3_server, name, "")
    finally:
        if s3_server.running:
            s3_server.delete_bucket(name)


@pytest.fixture
def weed_server(tmp_path, monkeypatch):
    """make = weed_server; srv = make(volume_size_limit_mb=2, volume_max=2): a private,
    started server whose AWS_* variables are set for the test (the last one made wins)."""
    made = []

    def make(**kwargs) -> WeedServer:
        root = tmp_path / f"weed{len(made)}"
        root.mkdir()
        server = WeedServer(root=str(root), **kwargs)
        made.append(server)
        _apply_env(monkeypatch, server)
        return server
    try:
        yield make
    finally:
        for server in made:
            server.kill()               # no graceful wait: the data dir is thrown away
