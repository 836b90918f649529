"""A real S3 endpoint for tests: moto's server in a subprocess on a free loopback port.

moto implements the S3 REST API (listing, multipart, LastModified) in-process; pyarrow's S3
client talks to it over HTTP exactly as it would to a bucket, so the storage code under test is
the production code path, endpoint aside.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

KEY = "test"  # moto accepts any credentials; real ones never appear in tests


@dataclass(frozen=True)
class S3Server:
    host: str
    port: int
    process: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, bucket: str, prefix: str = "") -> str:
        """A pyarrow.fs URI for `bucket/prefix` on this server (credentials in the URI)."""
        query = f"endpoint_override={self.endpoint}&scheme=http&region=us-east-1"
        return f"s3://{KEY}:{KEY}@{bucket}/{prefix.strip('/')}?{query}"

    def new_bucket(self, prefix: str = "exp") -> str:
        """A fresh, empty bucket; returns the URI of `prefix` in it."""
        bucket = f"t-{uuid.uuid4().hex[:16]}"
        fs, _ = pafs.FileSystem.from_uri(self.uri(bucket) + "&allow_bucket_creation=true")
        fs.create_dir(bucket)
        return self.uri(bucket, prefix)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_s3_server(log_path: Path, timeout_s: float = 30.0) -> S3Server:
    """Start moto's server and wait until it answers; the caller stops `process`."""
    port = _free_port()
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    argv = [server] if server else [sys.executable, "-m", "moto.server"]
    log = log_path.open("wb")
    process = subprocess.Popen(
        [*argv, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}: {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto_server did not answer within {timeout_s} s") from None
            time.sleep(0.2)
    return S3Server("127.0.0.1", port, process)
