"""Shard files at ``https://`` and ``s3://`` addresses, as lhotse reads them (through smart_open): set up once per
process, with a read timeout, and their failures said in words.

``connect(address)`` before a process's first read of a remote file: every s3:// file of the process (index,
tokenizer, shards) goes through one S3 client (lhotse's ``SmartOpen.setup``; left to itself, smart_open makes a
client per file, and a botocore client takes a good part of a second of CPU to build: with 5-utterance shards that
was most of a data worker's time, docs/benchmarks.md, 2026-11-26 late night), made in the process that reads, as
boto3 clients must not cross a fork; an https read that gets no answer for READ_TIMEOUT_SECONDS fails (requests
waits forever by default), as botocore's own reads do after as long.

``failure(err)``: lhotse answers any failure to open a URL with advice to install smart_open, and keeps the real
error as its context; this names that one instead: no such bucket or file, access denied, no credentials, a host
that cannot be reached or does not answer.
"""

from __future__ import annotations

import logging
import os

READ_TIMEOUT_SECONDS = 60.0  # an https read without an answer this long fails (botocore's own default for S3)
ACCESS_DENIED = ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
                 "InvalidToken", "ExpiredToken")  # S3's error codes for credentials or policies that do not allow it
UNREACHABLE = ("ConnectionError", "ConnectionRefusedError", "EndpointConnectionError", "ConnectTimeoutError",
               "ConnectTimeout", "NewConnectionError", "MaxRetryError", "gaierror")
NO_ANSWER = ("ReadTimeout", "ReadTimeoutError", "TimeoutError", "timeout")

_SET_UP: dict[int, dict] = {}  # process id -> the transport parameters it gave smart_open


def connect(address: str) -> None:
    """Set up this process's reads of remote files, once (again in a forked child, and once more when its first
    s3:// address comes after an https:// one); nothing for a local path."""
    if "://" not in address:
        return
    params = _SET_UP.get(os.getpid())
    s3 = address.startswith("s3://")
    if params is not None and (not s3 or "client" in params):
        return
    from lhotse.utils import SmartOpen

    params = {"timeout": READ_TIMEOUT_SECONDS}
    if s3:
        import boto3

        params["client"] = boto3.session.Session().client("s3")
    logging.getLogger("smart_open.utils").setLevel(logging.ERROR)  # each scheme ignores the other's parameter
    SmartOpen.transport_params = None  # a change, not lhotse's "second call overwrites" warning
    SmartOpen.setup(transport_params=params)
    _SET_UP.clear()
    _SET_UP[os.getpid()] = params


def failure(err: BaseException) -> str:
    """Why a read of a remote (or local) file failed, in words, with the error's own type and message (of the
    error S3 or the server answered with, where smart_open wrapped it in another)."""
    if isinstance(err, ValueError) and "pip install smart_open" in str(err) and err.__context__ is not None:
        err = err.__context__  # lhotse's advice for any failure of a URL: the real error is its context
    errors = chain(err)
    answer = next((e for e in errors if s3_code(e) or http_status(e)), err)
    code, status, names = s3_code(answer), http_status(answer), {type(e).__name__ for e in errors}
    said = f"{type(answer).__name__}: {' '.join(str(answer).split())[:200]}"
    if code == "NoSuchBucket":
        return f"no such bucket ({said})"
    if code in ("NoSuchKey", "404") or status == 404:
        return f"no such file ({said})"
    if code in ACCESS_DENIED or status in (401, 403):
        return f"access denied: check the credentials and the bucket's or server's policy ({said})"
    if names & {"NoCredentialsError", "PartialCredentialsError"}:
        return "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    if names & {"SSLError", "SSLCertVerificationError"}:
        return f"the server's certificate is not trusted: REQUESTS_CA_BUNDLE names the ones to trust ({said})"
    if names & set(NO_ANSWER):
        return f"no answer within {READ_TIMEOUT_SECONDS:g} s ({said})"
    if names & set(UNREACHABLE):
        return f"cannot reach {endpoint(errors)} ({said})"
    return said


def chain(err: BaseException) -> list[BaseException]:
    """``err`` and the errors it was raised from or during, innermost last."""
    found = [err]
    while (found[-1].__cause__ or found[-1].__context__) is not None and len(found) < 20:
        found.append(found[-1].__cause__ or found[-1].__context__)
    return found


def s3_code(err: BaseException) -> str | None:
    """botocore's ClientError code ("NoSuchKey", "AccessDenied", "404", ...), else None."""
    response = getattr(err, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def http_status(err: BaseException) -> int | None:
    """requests' HTTPError status, else None."""
    return getattr(getattr(err, "response", None), "status_code", None)


def endpoint(errors: list[BaseException]) -> str:
    """The host a connection failed to reach: the S3 endpoint this process uses, or "the server" (of the address the
    message names)."""
    client = _SET_UP.get(os.getpid(), {}).get("client")
    if client is not None and any("botocore" in type(e).__module__ for e in errors):
        return f"the S3 endpoint {client.meta.endpoint_url}"
    return "the server"
