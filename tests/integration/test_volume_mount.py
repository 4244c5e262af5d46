"""The node mount lines of ``remote/volumes.py``, run for real: s3fs (FUSE) against a local
S3-compatible server (moto), as root, the way a Local node's bootstrap runs them.

A "task" runs behind the plan's ``agent_prefix``, exactly where the agent would start, and
must see the volumes; the host's own mount table must not.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.api.volumes import Volume, volume_keys
from skyward_iac.processes import is_alive
from skyward_iac.remote.volumes import MountPlan, mount_plan, mount_script, unmount_script
from skyward_iac.storage import Storage
from tests.s3_server import (  # noqa: F401 - shared pytest fixtures
    S3Server,
    s3_server,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts in a namespace need root"),
    pytest.mark.skipif(shutil.which("s3fs") is None,
                       reason="s3fs is not installed (apt-get install s3fs; scripts/setup does)"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
]


def make_bucket(storage: Storage) -> str:
    import boto3

    name = f"vol-{secrets.token_hex(4)}"
    keys = storage.keys()
    assert keys is not None
    client = boto3.client("s3", endpoint_url=storage.endpoint, region_name="us-east-1",
                          aws_access_key_id=keys[0], aws_secret_access_key=keys[1])
    client.create_bucket(Bucket=name)
    return name


class Node:
    """A fake node's workdir where the plan's files land and its scripts run."""

    def __init__(self, workdir: Path, plan: MountPlan) -> None:
        self.workdir, self.plan = workdir, plan

    def upload_files(self) -> None:
        for file in self.plan.files:
            path = self.workdir / file.path
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file.mode)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(file.content)

    def bash(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    def mount(self) -> subprocess.CompletedProcess[str]:
        self.upload_files()
        return self.bash(mount_script(self.plan, str(self.workdir)))

    def unmount(self) -> subprocess.CompletedProcess[str]:
        return self.bash(unmount_script(self.plan, str(self.workdir)))

    def task(self, code: str) -> dict[str, object]:
        """Run Python where the agent runs (behind ``agent_prefix``); returns its JSON."""
        script = (f"W={self.workdir}\n"
                  f"{self.plan.agent_prefix} {sys.executable} -c {_quote(code)}\n")
        done = self.bash(script)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def host_mounts() -> str:
    return Path("/proc/self/mounts").read_text()


@pytest.fixture()
def mounts_root() -> Iterator[Path]:
    root = Path(f"/mnt/skyward-test-{secrets.token_hex(4)}")
    yield root
    shutil.rmtree(root, ignore_errors=True)  # only empty mount points are left by then


def test_read_only_and_read_write_volumes(storage: Storage, server: S3Server, tmp_path: Path,
                                          mounts_root: Path) -> None:
    data, ckpt = make_bucket(storage), make_bucket(storage)
    source = tmp_path / "hello.txt"
    source.write_text("hello from the client")
    with storage as s3:
        s3.upload(data, source, key="inputs/hello.txt")
        s3.upload(data, source, key="elsewhere/other.txt")  # outside the volume's prefix
    ro_mount, rw_mount = f"{mounts_root}/data", f"{mounts_root}/ckpt"
    volumes = [Volume(data, ro_mount, prefix="inputs", storage=storage),
               Volume(ckpt, rw_mount, read_only=False, storage=storage)]
    plan = mount_plan(volumes, "local", volume_keys(volumes, "local"))
    node = Node(tmp_path, plan)
    try:
        started = time.monotonic()
        mounted = node.mount()
        assert mounted.returncode == 0, mounted.stderr
        print(f"mounted 2 volumes in {time.monotonic() - started:.2f}s")
        # Keys: only ever in the 0600 files, which are gone once s3fs has read them.
        output = mounted.stdout + mounted.stderr
        assert server.secret_key not in output and server.secret_key not in mount_script(
            plan, str(tmp_path))
        assert not list(tmp_path.glob("volume-*.passwd"))
        # The host's mount table does not see a Local node's volumes.
        assert ro_mount not in host_mounts() and rw_mount not in host_mounts()

        seen = node.task(textwrap.dedent(f"""
            import errno, json, os
            out = {{"listing": sorted(os.listdir({ro_mount!r})),
                    "hello": open({ro_mount!r} + "/hello.txt").read()}}
            try:
                open({ro_mount!r} + "/new.txt", "w").write("x")
                out["ro_write"] = "allowed"
            except OSError as exc:
                out["ro_write"] = errno.errorcode[exc.errno]
            os.makedirs({rw_mount!r} + "/run1", exist_ok=True)
            with open({rw_mount!r} + "/run1/step-100.ckpt", "wb") as f:
                f.write(b"weights" * 1000)
            out["rw_listing"] = sorted(os.listdir({rw_mount!r} + "/run1"))
            print(json.dumps(out))
        """))
        assert seen == {"listing": ["hello.txt"], "hello": "hello from the client",
                        "ro_write": "EROFS", "rw_listing": ["step-100.ckpt"]}

        # The checkpoint the task wrote is an object the client can download.
        with storage as s3:
            # s3fs keeps a "run1/" marker object for the directory the task made.
            assert s3.ls(ckpt, prefix="run1/") == ["run1/", "run1/step-100.ckpt"]
            got = s3.download(ckpt, "run1/step-100.ckpt", tmp_path / "step-100.ckpt")
            assert got.read_bytes() == b"weights" * 1000
            assert s3.ls(data) == ["elsewhere/other.txt", "inputs/hello.txt"]  # ro: untouched

        # Bootstrapping again (a retry) finds the namespace and mounts already there.
        again = node.mount()
        assert again.returncode == 0, again.stderr
        assert node.task("import json, os; print(json.dumps({'n': len(os.listdir("
                         f"{ro_mount!r}))}}))") == {"n": 1}
    finally:
        holder = (tmp_path / "run" / "volumes.ns").read_text().strip() \
            if (tmp_path / "run" / "volumes.ns").exists() else None
        unmounted = node.unmount()
    assert unmounted.returncode == 0, unmounted.stderr
    assert holder is not None
    deadline = time.monotonic() + 5
    while is_alive(int(holder)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(int(holder))  # the namespace holder is gone, and the namespace with it
    assert not (tmp_path / "run" / "volumes.ns").exists()
    deadline = time.monotonic() + 10
    while _s3fs_for(ro_mount, rw_mount) and time.monotonic() < deadline:
        time.sleep(0.1)  # the mounters exit once their mounts are gone
    assert not _s3fs_for(ro_mount, rw_mount)


def test_bad_keys_fail_the_mount_with_a_clear_message(server: S3Server, tmp_path: Path,
                                                      mounts_root: Path) -> None:
    with s3_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as strict:
        wrong = Storage(strict.endpoint, access_key="AKIAWRONG", secret_key="wrong-secret-key",
                        path_style=True)
        volumes = [Volume("private-data", f"{mounts_root}/private", storage=wrong)]
        plan = mount_plan(volumes, "local", volume_keys(volumes, "local"))
        node = Node(tmp_path, plan)
        try:
            failed = node.mount()
        finally:
            node.unmount()
    assert failed.returncode != 0
    assert f"volume {mounts_root}/private: s3fs could not mount s3://private-data" in failed.stderr
    assert "wrong-secret-key" not in failed.stdout + failed.stderr
    assert not list(tmp_path.glob("volume-*.passwd"))  # no keys left behind on failure


def _s3fs_for(*mounts: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline.startswith("s3fs") and state != "Z" and any(m in cmdline for m in mounts):
            found.append(int(proc.name))
    return found
