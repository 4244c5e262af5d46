"""What ``skyward-iac`` says when the world fails it: an engine error about the state backend
(``cli_commands/failures.py``), and a reader that closes the pipe (``offers --json | head``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from skyward_iac.cli_commands.failures import engine_failure

ROOT = Path(__file__).resolve().parents[2]
BACKEND = "s3://team-state?region=eu-west-1"
REFUSED = ('error: read ".pulumi/meta.yaml": blob (key ".pulumi/meta.yaml") (code=Unknown): '
           "operation error S3: GetObject, exceeded maximum number of attempts, 3, https "
           'response error StatusCode: 0, request send failed, Get "http://10.0.0.5:9000/team-'
           'state/.pulumi/meta.yaml?x-id=GetObject": dial tcp 10.0.0.5:9000: connect: '
           "connection refused")


def test_an_unreachable_backend_is_named_with_its_cause_and_the_next_step() -> None:
    message = engine_failure(f"\n code: 1\n stdout: \n stderr: {REFUSED}\n", BACKEND)
    assert message.startswith(f"the state backend {BACKEND} cannot be reached (dial tcp "
                              "10.0.0.5:9000: connect: connection refused)")
    assert "run the command again" in message


def test_refused_credentials_and_a_missing_bucket_say_so() -> None:
    denied = engine_failure('error: read ".pulumi/meta.yaml": blob: api error AccessDenied: '
                            "Access Denied", BACKEND)
    assert "refused this machine's credentials" in denied and "AWS_PROFILE" in denied
    missing = engine_failure('error: blob (key ".pulumi/meta.yaml"): NoSuchBucket: The '
                             "specified bucket does not exist", BACKEND)
    assert "does not exist" in missing


def test_other_engine_errors_are_passed_on_briefly() -> None:
    message = engine_failure("error: resource node-0 failed: connection refused by sshd", BACKEND)
    assert message == ("the Pulumi engine failed: error: resource node-0 failed: connection "
                       "refused by sshd")  # not about the backend: no backend advice


def test_a_closed_pipe_ends_the_listing_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write fails
    done = subprocess.run([sys.executable, "-m", "skyward_iac.cli", "offers", "--json"],
                          stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 1
