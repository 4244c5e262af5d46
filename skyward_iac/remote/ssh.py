"""SSH to nodes with Fabric: pinned host keys, TCP_NODELAY, timeouts, tunnels to the agent."""

from __future__ import annotations

import base64
import io
import logging
import socket
import time
from typing import Any

import fabric
import paramiko

from skyward_iac.api import retry
from skyward_iac.api.errors import HostKeyMismatchError, NodeConnectionError
from skyward_iac.outputs import NodeAddress

#: Preferred first when the server offers them: AES-GCM is an AEAD cipher, so paramiko skips
#: the separate HMAC pass over every packet (bulk transfers ~1.5x faster than aes128-ctr).
FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
#: Channel receive window and packet size asked of the server for the agent tunnel: results of
#: many megabytes flow without waiting for window adjustments every 2 MiB.
TUNNEL_WINDOW = 16 << 20
TUNNEL_MAX_PACKET = 32768
#: How long SSH attempts to a cloud node retry at least: from "instance running" to sshd
#: accepting the stack's key (cloud-init writes it) takes tens of seconds, sometimes minutes.
CLOUD_BOOT_WAIT = 300.0
log = logging.getLogger("skyward")


def fast_transport(*args: Any, **kwargs: Any) -> paramiko.Transport:
    """A paramiko ``Transport`` that prefers AES-GCM, falling back to its usual order."""
    transport = paramiko.Transport(*args, **kwargs)
    options = transport.get_security_options()
    usual = tuple(options.ciphers)
    options.ciphers = (tuple(c for c in FAST_CIPHERS if c in usual)
                       + tuple(c for c in usual if c not in FAST_CIPHERS))
    return transport


class DeadlineRemote(fabric.runners.Remote):
    """Fabric's remote runner, whose ``run(timeout=...)`` says it timed out whenever its
    timer killed the command. invoke decides that from the timer thread having ended, and a
    run can return while that thread is still closing the channel: the command then looked
    like one that exited with -1. Here the kill records it first, and a channel the caller
    closed meanwhile is no error of the timer's."""

    deadline_passed = False

    def kill(self) -> None:
        self.deadline_passed = True
        try:
            super().kill()
        except (EOFError, OSError):
            pass  # the connection closed first: the command is gone either way

    @property
    def timed_out(self) -> bool:
        return self.deadline_passed


def known_hosts_name(address: str, port: int) -> str:
    """How OpenSSH and paramiko name a host in known_hosts."""
    return address if port == 22 else f"[{address}]:{port}"


def connect(node: NodeAddress, private_key_pem: str, timeout: float, wait: float | None = None,
            retry_interval: float = 1.0) -> fabric.Connection:
    """Open an SSH connection that trusts only the node's pinned host key.

    Fabric installs AutoAddPolicy, which would accept any key on first contact; it is replaced
    by RejectPolicy, and the only known host key is the one from the stack outputs.

    A node that is still booting (nothing listening yet, sshd starting, the authorized key not
    yet written by cloud-init) is retried every ``retry_interval`` seconds for ``wait`` seconds
    (default ``timeout``: ``api/retry.for_ssh_connect``); each attempt and every later channel
    wait at most ``timeout``. A host key other than the pinned one is never retried.
    """
    policy = retry.for_ssh_connect(retry_interval, timeout if wait is None else wait)
    started = time.monotonic()
    deadline = started + (timeout if wait is None else wait)
    pkey = paramiko.Ed25519Key.from_private_key(io.StringIO(private_key_pem))
    where = f"node {node.index} ({node.ssh_user}@{node.public_address}:{node.ssh_port})"
    attempts = 0
    while True:
        attempts += 1
        attempt_timeout = max(1.0, min(timeout, deadline - time.monotonic()))
        conn = _pinned_connection(node, pkey, attempt_timeout, timeout)
        try:
            conn.open()
            break
        except paramiko.BadHostKeyException as exc:
            conn.close()
            raise HostKeyMismatchError(
                f"{where} presented host key {exc.key.get_fingerprint().hex()} but the stack "
                f"pinned {exc.expected_key.get_fingerprint().hex()}: refusing to connect"
            ) from None
        except paramiko.SSHException as exc:
            conn.close()
            if "not found in known_hosts" in str(exc):
                raise HostKeyMismatchError(
                    f"{where} presented a host key other than the one pinned in the stack "
                    "outputs; refusing to connect"
                ) from None
            error: Exception = exc
        except (OSError, EOFError) as exc:
            conn.close()
            error = exc
        delay = policy.again(error, attempts, time.monotonic() - started)
        if delay is None:
            raise NodeConnectionError(
                f"SSH to {where} failed after {attempts} attempt(s) in "
                f"{time.monotonic() - started:.0f}s: {str(error) or type(error).__name__} "
                "(raise Options.ssh_timeout if the node boots "
                "slowly)"
            ) from error
        log.debug("SSH to %s: %s; retrying in %.1fs", where, error, delay)
        time.sleep(delay)
    transport = conn.transport
    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport.set_keepalive(15)
    return conn


def _pinned_connection(node: NodeAddress, pkey: paramiko.PKey, connect_timeout: float,
                       timeout: float) -> fabric.Connection:
    config = fabric.Config(overrides={"load_ssh_configs": False,
                                      "runners": {"remote": DeadlineRemote}})
    conn = fabric.Connection(
        host=node.public_address, port=node.ssh_port, user=node.ssh_user, config=config,
        connect_timeout=int(connect_timeout),
        connect_kwargs={
            "pkey": pkey, "look_for_keys": False, "allow_agent": False,
            "banner_timeout": timeout, "auth_timeout": timeout, "channel_timeout": timeout,
            "transport_factory": fast_transport,
        },
    )
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    key_type, key_data = node.host_key.split()[:2]
    pinned = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_data))
    conn.client.get_host_keys().add(known_hosts_name(node.public_address, node.ssh_port),
                                    key_type, pinned)
    return conn


def open_tunnel(conn: fabric.Connection, port: int, timeout: float) -> paramiko.Channel:
    """A direct-tcpip channel to ``127.0.0.1:port`` on the node (the agent)."""
    channel = conn.transport.open_channel(
        "direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout,
        window_size=TUNNEL_WINDOW, max_packet_size=TUNNEL_MAX_PACKET,
    )
    return channel
