"""Another local user's attempt on a running dynamic-provider process (for test_engine_safety).

Usage: python provider_attacker.py PORT_FILE MARKER. Once its imports are done it writes
``PORT_FILE.ready`` (a provider lives only while its engine runs: the test starts the pool only
then), waits for PORT_FILE to name the provider's port, then sends it what an attacker would: a ``Create`` whose ``__provider`` is a pickle that
touches MARKER when unpickled. Prints ``REFUSED <code>`` or ``ACCEPTED``.
"""

import base64
import os
import sys
import time

import dill
import grpc
from google.protobuf import struct_pb2
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - what the provider would run, unpickling it
        return (os.system, (f"touch {self.marker}",))


def main() -> None:
    port_file, marker = sys.argv[1], sys.argv[2]
    with open(port_file + ".ready", "w"):
        pass
    deadline = time.monotonic() + 120
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if time.monotonic() > deadline:
            print("NO PORT")
            return
        time.sleep(0.005)
    port = int(open(port_file).read())
    properties = struct_pb2.Struct()
    properties.update({"__provider": base64.b64encode(dill.dumps(Payload(marker))).decode()})
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = provider_pb2_grpc.ResourceProviderStub(channel)
        try:
            stub.Create(provider_pb2.CreateRequest(
                urn="urn:pulumi:s::p::pulumi-python:dynamic:Resource::x", properties=properties),
                timeout=10)
        except grpc.RpcError as exc:
            print(f"REFUSED {exc.code().name}", flush=True)
            return
    print("ACCEPTED", flush=True)


if __name__ == "__main__":
    main()
