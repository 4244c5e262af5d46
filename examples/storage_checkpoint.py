"""Checkpoints to a bucket: tasks read a dataset from a read-only Volume and write checkpoints
into a read-write Volume; the client then downloads them with sky.Storage.

No cloud is reachable from this example, so it starts a local S3-compatible server itself
(moto's server mode: `pip install "moto[server]"`) and points both the volumes and the client
at it. On a real cloud, drop `local_s3()` and use a preset instead, for example
`storage = sky.storage.R2(account_id=..., access_key=..., secret_key=...)`, or on AWS/GCP no
storage at all (`sky.Volume("my-bucket", "/mnt/data")`): nodes then mount the bucket with the
instance profile / service account the stack creates for them.

Local nodes mount volumes with s3fs (FUSE) as root; scripts/setup installs s3fs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import skyward_iac as sky

ACCESS_KEY, SECRET_KEY = "example-access-key", "example-secret-key"


@contextlib.contextmanager
def local_s3() -> Iterator[str]:
    """A local S3-compatible server (moto) on a free loopback port; yields its endpoint."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            time.sleep(0.1)
        yield endpoint
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()


@sky.function
def train(steps: int) -> str:
    """Read the dataset from the read-only volume, write this node's checkpoint."""
    node = sky.instance_info().node
    with open("/mnt/datasets/numbers.txt") as dataset:
        total = sum(int(line) for line in dataset) * steps
    os.makedirs("/mnt/checkpoints/run-1", exist_ok=True)
    path = f"/mnt/checkpoints/run-1/node-{node}.ckpt"
    with open(path, "w") as checkpoint:  # in the bucket once the file is closed
        checkpoint.write(f"node={node} steps={steps} total={total}\n")
    return path


def main() -> None:
    with local_s3() as endpoint:
        storage = sky.Storage(endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                              path_style=True)
        # Buckets are yours (created in the cloud's console or your IaC); here, on the local
        # server, boto3 creates them.
        import boto3

        s3_admin = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        for bucket in ("datasets", "checkpoints"):
            s3_admin.create_bucket(Bucket=bucket)

        with tempfile.TemporaryDirectory() as scratch:
            numbers = Path(scratch, "numbers.txt")
            numbers.write_text("".join(f"{n}\n" for n in range(10)))
            with storage as s3:
                s3.upload("datasets", numbers)  # key: numbers.txt

            volumes = [
                sky.Volume("datasets", "/mnt/datasets", storage=storage),
                sky.Volume("checkpoints", "/mnt/checkpoints", read_only=False, storage=storage),
            ]
            with sky.Compute(provider=sky.Local(), nodes=2, volumes=volumes) as pool:
                written = train(steps=100) @ pool  # every node writes one checkpoint
            print("written on the nodes:", written)

            with storage as s3:
                keys = [k for k in s3.ls("checkpoints", prefix="run-1/") if k.endswith(".ckpt")]
                for key in keys:
                    local = s3.download("checkpoints", key, Path(scratch, key))
                    print(f"{key}: {local.read_text().strip()}")
            print(f"checkpoints downloaded: {len(keys)} of {len(written)}")


if __name__ == "__main__":
    main()
