"""The node's side of spot/preemptible interruptions: watch the cloud's metadata server.

AWS announces a spot interruption about two minutes ahead at
``/latest/meta-data/spot/instance-action`` (IMDSv2: a session token from ``PUT
/latest/api/token`` first; 404 while nothing is planned). GCP flips
``/computeMetadata/v1/instance/preempted`` to ``TRUE`` about 30 seconds ahead (a hanging GET
with ``?wait_for_change=true`` returns when it changes). On a notice the agent tells its
clients (``messages.PreemptionNotice``), so the pool stops sending work there and starts the
replacement while the node still runs. Standard library only: it runs inside the agent.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from typing import Literal

log = logging.getLogger("skyward.agent")

Cloud = Literal["aws", "gcp"]
METADATA_URLS: dict[str, str] = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
}
#: Seconds of warning each cloud gives (used when the notice names no time).
WARNING_SECONDS = {"aws": 120.0, "gcp": 30.0}
#: Seconds between AWS polls (AWS recommends every 5 seconds).
AWS_POLL = 5.0
TOKEN_TTL = 21600
REQUEST_TIMEOUT = 2.0
#: GCP's hanging GET returns at the latest after this many seconds with the same value.
GCP_WAIT = 60


def aws_notice(body: bytes, now: float) -> tuple[float, str]:
    """The epoch second AWS will act and what it will do, from an instance-action document
    (``{"action": "terminate", "time": "2026-11-22T08:22:00Z"}``); a document that cannot be
    read still counts as a notice, with AWS's usual two minutes."""
    try:
        document = json.loads(body)
        action = str(document.get("action", "terminate"))
        deadline = datetime.fromisoformat(document["time"].replace("Z", "+00:00")).timestamp()
    except (ValueError, KeyError, TypeError, AttributeError):
        return now + WARNING_SECONDS["aws"], "AWS spot interruption notice"
    return deadline, f"AWS spot interruption notice ({action})"


class PreemptionWatcher:
    """A daemon thread calling ``on_notice(deadline, reason)`` once, when ``cloud`` announces
    this instance's interruption. ``base_url`` points elsewhere than the real metadata server
    (a test's stand-in)."""

    def __init__(self, cloud: Cloud, on_notice: Callable[[float, str], object],
                 base_url: str | None = None, poll: float = AWS_POLL) -> None:
        if cloud not in METADATA_URLS:
            raise ValueError(f"no preemption notices for {cloud!r}; known: {sorted(METADATA_URLS)}")
        self.cloud = cloud
        # The client names the metadata service in the bootstrap (``--preemption``, from the
        # provider spec's ``preemption_notice``); this side only knows how to ask each one.
        self._check = {"aws": self._check_aws, "gcp": self._check_gcp}[cloud]
        self.base_url = (base_url or METADATA_URLS[cloud]).rstrip("/")
        self.on_notice = on_notice
        self.poll = poll
        self._stopped = threading.Event()
        self._token: str | None = None
        self._thread = threading.Thread(target=self._run, name="preemption-watcher", daemon=True)

    def start(self) -> PreemptionWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                notice = self._check()
            except OSError as exc:  # metadata server unreachable for a moment: try again
                log.debug("preemption check failed: %s", exc)
                notice = None
            if notice is not None:
                log.warning("%s announced the preemption of this node: %s", self.cloud, notice[1])
                self.on_notice(*notice)
                return
            self._stopped.wait(self.poll)

    def _check_aws(self) -> tuple[float, str] | None:
        if self._token is None:
            request = urllib.request.Request(
                f"{self.base_url}/latest/api/token", method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                self._token = response.read().decode().strip()
        request = urllib.request.Request(
            f"{self.base_url}/latest/meta-data/spot/instance-action",
            headers={"X-aws-ec2-metadata-token": self._token})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                self._token = None  # expired: fetch a new one next time
            if exc.code in (401, 404):
                return None
            raise
        return aws_notice(body, time.time())

    def _check_gcp(self) -> tuple[float, str] | None:
        request = urllib.request.Request(
            f"{self.base_url}/computeMetadata/v1/instance/preempted"
            f"?wait_for_change=true&timeout_sec={GCP_WAIT}",
            headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=GCP_WAIT + REQUEST_TIMEOUT) as response:
            preempted = response.read().decode().strip().upper() == "TRUE"
        if preempted:
            return time.time() + WARNING_SECONDS["gcp"], "GCP preemption notice"
        return None
