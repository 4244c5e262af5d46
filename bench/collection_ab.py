"""Strong collections A/B: settings of the etcd client and server side by side with Dask, in
turns, so a burst of load from elsewhere hits every contender alike.

    .venv/bin/python bench/collection_ab.py [--kinds lock,queue,counter] [--seconds 12]
        [--window 0.2] [--client NAME=VAR=VALUE[,VAR=VALUE]]... [--etcd NAME=VAR=VALUE]...
        [--no-dask] [--unix] [--tree NAME=PATH]...

Each ``--etcd`` starts one more etcd (the launcher's own ``etcd_server.start``, mutual TLS,
``--unsafe-no-fsync``, the binary a Local pool's head runs: tools/etcd/build.sh's when built)
with extra environment, e.g. ``gomaxprocs1=GOMAXPROCS=1``; ``default``
is always there; ``SKYWARD_ETCD_BIN`` there picks another etcd binary (``etcd3.5=SKYWARD_ETCD_BIN=
/path/to/etcd``), and entries named ``--flag`` are etcd flags (``{port}``: a free port).
``--unix``: the default etcd also serves gRPC on its unix socket, as a Local pool's head does,
and one more contender (``etcd:default-unix``) uses it instead of TLS over loopback TCP. Each
``--client`` adds a client process with extra environment (e.g.
``eeoff=GRPC_EXPERIMENTS=-event_engine_client``) against the default etcd; each ``--tree``
one running another source tree's ``skyward_iac`` (before/after a change, in the same turns);
every etcd besides
the default gets a plain client. With Dask (the default) one more process drives
``distributed.Lock``/``Queue`` against a ``LocalCluster`` scheduler started here.

The contenders pass a token around a ring of pipes: each runs ``--window`` seconds of one kind,
then hands over, until ``--seconds`` of turns are spent. Prints per contender and kind the
operations per second over its turns, the client's CPU per operation and the server's (the
etcd process, or this process for Dask's scheduler) from /proc: CPU per operation barely moves
with others' load, the wall clock does. A lock operation is an acquire and a release, a queue
operation a put and a get (``get(timeout=5)``), a counter operation a strong increment;
``lock2`` is a lock contended by two processes at once (each contender starts a second one;
their pairs per second summed, their CPU per pair together), as figure 5's "lock, 2 nodes".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CONTENDER = r'''
import json, os, statistics, sys, time
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["root"])

def cpu(pid):
    """utime + stime of a process (all its threads), in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

if spec["kind"] == "dask":
    from distributed import Client, Lock, Queue
    client = Client(spec["scheduler"])
    lock, lock2, queue = Lock("ab-lock"), Lock("ab-lock2"), Queue("ab-queue")
    ops = {"lock": lambda: (lock.acquire(), lock.release()),
           "lock2": lambda: (lock2.acquire(), lock2.release()),
           "queue": lambda: (queue.put(1), queue.get(timeout=5))}
else:
    from skyward_iac.collections import BackendConfig, connect
    etcd = spec["etcd"]
    backend = connect(BackendConfig(endpoints=(etcd["endpoint"],), job_id=spec["name"],
                                    ca_pem=etcd["ca"], cert_pem=etcd["cert"], key_pem=etcd["key"]))
    lock, lock2 = backend.lock("ab-lock"), backend.lock("ab-lock2")
    queue = backend.queue("ab-queue")
    counter = backend.counter("ab-counter", consistency="strong")
    ops = {"lock": lambda: (lock.acquire(), lock.release()),
           "lock2": lambda: (lock2.acquire(), lock2.release()),
           "queue": lambda: (queue.put(1), queue.get(timeout=5)), "counter": counter.increment}

def run(op, window):
    """(operations, seconds, own CPU seconds) of ``window`` seconds of ``op`` in a loop."""
    own0, started, count = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() < started + window:
        op()
        count += 1
    return count, time.perf_counter() - started, time.process_time() - own0

if spec.get("partner"):  # the second process of "lock2": a window of it per line read
    for line in sys.stdin:
        print(json.dumps(run(ops["lock2"], float(line))), flush=True)
    sys.exit(0)
partner = None
if "lock2" in spec["kinds"]:
    import subprocess
    partner = subprocess.Popen([sys.executable, "-c", spec["script"],
                                json.dumps({**spec, "partner": True})],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
results = {}
for kind in spec["kinds"]:
    op = ops.get(kind)
    for _ in range(20 if op else 0):
        op()
    # [operations, seconds] of this process and of the partner; CPU of both, the server's
    done, others, own, server = [0.0, 0.0], [0.0, 0.0], 0.0, 0.0
    for _ in range(spec["turns"]):
        os.read(spec["token_in"], 1)
        if op is not None:
            server0 = cpu(spec["server_pid"])
            if kind == "lock2":  # both processes on one lock at once; pairs/s summed
                partner.stdin.write(f"{spec['window']}\n")
                partner.stdin.flush()
            count, elapsed, used = run(op, spec["window"])
            if kind == "lock2":
                other, other_elapsed, other_used = json.loads(partner.stdout.readline())
                others, own = [others[0] + other, others[1] + other_elapsed], own + other_used
            server += cpu(spec["server_pid"]) - server0
            done, own = [done[0] + count, done[1] + elapsed], own + used
        os.write(spec["token_out"], b".")
    if done[0]:
        rate = done[0] / done[1] + (others[0] / others[1] if others[1] else 0.0)
        total = done[0] + others[0]
        results[kind] = {"ops_s": rate, "client_ms": own / total * 1e3,
                         "server_ms": server / total * 1e3}
if partner is not None:
    partner.stdin.close()
    partner.wait(30)
print(json.dumps(results), flush=True)
'''


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def start_etcd(root: Path, env: dict[str, str], local_socket: bool = False) -> dict[str, Any]:
    """One etcd as a pool's head runs it, with ``env`` added to its environment (entries named
    ``--flag`` are added to its command line instead; ``{port}`` in them is a free port)."""
    from skyward_iac.collections import pki
    from skyward_iac.node import etcd_server
    from skyward_iac.orchestration.collections import built_etcd

    address = "127.0.0.1"
    bundle = pki.generate_cluster_certificates("ab", [address])
    etcd_server.write_certificates(root / "certs", bundle.server)
    flags = [f"{k}={v}".replace("{port}", str(_free_port(address)))
             for k, v in env.items() if k.startswith("--")]
    saved, command = dict(os.environ), etcd_server.etcd_command
    os.environ.update({k: v for k, v in env.items() if not k.startswith("--")})
    etcd_server.etcd_command = lambda *a, **k: command(*a, **k) + flags  # type: ignore[assignment]
    try:
        server = etcd_server.start(root / "data", listen=address, client_port=_free_port(address),
                                   peer_port=_free_port(address), certs_dir=root / "certs",
                                   built=built_etcd(), local_socket=local_socket)
    finally:
        etcd_server.etcd_command = command  # type: ignore[assignment]
        os.environ.clear()
        os.environ.update(saved)
    return {"endpoint": server.endpoint, "pid": server.pid, "data": str(root / "data"),
            "socket": f"unix:{root / 'data' / etcd_server.GRPC_SOCKET}",
            "ca": bundle.ca_pem, "cert": bundle.client_cert_pem, "key": bundle.client_key_pem}


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition("=")
    env = dict(pair.split("=", 1) for pair in assignments.split(",") if pair)
    return name, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="lock,queue,counter")
    parser.add_argument("--seconds", type=float, default=12.0, help="turns per kind, in total")
    parser.add_argument("--window", type=float, default=0.2, help="one turn, seconds")
    parser.add_argument("--client", action="append", default=[], type=_variant)
    parser.add_argument("--etcd", action="append", default=[], type=_variant)
    parser.add_argument("--no-dask", action="store_true")
    parser.add_argument("--unix", action="store_true",
                        help="also a contender on the default etcd's unix socket")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="also a contender running the skyward_iac of another source tree "
                             "(e.g. a `git archive` of an older commit) against the default "
                             "etcd (its unix socket with --unix)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    from skyward_iac.node import etcd_server

    temp = Path(tempfile.mkdtemp(prefix="collection-ab-"))
    etcds: dict[str, dict[str, Any]] = {}
    cluster = None
    processes: list[subprocess.Popen[str]] = []
    try:
        for name, env in [("default", {}), *args.etcd]:
            etcds[name] = start_etcd(temp / name, env, args.unix and name == "default")
        contenders: list[dict[str, Any]] = [
            {"name": f"etcd:{name}", "kind": "sky", "etcd": etcd, "server_pid": etcd["pid"],
             "env": {}} for name, etcd in etcds.items()]
        if args.unix:
            unix = {**etcds["default"], "endpoint": etcds["default"]["socket"]}
            contenders.insert(1, {"name": "etcd:default-unix", "kind": "sky", "etcd": unix,
                                  "server_pid": unix["pid"], "env": {}})
        contenders += [{"name": f"client:{name}", "kind": "sky", "etcd": etcds["default"],
                        "server_pid": etcds["default"]["pid"], "env": env}
                       for name, env in args.client]
        endpoint = etcds["default"]["socket"] if args.unix else etcds["default"]["endpoint"]
        contenders += [{"name": f"tree:{name}", "kind": "sky", "root": path,
                        "etcd": {**etcds["default"], "endpoint": endpoint},
                        "server_pid": etcds["default"]["pid"], "env": {}}
                       for name, path in (tree.split("=", 1) for tree in args.tree)]
        if not args.no_dask:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
            contenders.append({"name": "dask", "kind": "dask", "env": {}, "server_pid": os.getpid(),
                               "scheduler": cluster.scheduler_address})
        pipes = [os.pipe() for _ in contenders]  # contender i reads pipes[i], writes pipes[i + 1]
        for index, contender in enumerate(contenders):
            token_in, token_out = pipes[index][0], pipes[(index + 1) % len(pipes)][1]
            spec = {"root": str(ROOT), **contender, "kinds": kinds, "window": args.window,
                    "script": _CONTENDER,
                    "turns": max(1, round(args.seconds / args.window / len(contenders))),
                    "token_in": token_in, "token_out": token_out}
            processes.append(subprocess.Popen(
                [sys.executable, "-c", _CONTENDER, json.dumps(spec)], stdout=subprocess.PIPE,
                text=True, env={**os.environ, **contender["env"]}, pass_fds=(token_in, token_out)))
        time.sleep(5.0)  # every contender past its imports and connected before the first turn
        os.write(pipes[0][1], b".")
        load = os.getloadavg()[0]
        outputs = [process.communicate(timeout=600)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        if cluster is not None:
            cluster.close()
        for etcd in etcds.values():
            etcd_server.stop(Path(etcd["data"]))
        shutil.rmtree(temp, ignore_errors=True)
    results = {c["name"]: json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
               for c, out in zip(contenders, outputs)}
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}; {args.window:g} s turns")
    for kind in kinds:
        dask = results.get("dask", {}).get(kind, {}).get("ops_s")
        for name, result in results.items():
            if kind not in result:
                continue
            row = result[kind]
            versus = f"  {row['ops_s'] / dask:.2f}x Dask" if dask and name != "dask" else ""
            print(f"{kind:8} {name:22} {row['ops_s']:7.0f} ops/s  client {row['client_ms']:.3f} "
                  f"ms/op  server {row['server_ms']:.3f} ms/op{versus}")


if __name__ == "__main__":
    main()
