"""An S3 emulator for the storage tests: moto's server (``moto[server]``, the test extra), a real HTTP server on a
free port of a local address, started and stopped by the test that uses it (the ``s3`` fixture in
``tests/conftest.py``; the emulated cluster's tests bind it to the head's bridge address so that the worker nodes,
each in a network namespace of its own, reach it too).

Nothing here talks to AWS: the endpoint is always the emulator's, and the credentials are moto's dummy ones, written
into the URIs (``s3://KEY:SECRET@bucket/...``) so that a process started elsewhere (a Ray worker node) needs no
environment of its own to reach the emulator.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

ACCESS_KEY = "rayfltest"
SECRET_KEY = "rayfltestsecret"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Emulator:
    """A running emulator: ``endpoint`` is ``host:port``; ``uri`` gives rayfl's URI of a bucket and prefix there."""

    host: str
    port: int
    server: Any

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, bucket: str, prefix: str = "", credentials: bool = True) -> str:
        who = f"{ACCESS_KEY}:{SECRET_KEY}@" if credentials else ""
        path = f"{bucket}/{prefix}".rstrip("/")
        return f"s3://{who}{path}?endpoint_override={self.endpoint}&scheme=http&region={REGION}"

    def filesystem(self) -> Any:
        """A pyarrow S3 file system on the emulator (for tests that read what a run wrote there)."""
        from pyarrow import fs as pafs

        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=self.endpoint,
            scheme="http",
            region=REGION,
            allow_bucket_creation=True,
        )

    def make_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def s3_emulator(host: str = "127.0.0.1") -> Iterator[S3Emulator]:
    """moto's S3 server on ``host`` at a free port, for the ``with`` block."""
    from moto.server import ThreadedMotoServer

    port = _free_port(host)
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    _reset(host, port)  # moto keeps its buckets in the process: an earlier test's are dropped
    try:
        yield S3Emulator(host, port, server)
    finally:
        _reset(host, port)
        server.stop()


def _reset(host: str, port: int) -> None:
    """Empty the emulator (moto's own API: every bucket and object of this process gone)."""
    import urllib.request

    request = urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


@contextlib.contextmanager
def read_only_s3(bucket: str = "read-only-bucket") -> Iterator[str]:
    """A URI of a location that refuses writes: moto's server in a process of its own with access checks on (after
    the four set-up calls, ``INITIAL_NO_AUTH_ACTION_COUNT``), and a user whose policy allows reading only."""
    import json
    import subprocess
    import sys
    import time

    import boto3

    host = "127.0.0.1"
    port = _free_port(host)
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}
    argv = [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((host, port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        setup = {"endpoint_url": f"http://{host}:{port}", "region_name": REGION}
        keys = {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}
        boto3.client("s3", **setup, **keys).create_bucket(Bucket=bucket)
        iam = boto3.client("iam", **setup, **keys)
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        policy = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}
        document = json.dumps({"Version": "2012-10-17", "Statement": [policy]})
        iam.put_user_policy(UserName="reader", PolicyName="read-only", PolicyDocument=document)
        who = f"{quote(key['AccessKeyId'], safe='')}:{quote(key['SecretAccessKey'], safe='')}"  # may hold / or +
        yield f"s3://{who}@{bucket}/runs?endpoint_override={host}:{port}&scheme=http&region={REGION}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
