"""S3Client.get_into against the real server: a ranged GET streamed into the caller's
buffer through http.client's readinto (botocore's and urllib3's bodies copy every read), with
the body's own readinto as the fallback. Both give exactly the object's bytes, and the
direct path hands its connection back to the pool."""
from __future__ import annotations

import os

import pytest

from snapstore.remote import layout, s3client
from snapstore.remote.s3client import S3Client

MiB = 1 << 20


def fill_from(readinto, size: int) -> bytes:
    buf, got = bytearray(size), 0
    view = memoryview(buf)
    while got < size:
        n = readinto(view[got:got + 100_000])        # in pieces, as the cache reads
        if not n:
            break
        got += n
    return bytes(buf[:got])


@pytest.fixture
def client_and_data(s3):
    client = S3Client(layout.parse_url(f"s3://{s3.bucket}/{s3.key('')}"), timeout=30)
    data = os.urandom(3 * MiB + 17)
    client.put("blob", data)
    yield client, data
    client.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "fallback"])
@pytest.mark.parametrize("start,length", [(0, 3 * MiB + 17), (0, 1), (MiB - 3, MiB + 5),
                                          (3 * MiB + 16, 1), (3 * MiB, 100), (5 * MiB, 10),
                                          (7, 0)])
def test_get_into_streams_exactly_the_range(client_and_data, monkeypatch, direct, start,
                                            length):
    client, data = client_and_data
    if not direct:
        monkeypatch.setattr(s3client, "_direct_readinto",
                            lambda body: (body.readinto, lambda: None))
    got = client.get_into("blob", start, length, lambda readinto: fill_from(readinto, length))
    assert got == data[start:start + length]


def test_the_direct_path_reads_through_http_client_and_reuses_connections(client_and_data,
                                                                          monkeypatch):
    client, data = client_and_data
    used = []
    real = s3client._direct_readinto

    def spy(body):
        readinto, done = real(body)
        used.append(getattr(readinto, "__self__", None))
        return readinto, done
    monkeypatch.setattr(s3client, "_direct_readinto", spy)
    for i in range(12):
        off = i * 200_000
        assert client.get_into("blob", off, 150_000,
                               lambda r: fill_from(r, 150_000)) == data[off:off + 150_000]
    assert all(type(u).__module__ == "http.client" for u in used) and len(used) == 12
    pools = client._client._endpoint.http_session._manager.pools
    opened = sum(pools[key].num_connections for key in pools.keys())
    assert 1 <= opened <= 2          # handed back after each GET, not a connection per GET


def test_clients_share_the_parsed_service_model_but_read_settings_afresh(s3, monkeypatch):
    url = layout.parse_url(f"s3://{s3.bucket}/{s3.key('')}")
    first = S3Client(url, timeout=30)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")     # changed in between
    second = S3Client(url, timeout=30)
    try:
        assert first._client._loader is second._client._loader
        assert second.endpoint == "http://127.0.0.1:9" != first.endpoint
    finally:
        first.close()
        second.close()
