"""Mount a pool's volumes on a node: the bash lines (and 0600 files) the bootstrap runs.

Pure functions: given the volumes, the provider kind and the resolved keys, ``mount_plan``
returns what to upload, the lines that mount every volume before the agent starts, the prefix
the agent's command needs, and the lines that unmount them before the stack is destroyed.

Mounters, by ``mount_kind``:

* ``s3-keys`` / ``s3-public`` (any S3-compatible store) and ``aws-role`` (S3 through the AWS
  node's instance profile, ``iam_role=auto``): **s3fs**. Keys reach s3fs in a ``passwd_file``
  uploaded with mode 0600 and deleted once the mount is up, so they are never on a command
  line, in the environment, or in the bootstrap's output.
* ``gcp-service-account``: **gcsfuse**, which uses the node's service account by itself.

Read-only volumes are mounted ``-o ro``: the kernel refuses every write with EROFS.

Local nodes share one machine, so two nodes cannot both own ``/data`` in the host's mount
table. Each Local node gets a private mount namespace instead, held by a small ``sleep``
process started by the bootstrap; its volumes are mounted inside it and the agent starts
inside it (``agent_prefix``), so tasks see ``/data`` exactly as on a cloud node while the host
sees nothing. When the node's sandbox is stopped, the holder and the mounters die with it and
the kernel drops the namespace and its mounts: nothing is left in the host's mount table.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.providers import provider_class
from skyward_iac.api.volumes import Volume, VolumeKeys, mount_kind

#: The Local node's namespace holder pid, relative to the node's workdir.
NAMESPACE_PID = "run/volumes.ns"
GCSFUSE_KEY_URL = "https://packages.cloud.google.com/apt/doc/apt-key.gpg"
GCSFUSE_REPO = "https://packages.cloud.google.com/apt"
#: How long a mount may take to appear, in tenths of a second.
MOUNT_WAIT_TENTHS = 300


@dataclass(frozen=True, slots=True)
class VolumeFile:
    """A file the bootstrap uploads before running the lines: ``path`` is relative to the
    node's workdir, ``mode`` is applied before any byte is written."""

    path: str
    content: bytes = field(repr=False)
    mode: int = 0o600


@dataclass(frozen=True, slots=True)
class MountPlan:
    """What a node's bootstrap and teardown do for its volumes.

    ``mount`` and ``unmount`` are bash lines that expect ``$W`` (the node's workdir) to be set
    and ``set -euo pipefail`` in force; ``agent_prefix`` goes in front of the agent's command
    (empty unless the node's mounts live in a namespace of their own).
    """

    files: tuple[VolumeFile, ...] = ()
    mount: tuple[str, ...] = ()
    unmount: tuple[str, ...] = ()
    agent_prefix: str = ""

    def __bool__(self) -> bool:
        return bool(self.mount)


def mount_plan(volumes: Sequence[Volume], provider: str,
               keys: Mapping[int, VolumeKeys] | None = None, *,
               region: str | None = None) -> MountPlan:
    """The mount plan for ``volumes`` on a node of ``provider`` (``local``, ``aws``, ``gcp``).

    ``keys`` maps a volume's index to its resolved keys (every ``s3-keys`` volume needs one);
    ``region`` is the node's region, where S3 is reached when a volume names no storage.
    """
    if not volumes:
        return MountPlan()
    keys = keys or {}
    kinds = [mount_kind(volume, provider) for volume in volumes]
    local = provider_class(provider).on_this_machine  # a sandbox: its own mount namespace
    files: list[VolumeFile] = []
    lines = [
        "# volumes: mounted before the agent starts",
        'SKY_SUDO=""; [ "$(id -u)" = 0 ] || SKY_SUDO="sudo -n"',
        'SKY_UID=$(id -u); SKY_GID=$(id -g); mkdir -p "$W/log"',
    ]
    if any(kind != "gcp-service-account" for kind in kinds):
        lines += _install_s3fs(local)
    if "gcp-service-account" in kinds:
        lines += _install_gcsfuse()
    lines += _enter_namespace() if local else ['SKY_NS=""']
    lines += _state_function()
    for index, (volume, kind) in enumerate(zip(volumes, kinds, strict=True)):
        passwd: str | None = None
        if kind == "s3-keys":
            pair = keys.get(index)
            if pair is None:
                raise ConfigError(f"volume {volume.mount}: no resolved keys were given for it")
            passwd = f"volume-{index}.passwd"
            files.append(VolumeFile(passwd, f"{pair.access_key}:{pair.secret_key}\n".encode()))
        lines += _mount_lines(index, volume, kind, passwd, region)
    return MountPlan(
        files=tuple(files), mount=tuple(lines), unmount=tuple(_unmount_lines(volumes, local)),
        agent_prefix=_agent_prefix() if local else "",
    )


def mount_script(plan: MountPlan, workdir: str) -> str:
    """``plan.mount`` as a standalone bash script (the files must already be in ``workdir``)."""
    return _script(plan.mount, workdir)


def unmount_script(plan: MountPlan, workdir: str) -> str:
    """``plan.unmount`` as a standalone bash script, for teardown over SSH."""
    return _script(plan.unmount, workdir)


def _script(lines: Sequence[str], workdir: str) -> str:
    if not lines:
        return ""
    return "\n".join(["set -euo pipefail", f"W={shlex.quote(workdir)}", *lines]) + "\n"


# -- mounters ----------------------------------------------------------------------------------


def _install_s3fs(local: bool) -> list[str]:
    if local:
        # Local nodes are this machine: install nothing behind the user's back.
        return ['command -v s3fs >/dev/null || { echo "volumes need s3fs on this machine: '
                'apt-get install s3fs (scripts/setup installs it)" >&2; exit 1; }']
    return [
        "if ! command -v s3fs >/dev/null; then",
        "  $SKY_SUDO cloud-init status --wait >/dev/null 2>&1 || true",
        *_apt_install("s3fs"),
        "fi",
    ]


def _install_gcsfuse() -> list[str]:
    # gcsfuse is not in Ubuntu's archive: Google's own apt repository, as Google documents.
    return [
        "if ! command -v gcsfuse >/dev/null; then",
        "  $SKY_SUDO cloud-init status --wait >/dev/null 2>&1 || true",
        "  $SKY_SUDO install -d -m 0755 /etc/apt/keyrings",
        f"  curl -fsSL {GCSFUSE_KEY_URL} | $SKY_SUDO tee /etc/apt/keyrings/gcsfuse.asc >/dev/null",
        '  echo "deb [signed-by=/etc/apt/keyrings/gcsfuse.asc] '
        f'{GCSFUSE_REPO} gcsfuse-$(. /etc/os-release && echo "$VERSION_CODENAME") main" '
        "| $SKY_SUDO tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null",
        *_apt_install("gcsfuse"),
        "fi",
    ]


def _apt_install(package: str) -> list[str]:
    apt = "$SKY_SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300"
    return [f"  {apt} update -qq >/dev/null",
            f"  {apt} install -y -qq --no-install-recommends {package} >/dev/null"]


def _enter_namespace() -> list[str]:
    """Start (or find again) the Local node's mount-namespace holder; ``SKY_NS`` enters it."""
    pid_file = f'"$W/{NAMESPACE_PID}"'
    return [
        '[ "$(id -u)" = 0 ] || { echo "volumes on Local nodes need root (FUSE mounts in a '
        'mount namespace of the node)" >&2; exit 1; }',
        f"if [ -s {pid_file} ] && kill -0 \"$(cat {pid_file})\" 2>/dev/null; then",
        f"  SKY_NS_PID=$(cat {pid_file})",
        "else",
        '  mkdir -p "$W/run"',
        # setsid: the holder outlives this SSH session; private propagation: nothing mounted
        # inside reaches the host's mount table.
        "  setsid unshare --mount --propagation private sleep infinity "
        "</dev/null >/dev/null 2>&1 &",
        "  SKY_NS_PID=$!",
        f"  echo \"$SKY_NS_PID\" > {pid_file}",
        "  for _ in $(seq 1 100); do",
        '    [ "$(readlink /proc/$SKY_NS_PID/ns/mnt 2>/dev/null)" != '
        '"$(readlink /proc/$$/ns/mnt)" ] && break',
        "    sleep 0.05",
        "  done",
        "fi",
        'SKY_NS="nsenter --target $SKY_NS_PID --mount --"',
    ]


def _state_function() -> list[str]:
    """``sky_mounted DIR``: 0 mounted and listable, 1 not mounted (yet), 2 mounted but dead.

    A FUSE mounter that fails after it daemonized (refused keys, missing bucket) leaves a dead
    mount behind; telling that apart from "not yet" fails the bootstrap at once, not after the
    whole wait.
    """
    return [
        "sky_mounted() {",
        '  if $SKY_SUDO $SKY_NS mountpoint -q "$1" && $SKY_SUDO $SKY_NS ls "$1" >/dev/null 2>&1;'
        " then return 0; fi",
        '  if $SKY_SUDO $SKY_NS grep -qs " $1 fuse" /proc/self/mounts; then return 2; fi',
        "  return 1",
        "}",
    ]


def _agent_prefix() -> str:
    return f'nsenter --target "$(cat "$W/{NAMESPACE_PID}")" --mount --'


def _mount_lines(index: int, volume: Volume, kind: str, passwd: str | None,
                 region: str | None) -> list[str]:
    q = shlex.quote
    mount = q(volume.mount)
    access = "read-only" if volume.read_only else "read-write"
    where = volume.bucket + (f"/{volume.prefix}" if volume.prefix else "")
    log = f'"$W/log/volume-{index}.log"'
    if kind == "gcp-service-account":
        command = _gcsfuse(volume, log)
        what = f"gcsfuse (service account) could not mount gs://{where}"
    else:
        command = _s3fs(volume, kind, passwd, region, log)
        what = f"s3fs could not mount s3://{where}"
    # On failure: no keys left behind, the mounter's last words, and what failed.
    fail = (f'{{ rm -f "$W"/volume-*.passwd; $SKY_SUDO tail -n 5 {log} >&2 2>/dev/null || true; '
            f"echo {q(f'volume {volume.mount}: {what}')} >&2; exit 1; }}")
    lines = [
        f"# {volume.mount}: {where} ({access}, {kind})",
        f"$SKY_SUDO $SKY_NS mkdir -p {mount}",
        f"SKY_STATE=0; sky_mounted {mount} || SKY_STATE=$?",
        'if [ "$SKY_STATE" != 0 ]; then',
        f'  [ "$SKY_STATE" = 1 ] || $SKY_SUDO $SKY_NS umount -l {mount} || true',
        # In the foreground of a process of its own, so a mounter that gives up (refused keys,
        # no such bucket) is seen gone at once instead of after the whole wait.
        f"  $SKY_SUDO $SKY_NS setsid {command} </dev/null >>{log} 2>&1 &",
        "  SKY_MOUNTER=$!",
        f"  for _ in $(seq 1 {MOUNT_WAIT_TENTHS}); do",
        # Mounted and listable, or the mounter gave up; anything else may still be starting.
        f'    SKY_STATE=0; sky_mounted {mount} || SKY_STATE=$?; [ "$SKY_STATE" = 0 ] && break',
        '    kill -0 "$SKY_MOUNTER" 2>/dev/null || break',
        "    sleep 0.1",
        "  done",
        f'  [ "$SKY_STATE" = 0 ] || {{ $SKY_SUDO $SKY_NS umount -l {mount} 2>/dev/null || true; '
        f"{fail[2:]}",
        "fi",
    ]
    if passwd is not None:
        # s3fs read the keys at start; they need not stay on the node's disk.
        lines.append(f'rm -f "$W/{passwd}"')
    return lines


def _s3fs(volume: Volume, kind: str, passwd: str | None, region: str | None, log: str) -> str:
    q = shlex.quote
    source = volume.bucket + (f":/{volume.prefix}" if volume.prefix else "")
    storage = volume.storage
    # sigv4 only: s3fs would otherwise retry failures with v2 signatures for over a minute.
    options = ["allow_other", "uid=$SKY_UID", "gid=$SKY_GID", "umask=0022", "mp_umask=0022",
               "sigv4", "dbglevel=err", f"logfile={log}"]
    if volume.read_only:
        options.append("ro")
    if kind == "aws-role":
        sign_region = (storage.region if storage is not None else None) or region or "us-east-1"
        url = storage.endpoint if storage is not None else f"https://s3.{sign_region}.amazonaws.com"
        options += ["iam_role=auto", f"url={url.rstrip('/')}", f"endpoint={sign_region}"]
    else:
        assert storage is not None  # mount_kind gives s3-keys/s3-public only with a storage
        options += [f"url={storage.endpoint.rstrip('/')}",
                    f"endpoint={storage.region or 'us-east-1'}"]
        if storage.path_style:
            options.append("use_path_request_style")
        if kind == "s3-public":
            options.append("public_bucket=1")
        else:
            options.append(f'passwd_file="$W/{passwd}"')
    flags = " ".join(f"-o {option}" for option in options)
    return f"s3fs {q(source)} {q(volume.mount)} -f {flags}"


def _gcsfuse(volume: Volume, log: str) -> str:
    q = shlex.quote
    flags = ["--foreground", "--implicit-dirs", "-o allow_other", "--uid $SKY_UID",
             "--gid $SKY_GID",
             "--file-mode 644", "--dir-mode 755", f"--log-file {log}"]
    if volume.prefix:
        flags.append(f"--only-dir {q(volume.prefix)}")
    if volume.read_only:
        flags.append("-o ro")
    return f"gcsfuse {' '.join(flags)} {q(volume.bucket)} {q(volume.mount)}"


def _unmount_lines(volumes: Sequence[Volume], local: bool) -> list[str]:
    """Unmount every volume (lazily if busy), then stop the namespace holder; never fails."""
    lines = [
        "# volumes: unmounted before the stack is destroyed",
        'SKY_SUDO=""; [ "$(id -u)" = 0 ] || SKY_SUDO="sudo -n"',
    ]
    pid_file = f'"$W/{NAMESPACE_PID}"'
    if local:
        lines += [
            'SKY_NS=""; SKY_NS_PID=""',
            f"if [ -s {pid_file} ] && kill -0 \"$(cat {pid_file})\" 2>/dev/null; then",
            f"  SKY_NS_PID=$(cat {pid_file})",
            '  SKY_NS="nsenter --target $SKY_NS_PID --mount --"',
            "fi",
            # Without a live holder the namespace (and every mount in it) is gone already.
            'if [ -n "$SKY_NS_PID" ]; then',
        ]
    else:
        lines += ['SKY_NS=""', "if true; then"]
    for volume in reversed(volumes):
        mount = shlex.quote(volume.mount)
        lines += [
            f"  if $SKY_SUDO $SKY_NS mountpoint -q {mount}; then",
            f"    $SKY_SUDO $SKY_NS umount {mount} 2>/dev/null || "
            f"$SKY_SUDO $SKY_NS umount -l {mount} || true",
            "  fi",
        ]
    if local:
        lines += ['  kill "$SKY_NS_PID" 2>/dev/null || true', f"  rm -f {pid_file}"]
    lines += ["fi", 'rm -f "$W"/volume-*.passwd']
    return lines
