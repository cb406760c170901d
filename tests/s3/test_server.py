"""What the object-store backend will rely on, proven against a real S3 server (SeaweedFS
`weed mini`, one per session; tests that kill or fill a server get a private one).

Reads: whole, ranged (first, middle, last byte, suffix, open-ended), 416 past the end.
Writes: single and multipart PUTs and their ETag formats; create-if-absent
(`If-None-Match: *`, a second create gets 412) and compare-and-swap (`If-Match`, a stale ETag
gets 412), also on CompleteMultipartUpload; 16 concurrent conditional writers per round, exactly
one winner. Faults: kill -9 and restart keeps every committed object and ref, and an upload cut
by the kill leaves no object; a full volume answers 500 and keeps what it holds.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from s3server import WeedError, WeedServer, remove_sockets

MiB = 1 << 20


def status(err: ClientError) -> int:
    return err.response["ResponseMetadata"]["HTTPStatusCode"]


def code(err: ClientError) -> str:
    return err.response["Error"]["Code"]


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


# ---- reads and writes ------------------------------------------------------------------------
def test_put_get_and_ranged_get(s3):
    c = s3.client()
    data = os.urandom(3 * MiB + 123)
    key = s3.key("blob")
    put = c.put_object(Bucket=s3.bucket, Key=key, Body=data)
    assert put["ETag"] == md5_etag(data)                     # quoted MD5 hex for a single PUT
    assert c.head_object(Bucket=s3.bucket, Key=key)["ContentLength"] == len(data)
    assert c.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == data

    n = len(data)
    for rng, want, content_range in [
            ("bytes=0-0", data[:1], f"bytes 0-0/{n}"),
            ("bytes=1048570-2097160", data[1048570:2097161], f"bytes 1048570-2097160/{n}"),
            (f"bytes={n - 1}-{n - 1}", data[-1:], f"bytes {n - 1}-{n - 1}/{n}"),
            ("bytes=-100", data[-100:], f"bytes {n - 100}-{n - 1}/{n}"),
            (f"bytes={n - 10}-", data[-10:], f"bytes {n - 10}-{n - 1}/{n}"),
            (f"bytes={n - 5}-{n + 1000}", data[-5:], f"bytes {n - 5}-{n - 1}/{n}")]:
        r = c.get_object(Bucket=s3.bucket, Key=key, Range=rng)
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 206, rng
        assert r["ContentRange"] == content_range, rng
        assert r["Body"].read() == want, rng

    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=s3.bucket, Key=key, Range=f"bytes={n}-{n + 10}")
    assert (status(e.value), code(e.value)) == (416, "InvalidRange")
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=s3.bucket, Key=s3.key("missing"))
    assert (status(e.value), code(e.value)) == (404, "NoSuchKey")


def test_multipart_upload_and_its_etag(s3):
    c = s3.client()
    key = s3.key("multi")
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1234)]
    up = c.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    done = [{"PartNumber": i + 1,
             "ETag": c.upload_part(Bucket=s3.bucket, Key=key, UploadId=up, PartNumber=i + 1,
                                   Body=p)["ETag"]} for i, p in enumerate(parts)]
    assert [d["ETag"] for d in done] == [md5_etag(p) for p in parts]
    # Not visible before CompleteMultipartUpload.
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket=s3.bucket, Key=key)
    assert status(e.value) == 404
    etag = c.complete_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=up,
                                       MultipartUpload={"Parts": done})["ETag"]
    # The S3 multipart ETag: MD5 of the parts' binary MD5s, "-", the part count.
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert etag == f'"{want}-3"'
    data = b"".join(parts)
    assert c.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == data
    r = c.get_object(Bucket=s3.bucket, Key=key, Range=f"bytes={5 * MiB - 7}-{5 * MiB + 6}")
    assert r["Body"].read() == data[5 * MiB - 7:5 * MiB + 7]          # across a part boundary


# ---- conditional writes ----------------------------------------------------------------------
def test_if_none_match_creates_once(s3):
    c = s3.client()
    key = s3.key("ref")
    first = c.put_object(Bucket=s3.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    assert first["ETag"] == md5_etag(b"first")
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert (status(e.value), code(e.value)) == (412, "PreconditionFailed")
    assert c.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"first"


def test_if_match_advances_only_from_the_current_etag(s3):
    c = s3.client()
    key = s3.key("ref")
    v1 = c.put_object(Bucket=s3.bucket, Key=key, Body=b"v1", IfNoneMatch="*")["ETag"]
    v2 = c.put_object(Bucket=s3.bucket, Key=key, Body=b"v2", IfMatch=v1)["ETag"]
    assert v2 == md5_etag(b"v2") != v1
    with pytest.raises(ClientError) as e:                          # stale: v1 is gone
        c.put_object(Bucket=s3.bucket, Key=key, Body=b"v3", IfMatch=v1)
    assert (status(e.value), code(e.value)) == (412, "PreconditionFailed")
    assert c.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"v2"
    # Same content, same ETag: MD5 ETags do not tell two writes of equal bytes apart, so a
    # ref must hold something unique (e.g. a writer id or sequence number) for If-Match.
    v2_again = c.put_object(Bucket=s3.bucket, Key=key, Body=b"v2", IfMatch=v2)["ETag"]
    assert v2_again == v2
    # If-Match on a missing key: AWS answers 404 NoSuchKey, SeaweedFS 412. Both are a loss.
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key=s3.key("absent"), Body=b"x", IfMatch=v2)
    assert status(e.value) in (404, 412)


def test_conditional_complete_multipart_upload(s3):
    """boto3 passes If-None-Match on CompleteMultipartUpload: a big object can be created
    only-if-absent too, and the losing upload's parts are not published."""
    c = s3.client()
    key = s3.key("big-ref")
    c.put_object(Bucket=s3.bucket, Key=key, Body=b"already here")
    up = c.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    part = c.upload_part(Bucket=s3.bucket, Key=key, UploadId=up, PartNumber=1,
                         Body=os.urandom(5 * MiB))["ETag"]
    with pytest.raises(ClientError) as e:
        c.complete_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=up, IfNoneMatch="*",
                                    MultipartUpload={"Parts": [{"PartNumber": 1,
                                                                "ETag": part}]})
    assert status(e.value) == 412
    c.abort_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=up)
    assert c.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"already here"


def test_concurrent_conditional_writers_one_winner_per_round(s3):
    """16 writers (a client each, released together by a barrier) race per round: round 0 to
    create the ref (If-None-Match: *), later rounds to advance it from the ETag all of them
    read (If-Match). Exactly one wins each round, and the ref holds the winner's bytes.
    (SeaweedFS serializes conditional writes with a per-object lock: losers may wait 1-7 s
    for their 412.)"""
    writers, rounds = 16, 3
    clients = [s3.client(retries={"max_attempts": 1}) for _ in range(writers)]
    key = s3.key("ref")
    etag = None
    for rnd in range(rounds):
        barrier = threading.Barrier(writers)

        def write(i, etag=etag, rnd=rnd):
            body = f"round {rnd} writer {i}".encode()
            cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            barrier.wait()
            try:
                return i, clients[i].put_object(Bucket=s3.bucket, Key=key, Body=body,
                                                **cond)["ETag"]
            except ClientError as e:
                assert status(e) == 412, e.response
                return i, None
        with cf.ThreadPoolExecutor(writers) as ex:
            results = list(ex.map(write, range(writers)))
        winners = [(i, tag) for i, tag in results if tag is not None]
        assert len(winners) == 1, f"round {rnd}: winners {winners}"
        (i, etag), = winners
        got = clients[0].get_object(Bucket=s3.bucket, Key=key)
        assert got["Body"].read() == f"round {rnd} writer {i}".encode()
        assert got["ETag"] == etag


def test_signatures_are_checked(s3):
    """The server enforces SigV4 with the helper's identity: a client that signs wrongly
    fails here as it would on AWS."""
    import boto3
    wrong = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1",
                         aws_access_key_id=s3.server.access_key_id,
                         aws_secret_access_key="not-the-secret")
    with pytest.raises(ClientError) as e:
        wrong.put_object(Bucket=s3.bucket, Key=s3.key("x"), Body=b"x")
    assert (status(e.value), code(e.value)) == (403, "SignatureDoesNotMatch")


def test_clients_find_the_server_through_the_standard_environment(s3):
    """The fixture sets AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
    AWS_REGION: a client made with no arguments talks to the test server."""
    import boto3
    assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint_url
    c = boto3.client("s3")
    c.put_object(Bucket=s3.bucket, Key=s3.key("env"), Body=b"env")
    assert s3.client().get_object(Bucket=s3.bucket, Key=s3.key("env"))["Body"].read() == b"env"


def test_fresh_bucket_fixture(s3_bucket):
    c = s3_bucket.client()
    assert c.list_objects_v2(Bucket=s3_bucket.bucket)["KeyCount"] == 0
    c.put_object(Bucket=s3_bucket.bucket, Key="k", Body=b"v", IfNoneMatch="*")
    assert c.get_object(Bucket=s3_bucket.bucket, Key="k")["Body"].read() == b"v"


# ---- faults: a private server each ------------------------------------------------------------
def test_kill_9_and_restart_keeps_committed_objects(weed_server):
    srv = weed_server()
    endpoint, pid = srv.endpoint_url, srv.pid
    c = boto3_client(srv)
    objects = {"small": os.urandom(100), "chunked": os.urandom(9 * MiB + 5)}   # filer: 4 MiB chunks
    for k, v in objects.items():
        c.put_object(Bucket=srv.bucket, Key=k, Body=v)
    v1 = c.put_object(Bucket=srv.bucket, Key="ref", Body=b"v1", IfNoneMatch="*")["ETag"]
    v2 = c.put_object(Bucket=srv.bucket, Key="ref", Body=b"v2", IfMatch=v1)["ETag"]

    srv.kill()
    assert not srv.running
    with pytest.raises(OSError):
        srv.request("HEAD", f"/{srv.bucket}", timeout=2)
    srv.start()                                         # same dir, same ports
    assert srv.endpoint_url == endpoint and srv.pid != pid

    c = boto3_client(srv)
    for k, v in objects.items():
        assert c.get_object(Bucket=srv.bucket, Key=k)["Body"].read() == v, k
    got = c.get_object(Bucket=srv.bucket, Key="ref")
    assert (got["Body"].read(), got["ETag"]) == (b"v2", v2)
    with pytest.raises(ClientError) as e:               # the ref still exists for If-None-Match
        c.put_object(Bucket=srv.bucket, Key="ref", Body=b"x", IfNoneMatch="*")
    assert status(e.value) == 412
    with pytest.raises(ClientError) as e:               # and v1 is still stale
        c.put_object(Bucket=srv.bucket, Key="ref", Body=b"x", IfMatch=v1)
    assert status(e.value) == 412
    c.put_object(Bucket=srv.bucket, Key="ref", Body=b"v3", IfMatch=v2)

    # A graceful restart (SIGTERM) keeps them too.
    srv.restart()
    assert boto3_client(srv).get_object(Bucket=srv.bucket, Key="ref")["Body"].read() == b"v3"


def test_upload_cut_by_kill_9_leaves_no_object(weed_server):
    """A PUT in flight when the server dies fails at the client, and after the restart the
    key does not exist: no partial object is ever visible."""
    srv = weed_server()
    # when_required: no CRC32 pass over the body before sending, so reading is sending.
    c = boto3_client(srv, retries={"max_attempts": 1}, read_timeout=10, connect_timeout=2,
                     request_checksum_calculation="when_required")
    c.put_object(Bucket=srv.bucket, Key="before", Body=b"committed")
    sent = threading.Event()

    class Body(io.BytesIO):             # tells when 32 MiB of 256 have gone to the socket
        def read(self, n=-1):
            if self.tell() >= 32 * MiB:
                sent.set()
            return super().read(n)

    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(c.put_object, Bucket=srv.bucket, Key="cut",
                        Body=Body(os.urandom(256 * MiB)))
        assert sent.wait(30), "the upload did not start"
        srv.kill()
        with pytest.raises((ClientError, BotoCoreError)):
            fut.result(timeout=60)
    srv.start()
    c = boto3_client(srv)
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket=srv.bucket, Key="cut")
    assert status(e.value) == 404
    assert c.get_object(Bucket=srv.bucket, Key="before")["Body"].read() == b"committed"


def test_full_volumes_answer_500_and_keep_what_they_hold(weed_server):
    """-master.volumeSizeLimitMB=2 -volume.max=2: about 4 MiB fit in the bucket; then every
    PUT of a non-empty body fails with 500 InternalError ("No writable volumes and no free
    volumes left"), also a small conditional one. Objects written before stay readable, and
    a conditional create of an existing key is still a 412 (checked before any write)."""
    srv = weed_server(volume_size_limit_mb=2, volume_max=2)
    c = boto3_client(srv, retries={"max_attempts": 1})
    written, failure = {}, None
    for i in range(40):
        body = os.urandom(512 * 1024)
        try:
            c.put_object(Bucket=srv.bucket, Key=f"fill/{i}", Body=body)
        except ClientError as e:
            failure = e
            break
        written[f"fill/{i}"] = body
    assert failure is not None, "40 x 512 KiB fitted into 2 volumes of 2 MiB"
    assert (status(failure), code(failure)) == (500, "InternalError")
    assert 2 <= len(written) <= 8, len(written)
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=srv.bucket, Key="ref", Body=b"small ref", IfNoneMatch="*")
    assert status(e.value) == 500
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=srv.bucket, Key="fill/0", Body=b"x", IfNoneMatch="*")
    assert status(e.value) == 412
    for k, v in written.items():
        assert c.get_object(Bucket=srv.bucket, Key=k)["Body"].read() == v, k
    assert "No writable volumes" in srv.log_tail(200)


# ---- the helper itself --------------------------------------------------------------------------
def test_a_server_that_cannot_start_fails_loudly_and_leaves_no_process(tmp_path, monkeypatch):
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'pretending to start' >&2\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SNAPSTORE_WEED", str(fake))
    srv = WeedServer(root=str(tmp_path / "root"), start=False, start_timeout=1.5)
    with pytest.raises(WeedError, match=r"did not answer(.|\n)*pretending to start"):
        srv.start()
    assert not srv.running
    with pytest.raises(ProcessLookupError):
        os.kill(srv.pid, 0)

    fake.write_text("#!/bin/sh\necho 'no such flag' >&2\nexit 3\n")
    with pytest.raises(WeedError, match=r"exited with 3(.|\n)*no such flag"):
        WeedServer(root=str(tmp_path / "root2"))


def test_interpreter_exit_kills_the_server(tmp_path):
    """The atexit hook (and PR_SET_PDEATHSIG for a kill -9 of the test process) take the
    server down with the process that started it."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code_ = ("import sys, json; sys.path.insert(0, sys.argv[1]); from s3server import WeedServer; "
             "s = WeedServer(root=sys.argv[2]); print(s.pid, json.dumps(s.ports), flush=True)")
    for how in ("exit", "kill -9"):
        root = tmp_path / how.replace(" ", "")
        root.mkdir()
        extra = "" if how == "exit" else "; import time; time.sleep(60)"
        p = subprocess.Popen([sys.executable, "-c", code_ + extra, tests, str(root)],
                             stdout=subprocess.PIPE, text=True)
        pid, ports = p.stdout.readline().split(" ", 1)
        pid = int(pid)
        if how == "kill -9":
            p.kill()
        p.wait(30)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"weed {pid} outlived its parent ({how})"
        remove_sockets(json.loads(ports))     # nobody was left to tidy up after a kill -9


# ---- helpers ----------------------------------------------------------------------------------
def boto3_client(srv: WeedServer, **config):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=srv.endpoint_url, region_name=srv.region,
                        aws_access_key_id=srv.access_key_id,
                        aws_secret_access_key=srv.secret_access_key, config=Config(**config))


def _alive(pid: int) -> bool:
    """Running, not a zombie (a killed orphan may wait a moment for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return re.search(r"\) (\S)", f.read()).group(1) != "Z"
    except FileNotFoundError:
        return False
