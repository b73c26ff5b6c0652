"""Servers that tests start on localhost and stop: an https server over a folder, and an S3-compatible one (moto)."""

from __future__ import annotations

import contextlib
import datetime
import functools
import http.server
import ipaddress
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no line per request in the test's output
        pass


class FadingHandler(QuietHandler):
    """Answers each path ``server.answers`` times; after that a request gets no answer (the connection stays open)
    until the server closes (``server.closing``), as a server that stopped answering; ``server.hung`` is set then."""

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.asked[self.path] = asked = self.server.asked.get(self.path, 0) + 1
        if asked > self.server.answers:
            self.server.hung.set()
            self.server.closing.wait()
            return
        super().do_GET()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made here (the cryptography package): (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@contextlib.contextmanager
def web_server(folder: Path, answers: int | None = None, hung: threading.Event | None = None
               ) -> Iterator[tuple[str, dict[str, str]]]:
    """``folder`` served over https on localhost, with a certificate made for it, while the block runs; yields its
    base URL and the environment a process needs to trust it (REQUESTS_CA_BUNDLE; also set in this one). With
    ``answers``, each file is served that many times, and then no more answers come (``hung`` is set at the first
    request left without one)."""
    with tempfile.TemporaryDirectory() as tls:
        cert, key = self_signed(Path(tls))
        handler = QuietHandler if answers is None else FadingHandler
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
        server.answers, server.asked, server.lock = answers, {}, threading.Lock()
        server.hung, server.closing = hung or threading.Event(), threading.Event()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        with environment({"REQUESTS_CA_BUNDLE": str(cert)}) as env:
            try:
                yield f"https://127.0.0.1:{server.server_address[1]}", env
            finally:
                server.closing.set()
                server.shutdown()
                server.server_close()
                thread.join(timeout=10)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[dict[str, str]]:
    """``values`` set in os.environ while the block runs (then restored); yields them."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield values
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def s3_server(folder: Path, bucket: str = "corpus") -> Iterator[tuple[str, dict[str, str]]]:
    """An S3-compatible server (moto) on localhost holding ``folder``'s files in ``bucket`` while the block runs;
    yields the folder's s3:// address and the environment a process needs to reach it (also set in this one)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from asr.data import remote

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    remote._SET_UP.clear()  # this process's S3 client was made for another server (asr.data.remote.connect)
    try:
        with environment({**S3_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}) as env:
            client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
            client.create_bucket(Bucket=bucket)
            for path in folder.iterdir():
                client.upload_file(str(path), bucket, f"{folder.name}/{path.name}")
            yield f"s3://{bucket}/{folder.name}", env
    finally:
        server.stop()
        remote._SET_UP.clear()
