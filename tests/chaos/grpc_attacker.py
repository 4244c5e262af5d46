"""Another local user's calls on our loopback gRPC servers (for test_local_servers).

Usage: python grpc_attacker.py PORTS_FILE PROGRAM_DIR. Watches PORTS_FILE, one port a line,
until a line says ``end``; on each new port it tries what an attacker would: a
``LanguageRuntime.Run`` of the program in PROGRAM_DIR (whose ``__main__.py`` leaves a marker),
pointed at a resource monitor of the attacker's own; a forged engine event on
``Events.StreamEvents``; a ``ResourceMonitor.SupportsFeature`` (the call before registering
resources in someone's stack); a forged ``Engine.Log`` line. Prints ``PORT CALL REFUSED <code>`` or ``PORT CALL ACCEPTED`` for each.
"""

import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import (
    engine_pb2,
    engine_pb2_grpc,
    events_pb2,
    events_pb2_grpc,
    language_pb2,
    language_pb2_grpc,
    resource_pb2,
    resource_pb2_grpc,
)

FORGED_EVENT = ('{"sequence": 1, "timestamp": 1, "diagnosticEvent": '
                '{"severity": "error", "message": "forged by another user"}}')


class Monitor(resource_pb2_grpc.ResourceMonitorServicer):
    """The attacker's resource monitor: enough for a program to start running."""

    def SupportsFeature(self, request, context):
        return resource_pb2.SupportsFeatureResponse(hasSupport=False)


class Engine(engine_pb2_grpc.EngineServicer):
    """The attacker's engine: takes the program's log lines."""

    def Log(self, request, context):
        return empty_pb2.Empty()


def monitor() -> str:
    """Start the attacker's monitor and engine; their address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    resource_pb2_grpc.add_ResourceMonitorServicer_to_server(Monitor(), server)
    engine_pb2_grpc.add_EngineServicer_to_server(Engine(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    MONITORS.append(server)
    return f"127.0.0.1:{port}"


MONITORS: list[grpc.Server] = []
#: The attacker's monitor address, started once before it says READY.
MONITOR: list[str] = []


def run(channel: grpc.Channel, program: str) -> None:
    address = MONITOR[0]
    stub = language_pb2_grpc.LanguageRuntimeStub(channel)
    # A language host takes the engine's address from a handshake: point it at ours.
    stub.Handshake(language_pb2.LanguageHandshakeRequest(engine_address=address), timeout=20)
    request = language_pb2.RunRequest(
        project="skyward", stack="x", pwd=program, program=".", monitor_address=address,
        info=language_pb2.ProgramInfo(root_directory=program, program_directory=program,
                                      entry_point="."))
    stub.Run(request, timeout=20)


def events(channel: grpc.Channel, program: str) -> None:
    event = events_pb2.EventRequest(event=FORGED_EVENT)
    events_pb2_grpc.EventsStub(channel).StreamEvents(iter([event]), timeout=20)


def monitor_call(channel: grpc.Channel, program: str) -> None:
    resource_pb2_grpc.ResourceMonitorStub(channel).SupportsFeature(
        resource_pb2.SupportsFeatureRequest(id="secrets"), timeout=20)


def log(channel: grpc.Channel, program: str) -> None:
    engine_pb2_grpc.EngineStub(channel).Log(
        engine_pb2.LogRequest(severity=engine_pb2.ERROR, message="forged by another user"),
        timeout=20)


def attack(port: int, program: str) -> None:
    for call in (run, events, monitor_call, log):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                call(channel, program)
            except grpc.RpcError as exc:
                print(f"{port} {call.__name__.removesuffix('_call')} REFUSED {exc.code().name}", flush=True)
                continue
        print(f"{port} {call.__name__.removesuffix('_call')} ACCEPTED", flush=True)


def main() -> None:
    ports_file, program = Path(sys.argv[1]), sys.argv[2]
    MONITOR.append(monitor())
    print("READY", flush=True)  # imports done: the servers it attacks may live a second only
    seen: set[str] = set()
    attacks: list[threading.Thread] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        lines = ports_file.read_text().split()
        for line in lines:
            if line.isdigit() and line not in seen:
                seen.add(line)
                attacks.append(threading.Thread(target=attack, args=(int(line), program)))
                attacks[-1].start()
        if "end" in lines:
            break
        time.sleep(0.002)
    for thread in attacks:
        thread.join()


if __name__ == "__main__":
    main()
