"""A cloud node's user data: one ``#cloud-config`` document, built by pure functions.

It does three things before the client first connects:

* installs the stack-generated SSH host key and deletes the image's own, in cloud-init's init
  stage, which runs before sshd starts, so the only key sshd ever offers is the pinned one;
* creates the ``skyward`` user (home = the node's workdir) trusting the stack's SSH key;
* arms the TTL watchdog: a systemd service that powers the node off once the client has been
  silent for ``ttl`` seconds. With ``instance_initiated_shutdown_behavior="terminate"`` AWS then
  deletes the instance; on GCP the watchdog first deletes its own instance through the
  Compute API (``gce_self_delete``: a stopped VM would keep its disk), then powers off.

The client proves it is alive by writing ``HEARTBEAT_FILE`` on the node over its SSH
connection. The watchdog reads no time from that file: it notes, on the node's own clock
(``/proc/uptime``), when it last saw the file change, the rule of the Local provider's
watchdog (``node/watchdog.py``, ``api/deadlines.py``). A pool with a budget also writes
``BUDGET_FILE`` there: the seconds its budget leaves at the current rate, which the watchdog
counts down on the same clock from when it sees the file change, and powers off at zero.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from skyward_iac.api.deadlines import BUDGET_FILE

SSH_USER = "skyward"
WORKDIR = "/opt/skyward"
HEARTBEAT_FILE = f"{WORKDIR}/heartbeat"
#: Where the client writes the seconds the pool's budget leaves (``none``: no deadline).
BUDGET_PATH = f"{WORKDIR}/{BUDGET_FILE}"
WATCHDOG_PATH = "/usr/local/sbin/skyward-watchdog"
WATCHDOG_UNIT = "skyward-watchdog.service"
#: Silence allowed before the first heartbeat: boot plus bootstrap can outlast a short ttl.
FIRST_CONTACT_GRACE = 900
#: How often the watchdog looks at the heartbeat, in seconds.
WATCHDOG_INTERVAL = 15
#: What the watchdog has seen, kept for a restarted watchdog (in /run: it lasts one boot, as
#: /proc/uptime does).
WATCHDOG_STATE = "/run/skyward-watchdog.state"


@dataclass(frozen=True, slots=True)
class NodeUserData:
    """Everything one node's user data needs; all strings are plain (no Pulumi Outputs)."""

    host_private_key: str
    host_public_key: str
    authorized_key: str
    ttl: int
    max_lifetime: int | None = None
    #: GCP: the watchdog deletes the node through the Compute API (its own instance only,
    #: granted by the stack) before powering off, so no stopped disk is left to bill.
    self_delete: bool = False


#: Where a GCE node asks for its identity and token, and where it deletes itself.
GCE_METADATA = "http://metadata.google.internal/computeMetadata/v1"
GCE_COMPUTE_API = "https://compute.googleapis.com/compute/v1"
POWER_OFF = "systemctl poweroff || poweroff -f"


def gce_self_delete(metadata: str = GCE_METADATA, api: str = GCE_COMPUTE_API) -> str:
    """Shell lines that delete this GCE instance with its own service account's token (the
    stack grants it delete on this instance alone); any failure falls through to power-off."""
    md = f'curl -sf -m 10 -H "Metadata-Flavor: Google" {shlex.quote(metadata)}'
    return "; ".join([
        f"TOKEN=$({md}/instance/service-accounts/default/token "
        """| sed -E 's/.*"access_token" *: *"([^"]+)".*/\\1/')""",
        f"NAME=$({md}/instance/name)",
        f"ZONE=$({md}/instance/zone | sed 's#.*/##')",
        f"PROJECT=$({md}/project/project-id)",
        'curl -sf -m 30 -X DELETE -H "Authorization: Bearer $TOKEN" '
        f'"{api}/projects/$PROJECT/zones/$ZONE/instances/$NAME" >/dev/null '
        '&& logger -t skyward-watchdog "deleting instance $NAME"',
    ])


def watchdog_script(ttl: int, max_lifetime: int | None = None, *,
                    grace: int = FIRST_CONTACT_GRACE, heartbeat: str = HEARTBEAT_FILE,
                    interval: float = WATCHDOG_INTERVAL, stop: str = POWER_OFF,
                    before_stop: str = "", state: str = WATCHDOG_STATE,
                    budget: str = BUDGET_PATH) -> str:
    """The dead-man switch: power off after ``ttl`` s without a heartbeat.

    A beat is any change of the heartbeat file (inode, size, mtime, ctime); silence is counted
    on this node's clock (``/proc/uptime``, in hundredths of a second) from when the watchdog
    saw the last change, never from the times the file carries. Before the first beat the
    limit is ``max(ttl, grace)``, counted from the watchdog's first start in this boot. A
    ``max_lifetime`` also powers the node off that long after that start, whatever the
    heartbeat says (the in-node half of the hard backstop). Each change of the ``budget``
    file sets the budget's deadline that many whole seconds from then (``none`` clears it), and
    the node powers off once it passes. What it has seen is kept in ``state``, so a restarted
    watchdog grants no fresh grace and keeps the budget's deadline. ``heartbeat``,
    ``interval``, ``state`` and ``budget`` exist so tests can run the real script quickly;
    ``before_stop`` runs first when it fires (GCP: ``gce_self_delete``), ``stop`` then powers
    off.
    """
    if ttl <= 0:
        raise ValueError("ttl must be positive; a ttl of 0 means no watchdog at all")
    fire = [*([f"    {before_stop}"] if before_stop else []), f"    {stop}"]
    lines = [
        "#!/bin/bash",
        "# skyward_iac dead-man switch: the node powers off when its client has gone silent.",
        "set -u",
        f"TTL={int(ttl)}",
        f"FIRST_CONTACT={max(int(ttl), int(grace))}",
        f"MAX_LIFETIME={int(max_lifetime) if max_lifetime else 0}",
        f"HEARTBEAT={shlex.quote(heartbeat)}",
        f"STATE={shlex.quote(state)}",
        "tick() { local up rest; read -r up rest < /proc/uptime; NOW=$(( 10#${up/./} )); }",
        f"BUDGET={shlex.quote(budget)}",
        """state_of() { stat -c '%i %s %y %z' "$1" 2>/dev/null || echo none; }""",
        'look() { SEEN_NOW=$(state_of "$HEARTBEAT"); }',
        'look_budget() { BUDGET_NOW=$(state_of "$BUDGET"); }',
        ('save() { printf \'%s %s %s\\n%s\\n%s\\n%s\\n\' "$STARTED" "$CHANGED" "$BEATEN" '
         '"$SEEN" "$BUDGET_END" "$BUDGET_SEEN" > "$STATE.tmp" && mv -f "$STATE.tmp" "$STATE"; }'),
        "tick",
        ('{ read -r STARTED CHANGED BEATEN && IFS= read -r SEEN && read -r BUDGET_END '
         '&& IFS= read -r BUDGET_SEEN; } 2>/dev/null < "$STATE"'),
        # No budget's deadline (-1) unless a sound one was kept.
        ('[[ "${BUDGET_END:-x}" =~ ^-?[0-9]+$ ]] || { BUDGET_END=-1; BUDGET_SEEN=; }'),
        # No state, or a damaged one: start now (a damaged state must not stop the watchdog).
        'if ! [[ "${STARTED:-x}${CHANGED:-x}${BEATEN:-x}" =~ ^[0-9]+$ && -n "${SEEN+set}" ]]; then',
        "  look; STARTED=$NOW; CHANGED=$NOW; BEATEN=0; SEEN=$SEEN_NOW; save",
        "fi",
        f"while sleep {interval:g}; do",
        "  tick; look",
        '  if [ "$SEEN_NOW" != "$SEEN" ]; then',
        "    SEEN=$SEEN_NOW",
        '    if [ "$SEEN" != none ]; then CHANGED=$NOW; BEATEN=1; fi',
        "    save",
        "  fi",
        "  look_budget",
        '  if [ "$BUDGET_NOW" != "${BUDGET_SEEN:-}" ]; then',
        "    BUDGET_SEEN=$BUDGET_NOW",
        '    NOTE=; read -r NOTE 2>/dev/null < "$BUDGET"',
        # Whole seconds, or none; anything else (a file caught half written) changes nothing.
        '    if [ "$NOTE" = none ]; then BUDGET_END=-1',
        '    elif [[ "$NOTE" =~ ^[0-9]{1,9}$ ]]; then BUDGET_END=$(( NOW + 10#$NOTE * 100 )); fi',
        "    save",
        "  fi",
        '  if [ "$BEATEN" = 1 ]; then LIMIT=$TTL; else LIMIT=$FIRST_CONTACT; fi',
        "  if [ $(( NOW - CHANGED )) -gt $(( LIMIT * 100 )) ]; then",
        '    logger -t skyward-watchdog "no heartbeat for ${LIMIT}s: powering off"',
        *fire,
        "  fi",
        ('  if [ "$MAX_LIFETIME" -gt 0 ] && '
         '[ $(( NOW - STARTED )) -gt $(( MAX_LIFETIME * 100 )) ]; then'),
        '    logger -t skyward-watchdog "max lifetime ${MAX_LIFETIME}s reached: powering off"',
        *fire,
        "  fi",
        '  if [ "$BUDGET_END" -ge 0 ] && [ "$NOW" -ge "$BUDGET_END" ]; then',
        '    logger -t skyward-watchdog "the pool\'s budget is spent: powering off"',
        *fire,
        "  fi",
        "done",
    ]
    return "\n".join(lines) + "\n"


def _watchdog_unit() -> str:
    return "\n".join([
        "[Unit]",
        "Description=skyward_iac dead-man switch (powers off when the client goes silent)",
        "After=network-online.target",
        "",
        "[Service]",
        f"ExecStart={WATCHDOG_PATH}",
        "Restart=always",
        "RestartSec=5",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def cloud_config(node: NodeUserData) -> str:
    """The ``#cloud-config`` user data for one node (JSON is valid YAML, so no YAML writer)."""
    files = [
        # Ubuntu's GCE guest agent can regenerate host keys after boot; keep the pinned one.
        {"path": "/etc/default/instance_configs.cfg", "permissions": "0644",
         "content": "[InstanceSetup]\nset_host_keys = false\n"},
    ]
    runcmd: list[list[str]] = []
    if node.ttl > 0:
        files += [
            {"path": WATCHDOG_PATH, "permissions": "0755",
             "content": watchdog_script(node.ttl, node.max_lifetime, before_stop=(
                 gce_self_delete() if node.self_delete else ""))},
            {"path": f"/etc/systemd/system/{WATCHDOG_UNIT}", "permissions": "0644",
             "content": _watchdog_unit()},
        ]
        runcmd += [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", WATCHDOG_UNIT]]
    document = {
        # Host keys: only the stack's, installed before sshd first starts.
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {
            "ed25519_private": node.host_private_key,
            "ed25519_public": node.host_public_key,
        },
        "ssh_pwauth": False,
        "disable_root": True,
        "users": [
            "default",
            {"name": SSH_USER, "homedir": WORKDIR, "shell": "/bin/bash",
             "sudo": "ALL=(ALL) NOPASSWD:ALL", "lock_passwd": True,
             "ssh_authorized_keys": [node.authorized_key]},
        ],
        "write_files": files,
        "runcmd": runcmd,
    }
    return "#cloud-config\n" + json.dumps(document, indent=1) + "\n"
