"""A stand-in for the AWS and GCP metadata servers, on loopback, for preemption tests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "fake-imds-token"
SPOT_ACTION = "/latest/meta-data/spot/instance-action"
GCP_PREEMPTED = "/computeMetadata/v1/instance/preempted"


class FakeMetadataServer:
    """Serves IMDSv2 (token, spot instance-action) and GCP's ``preempted`` flag.

    Nothing is announced until ``announce()``; then the next ``times`` reads of either endpoint
    carry the notice (a one-shot by default, so a replacement node is not preempted again).
    """

    def __init__(self, notice_time: str = "2030-01-01T00:00:00Z") -> None:
        self.notice_time = notice_time
        self.lock = threading.Lock()
        self.remaining = 0
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def announce(self, times: int = 1) -> None:
        with self.lock:
            self.remaining = times

    def _take_notice(self) -> bool:
        with self.lock:
            if self.remaining > 0:
                self.remaining -= 1
                return True
            return False

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _reply(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
                fake.requests.append(("PUT", self.path))
                if self.path == "/latest/api/token" and self.headers.get(
                        "X-aws-ec2-metadata-token-ttl-seconds"):
                    self._reply(200, TOKEN)
                else:
                    self._reply(400)

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(("GET", self.path))
                if self.path == SPOT_ACTION:
                    if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                        self._reply(401)
                    elif fake._take_notice():
                        self._reply(200, json.dumps({"action": "terminate",
                                                     "time": fake.notice_time}))
                    else:
                        self._reply(404)
                elif self.path.split("?")[0] == GCP_PREEMPTED:
                    if self.headers.get("Metadata-Flavor") != "Google":
                        self._reply(403)
                    else:
                        self._reply(200, "TRUE" if fake._take_notice() else "FALSE")
                else:
                    self._reply(404)

        return Handler
