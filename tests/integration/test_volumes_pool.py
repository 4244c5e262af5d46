"""Bucket volumes on a real 2-node Local pool: s3fs mounts before tasks run, a read-only
volume refuses writes, a read-write one carries a checkpoint back to the client."""

from __future__ import annotations

import secrets
from pathlib import Path

import boto3

import skyward_iac as sky
from tests.s3_server import S3Server


def make_bucket(server: S3Server) -> str:
    name = f"vol-{secrets.token_hex(4)}"
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                 aws_access_key_id=server.access_key,
                 aws_secret_access_key=server.secret_key).create_bucket(Bucket=name)
    return name


@sky.function
def use_volumes(dataset: str, checkpoints: str) -> dict:
    import errno
    import os

    node = sky.instance_info().node  # type: ignore[union-attr]
    with open(os.path.join(dataset, "input.txt")) as file:
        seen = file.read()
    try:
        with open(os.path.join(dataset, f"forbidden-{node}.txt"), "w") as file:
            file.write("must not land")
        read_only = "write succeeded"
    except OSError as exc:
        read_only = errno.errorcode.get(exc.errno or 0, str(exc))
    with open(os.path.join(checkpoints, f"node-{node}.ckpt"), "w") as file:
        file.write(f"node {node} saw {seen}")
    return {"node": node, "seen": seen, "read_only": read_only}


def test_read_only_refuses_writes_and_read_write_reaches_the_bucket(
    server: S3Server, storage: sky.Storage, tmp_path: Path,
) -> None:
    data, ckpt = make_bucket(server), make_bucket(server)
    (tmp_path / "input.txt").write_text("dataset-v1")
    storage.upload(data, tmp_path / "input.txt", key="input.txt")
    volumes = [sky.Volume(data, "/mnt/dataset", storage=storage),
               sky.Volume(ckpt, "/mnt/ckpt", read_only=False, storage=storage)]
    with sky.Compute(provider=sky.Local(), nodes=2, volumes=volumes) as pool:
        results = use_volumes("/mnt/dataset", "/mnt/ckpt") @ pool
    assert [r["node"] for r in results] == [0, 1]
    assert all(r["seen"] == "dataset-v1" for r in results)
    assert all(r["read_only"] in {"EROFS", "EACCES", "EPERM"} for r in results), results
    assert storage.ls(data) == ["input.txt"]  # nothing written through the read-only mount
    assert sorted(storage.ls(ckpt)) == ["node-0.ckpt", "node-1.ckpt"]
    storage.download(ckpt, "node-1.ckpt", tmp_path / "back.ckpt")
    assert (tmp_path / "back.ckpt").read_text() == "node 1 saw dataset-v1"
