"""TensorBoard on the head node, opened from this machine through ``pool.forward``.

A task writes training scalars and starts TensorBoard on node 0, listening on the node's
loopback only; ``pool.forward(port)`` gives a local port (on 127.0.0.1, serving you only) that
reaches it through the node's SSH connection. Where TensorBoard is not installed on the node
(add ``sky.Image(pip=["tensorboard", "torch"])`` for the real thing), the task serves a small
HTTP page instead, and says so, so the example runs anywhere.

From another terminal, ``skyward-iac forward STACK PORT`` does the same for a pool you did not
start (docs/guides/debugging.md).
"""

import sys
import time
import urllib.request

import skyward_iac as sky


@sky.function
def start_dashboard() -> tuple[int, int, str]:
    """Write a few scalars and start TensorBoard (or a small page) in a process of its own
    that outlives this task; (its pid, its port, what it serves)."""
    import importlib.util
    import socket
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    logdir = Path(tempfile.mkdtemp(prefix="runs-"))
    with socket.socket() as probe:  # a free port on the node's loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if importlib.util.find_spec("tensorboard") and importlib.util.find_spec("torch"):
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(logdir)) as writer:
            for step in range(100):
                writer.add_scalar("loss", 1 / (step + 1), step)
        command = ["-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                   "--port", str(port)]
        what = "TensorBoard"
    else:
        (logdir / "index.html").write_text(
            "<h1>TensorBoard is not installed on this node</h1>"
            "<p>sky.Image(pip=['tensorboard', 'torch']) installs it.</p>")
        command = ["-m", "http.server", str(port), "--bind", "127.0.0.1",
                   "--directory", str(logdir)]
        what = "a small page instead (tensorboard is not installed on the node)"
    server = subprocess.Popen([sys.executable, *command], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    return server.pid, port, what


@sky.function
def stop(pid: int) -> None:
    import os
    import signal

    os.kill(pid, signal.SIGTERM)


def fetch(url: str, timeout: float = 60) -> int:
    """The HTTP status of ``url``, retried while the server starts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return int(response.status)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


if __name__ == "__main__":
    with sky.Compute(provider=sky.Local(), nodes=2) as pool:
        pid, port, what = pool.run(start_dashboard(), target="head")
        print(f"node 0 serves {what} on its port {port}")
        with pool.forward(port) as local:
            url = f"http://127.0.0.1:{local}/"
            status = fetch(url)
            print(f"{url} -> HTTP {status}")
            if sys.stdin.isatty():
                input(f"open {url} in a browser; press Enter to end the pool ")
        pool.run(stop(pid), target="head")
        print(f"forwarded page reached: {status == 200}")
