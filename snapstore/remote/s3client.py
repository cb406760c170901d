"""The one module that talks to S3 (boto3; docs/s3-client.md says why): objects of one
store (a bucket and a prefix), conditional writes, ranged reads, multipart uploads, and the
retry policy.

Retries: connection errors (refused, reset), timeouts, 429 and 5xx answers are retried with
exponential backoff (RETRY_FIRST doubling to RETRY_MAX, with jitter); no attempt begins more
than `timeout` seconds (the store's remote_timeout) after the request began, then RemoteError
names the operation, the key and the last answer. Other answers raise at once: 404 ->
NotFound, 412 / 409 on a conditional write -> PreconditionFailed (both internal: callers turn
them into what they mean), anything else -> RemoteError. A conditional write retried after a
connection error may answer 412 although the first attempt landed: callers that care read
the object back (refs do).

Timeouts of one attempt derive from `timeout` (no option of their own): connecting at most
min(CONNECT_TIMEOUT, timeout / 4) seconds, a silent server (no byte sent or received) at most
min(READ_TIMEOUT, timeout / 2); so a request gives up after at most about 1.5 * timeout, and
a short remote_timeout still leaves room for a retry against a server that never answers.

Uploads of files (segments) larger than PART_SIZE are multipart, parts in parallel, each part
retried on its own; a failed upload is aborted (one attempt: a writer killed mid-upload, or an
abort that fails, leaves an incomplete upload, which abort_uploads removes).

Credentials, region and endpoint come from the standard places (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, ..., ~/.aws/config): boto3's own chain.
"""
from __future__ import annotations

import contextlib
import http.client
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Iterator

from snapstore.engine.crashpoints import crashpoint
from snapstore.errors import FormatError, RemoteError
from snapstore.remote.layout import RemoteURL

RETRY_FIRST = 0.1
RETRY_MAX = 5.0
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0
PART_SIZE = 16 << 20            # multipart above it (at least 5 MiB: S3's smallest part)
UPLOAD_CONCURRENCY = 8          # parts of multipart uploads in flight, per client


class NotFound(Exception):
    """The object does not exist (404)."""


class PreconditionFailed(Exception):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match)."""


class _Abandoned(Exception):
    """A part of a multipart upload not tried: another part failed for good."""


def _direct_readinto(body) -> tuple[Callable, Callable]:
    """(readinto, done) for a GET's streaming body: the readinto of the http.client response
    beneath botocore's and urllib3's when the body is plainly that response's bytes (no
    content encoding), since both of those copy every read into a new bytes object first
    (about a sixth of the CPU of a restore's receiving, measured); else the body's own.
    done() is called once the body was read to its end: it hands the connection back to
    urllib3's pool (the bytes having bypassed urllib3, its own bookkeeping would close it).
    (http.client's readinto returns 0 when the connection ends early, as at the end:
    counted_to() tells the two apart.)"""
    stream = getattr(body, "_raw_stream", None)
    response = getattr(stream, "_fp", None)
    if not isinstance(response, http.client.HTTPResponse) or \
            getattr(stream, "headers", {}).get("Content-Encoding", "identity") != "identity":
        return body.readinto, lambda: None

    def done() -> None:
        if response.isclosed():                 # read to its end
            stream.release_conn()
    return response.readinto, done


def counted_to(readinto: Callable, declared: int | None) -> Callable:
    """readinto, raising http.client.IncompleteRead (retried as a whole: _call) when the body
    ends before the `declared` Content-Length: a connection the server dropped mid-body (it
    was killed, say) reads as a short body, which a caller would take for the object's end
    (a block cut short, then cached as whole)."""
    if declared is None:
        return readinto
    got = 0

    def read(buf) -> int:
        nonlocal got
        n = readinto(buf)
        if not n and len(buf) and got < declared:
            raise http.client.IncompleteRead(b"", declared - got)
        got += n
        return n
    return read


@dataclass
class ObjectInfo:
    key: str            # relative to the store's prefix
    size: int
    modified: float     # the server's LastModified, unix time
    etag: str | None = None     # as put() returns it (None: the listing had none)


def _boto():
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
        import botocore.session
    except ImportError:
        raise FormatError("S3 stores need boto3: pip install 'snapstore[s3]'") from None
    return boto3, botocore


_loader = None                      # the process's botocore data loader, once a client made it
_loader_lock = threading.Lock()


def _new_session(boto3, botocore):
    """A new boto3 session (credentials, endpoint and settings read afresh from the
    environment and config files) that shares the process's botocore data loader: parsing
    the S3 service model is most of what a new client costs (0.13 s here; 0.03 s with the
    model loaded once), and every store a process opens makes one."""
    global _loader
    session = botocore.session.Session()
    with _loader_lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return boto3.session.Session(botocore_session=session)


_RETRYABLE_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable",
                    "RequestTimeTooSkewed", "Throttling", "ThrottlingException"}


class S3Client:
    """The objects of one store: keys are relative to url.prefix. Thread-safe."""

    def __init__(self, url: RemoteURL, *, timeout: float) -> None:
        boto3, botocore = _boto()
        self.url = url
        self.timeout = timeout
        self.connect_timeout = min(CONNECT_TIMEOUT, timeout / 4)
        self.read_timeout = min(READ_TIMEOUT, timeout / 2)
        self.part_size = PART_SIZE
        self._exc = botocore.exceptions
        config = botocore.config.Config(
            retries={"total_max_attempts": 1},          # this module retries (bounded)
            connect_timeout=self.connect_timeout, read_timeout=self.read_timeout,
            max_pool_connections=32,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required")
        try:
            self._client = _new_session(boto3, botocore).client("s3", config=config)
        except (botocore.exceptions.BotoCoreError, ValueError) as exc:
            # a profile that is not there, an endpoint that is not a URL...
            raise RemoteError(f"{url}: cannot make an S3 client from the AWS_* environment "
                              f"and configuration files: {exc}", operation="connect") from None
        self.endpoint = self._client.meta.endpoint_url
        self._parts: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stops the part-upload threads (after the uploads in progress)."""
        with self._lock:
            pool, self._parts = self._parts, None
        if pool is not None:
            pool.shutdown(wait=True)

    # ---- the retry loop -----------------------------------------------------------------
    def _refused(self, operation: str, key: str, last: str, status: int | None) -> RemoteError:
        return RemoteError(f"S3 {operation} of {self.url.key(key)!r} in bucket "
                           f"{self.url.bucket!r} refused: {last}", operation=operation,
                           key=key, status=status)

    def _call(self, operation: str, key: str, fn: Callable, *, conditional: bool = False):
        began = time.monotonic()
        deadline = began + self.timeout
        delay = RETRY_FIRST
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except self._exc.ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                code = exc.response.get("Error", {}).get("Code", "")
                if status == 404 or code in ("NoSuchKey", "NotFound"):
                    if code == "NoSuchBucket":
                        raise FormatError(f"{self.url}: the bucket {self.url.bucket!r} does "
                                          "not exist") from None
                    raise NotFound(key) from None
                if conditional and (status in (409, 412) or code in (
                        "PreconditionFailed", "ConditionalRequestConflict")):
                    raise PreconditionFailed(key) from None
                retry = status is None or status >= 500 or status == 429 or \
                    code in _RETRYABLE_CODES
                last = f"HTTP {status} {code}: {exc.response.get('Error', {}).get('Message', '')}"
                if not retry:
                    raise self._refused(operation, key, last, status) from None
            except (self._exc.NoCredentialsError, self._exc.PartialCredentialsError,
                    self._exc.ProfileNotFound, self._exc.ParamValidationError) as exc:
                # no retry can change these: refused at once, as a 403 is
                raise self._refused(operation, key, f"{type(exc).__name__}: {exc}",
                                    None) from None
            except (self._exc.BotoCoreError, OSError, http.client.HTTPException) as exc:
                # connection refused / reset, timeouts, a closed connection ...
                status, last = None, f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if now + delay > deadline:
                raise RemoteError(f"S3 {operation} of {self.url.key(key)!r} in bucket "
                                  f"{self.url.bucket!r} failed after {attempt} attempts in "
                                  f"{now - began:.1f}s (remote_timeout {self.timeout:g}s); "
                                  f"the last answer: {last}", operation=operation, key=key,
                                  status=status)
            time.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, RETRY_MAX)

    # ---- objects --------------------------------------------------------------------------
    def get(self, key: str, *, start: int | None = None,
            length: int | None = None) -> tuple[bytes, str]:
        """(bytes, etag) of the object, or of bytes [start, start + length) (fewer at its
        end). Raises NotFound, RemoteError."""
        kwargs = {"Bucket": self.url.bucket, "Key": self.url.key(key)}
        if start is not None:
            if length is not None and length <= 0:
                return b"", ""
            end = "" if length is None else str(start + length - 1)
            kwargs["Range"] = f"bytes={start}-{end}"

        def fetch():
            try:
                answer = self._client.get_object(**kwargs)
            except self._exc.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                    return b"", ""          # a range starting at or past the end
                raise
            return answer["Body"].read(), answer.get("ETag", "")
        return self._call("GET", key, fetch)

    def get_into(self, key: str, start: int, length: int, consume: Callable):
        """Streams bytes [start, start + length) of the object (fewer at its end; none at or
        past it) to consume(readinto) and returns what consume returns; readinto(buffer)
        fills a writable buffer and returns the bytes read, 0 at the end (a body shorter
        than the server declared raises, and the request is retried). A failed attempt is
        retried as a whole, so consume must start over when called again. Raises NotFound,
        RemoteError."""
        kwargs = {"Bucket": self.url.bucket, "Key": self.url.key(key),
                  "Range": f"bytes={start}-{start + max(length, 1) - 1}"}

        def fetch():
            if length <= 0:
                return consume(lambda buf: 0)
            try:
                answer = self._client.get_object(**kwargs)
            except self._exc.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                    return consume(lambda buf: 0)       # a range starting past the end
                raise
            body = answer["Body"]
            try:
                readinto, done = _direct_readinto(body)
                result = consume(counted_to(readinto, answer.get("ContentLength")))
                done()
                return result
            finally:
                body.close()
        return self._call("GET", key, fetch)

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        """(bytes, etag) of the object, or None when its etag is still `etag` (a conditional
        GET: the server answers 304 without the body). Raises NotFound, RemoteError."""
        if etag is None:
            return self.get(key)
        kwargs = {"Bucket": self.url.bucket, "Key": self.url.key(key), "IfNoneMatch": etag}

        def fetch():
            try:
                answer = self._client.get_object(**kwargs)
            except self._exc.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 304:
                    return None
                raise
            return answer["Body"].read(), answer.get("ETag", "")
        return self._call("GET", key, fetch)

    def head(self, key: str) -> ObjectInfo | None:
        """Size, LastModified and etag of the object, None when it does not exist."""
        def fetch():
            a = self._client.head_object(Bucket=self.url.bucket, Key=self.url.key(key))
            return ObjectInfo(key, a["ContentLength"], a["LastModified"].timestamp(),
                              a.get("ETag"))
        try:
            return self._call("HEAD", key, fetch)
        except NotFound:
            return None

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        """Writes the object; returns its etag. if_none_match: only if it does not exist;
        if_match: only if its etag is this. Raises PreconditionFailed, RemoteError."""
        kwargs = {"Bucket": self.url.bucket, "Key": self.url.key(key), "Body": data}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        return self._call("PUT", key, lambda: self._client.put_object(**kwargs)["ETag"],
                          conditional=if_none_match or if_match is not None)

    def upload_file(self, key: str, path: str) -> None:
        """Uploads a local file: one PUT, or a multipart upload (parts in parallel, each
        retried on its own) when larger than part_size. Not conditional: used for objects
        whose key belongs to one writer (segments). Raises RemoteError."""
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= self.part_size:
                data = f.read()
                self._call("PUT", key, lambda: self._client.put_object(
                    Bucket=self.url.bucket, Key=self.url.key(key), Body=data))
                return
            self._multipart(key, f.fileno(), size)

    def _multipart(self, key: str, fd: int, size: int) -> None:
        full = self.url.key(key)
        upload = self._call("CREATE upload", key, lambda: self._client.create_multipart_upload(
            Bucket=self.url.bucket, Key=full)["UploadId"])
        failed = threading.Event()      # a part failed for good: the others stop trying

        def put_part(number: int) -> dict:
            data = os.pread(fd, self.part_size, (number - 1) * self.part_size)

            def attempt():
                if failed.is_set():
                    raise _Abandoned()
                return self._client.upload_part(Bucket=self.url.bucket, Key=full,
                                                UploadId=upload, PartNumber=number,
                                                Body=data)["ETag"]
            etag = self._call(f"PUT part {number}", key, attempt)
            crashpoint("remote_after_upload_part")
            return {"ETag": etag, "PartNumber": number}

        with self._lock:
            if self._parts is None:
                self._parts = ThreadPoolExecutor(UPLOAD_CONCURRENCY, "snapstore-part")
            pool = self._parts
        futures = [pool.submit(put_part, n) for n in range(1, -(-size // self.part_size) + 1)]
        try:
            parts = []
            for f in futures:
                try:
                    parts.append(f.result())
                except BaseException:
                    failed.set()
                    for other in futures:
                        other.cancel()
                    wait(futures)           # no part lands after the abort below
                    raise
            try:
                self._call("COMPLETE upload", key,
                           lambda: self._client.complete_multipart_upload(
                               Bucket=self.url.bucket, Key=full, UploadId=upload,
                               MultipartUpload={"Parts": parts}))
            except NotFound:
                # a retry of a COMPLETE that had landed (AWS may forget the upload id then)
                info = self.head(key)
                if info is None or info.size != size:
                    raise RemoteError(f"S3 COMPLETE upload of {full!r} in bucket "
                                      f"{self.url.bucket!r}: the upload is gone and the "
                                      "object is not there", operation="COMPLETE upload",
                                      key=key, status=404) from None
        except BaseException:
            with contextlib.suppress(Exception):        # one attempt; see abort_uploads
                self._client.abort_multipart_upload(Bucket=self.url.bucket, Key=full,
                                                    UploadId=upload)
            raise

    def delete(self, keys: list[str]) -> None:
        """Deletes the objects (missing ones are no error)."""
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self.url.key(k)} for k in keys[i:i + 1000]]

            def remove(batch=batch):
                answer = self._client.delete_objects(Bucket=self.url.bucket,
                                                     Delete={"Objects": batch, "Quiet": True})
                errors = answer.get("Errors") or []
                if errors:
                    raise RemoteError(f"S3 DELETE failed for {len(errors)} objects: "
                                      f"{errors[0]}", operation="DELETE",
                                      key=errors[0].get("Key", ""))
            self._call("DELETE", keys[i], remove)

    def list(self, directory: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """The objects whose keys begin with `directory` (relative keys), in key order."""
        token = None
        while True:
            kwargs = {"Bucket": self.url.bucket, "Prefix": self.url.key(directory)}
            if token:
                kwargs["ContinuationToken"] = token
            elif start_after:
                kwargs["StartAfter"] = self.url.key(start_after)
            try:
                page = self._call("LIST", directory,
                                  lambda kwargs=kwargs: self._client.list_objects_v2(**kwargs))
            except NotFound:
                # a listing is never "not found" on S3 but for a missing bucket (NoSuchBucket:
                # FormatError already): an endpoint answering 404 without S3's error codes
                raise FormatError(f"{self.url}: listing the bucket {self.url.bucket!r} "
                                  "answered 404 Not Found: it does not exist, or the endpoint "
                                  "(AWS_ENDPOINT_URL) is not an S3 server") from None
            for o in page.get("Contents", []):
                yield ObjectInfo(o["Key"][len(self.url.prefix):], o["Size"],
                                 o["LastModified"].timestamp(), o.get("ETag"))
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def abort_uploads(self, under: str = "", older_than: float | None = None) -> int:
        """Aborts the incomplete multipart uploads of the store's keys beginning with `under`
        (a writer killed mid-upload leaves them: under = the segment keys of its log), only
        those begun before unix time `older_than` when given; returns how many."""
        n = 0
        marker: dict = {}
        while True:
            answer = self._call("LIST uploads", under,
                                lambda marker=marker: self._client.list_multipart_uploads(
                                    Bucket=self.url.bucket, Prefix=self.url.key(under),
                                    **marker))
            for u in answer.get("Uploads", []):
                if older_than is not None and u["Initiated"].timestamp() >= older_than:
                    continue
                try:
                    self._call("ABORT upload", u["Key"][len(self.url.prefix):],
                               lambda u=u: self._client.abort_multipart_upload(
                                   Bucket=self.url.bucket, Key=u["Key"],
                                   UploadId=u["UploadId"]))
                except NotFound:
                    continue            # aborted or completed meanwhile
                n += 1
            if not answer.get("IsTruncated"):
                return n
            marker = {"KeyMarker": answer.get("NextKeyMarker", ""),
                      "UploadIdMarker": answer.get("NextUploadIdMarker", "")}
