"""``EngineCommand``: how every Pulumi CLI command of ours runs, and how Ctrl+C reaches it.

The Automation API starts the CLI in the caller's process group, so a Ctrl+C in the terminal
hits the engine directly, in the middle of whatever it writes: one in ten interrupted destroys
left a 0-byte ``<stack>.json.attrs`` after which the stack could not be read any more. Here
the engine runs in a session of its own, out of the terminal's reach, and our code decides:

* Ctrl+C during ``destroy``: the engine is never signalled; the destroy goes on to the end
  (said once in the log), then the ``KeyboardInterrupt`` is raised.
* Ctrl+C during anything else (``up``, ``refresh``, ``preview``...): the engine gets one
  SIGINT, its own graceful cancel; a second Ctrl+C forwards a second one (the engine's hard
  stop). We wait for it to exit, then raise.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import IO

from pulumi.automation import CommandResult, PulumiCommand
from pulumi.automation._cmd import OnOutput
from pulumi.automation.errors import create_command_error

log = logging.getLogger("skyward")


def interrupt_policy(args: list[str]) -> str:
    """What a Ctrl+C does to the engine running ``args``: ``"wait"`` (never signal it: a
    destroy) or ``"cancel"`` (send it SIGINT)."""
    return "wait" if "destroy" in args else "cancel"


#: What the engine says when it read a stack's tags file while another command (a lease
#: renewal, say) was rewriting it; nothing was done yet, so the command is simply run again.
TAGS_FILE_RACE = "failed to read stack tags file"
#: How many times a command that lost that race is run in all.
ATTEMPTS = 3


def lost_tags_race(result: CommandResult) -> bool:
    """Whether ``result`` failed only because the stack's tags file was being rewritten."""
    return result.code != 0 and TAGS_FILE_RACE in result.stderr


class EngineCommand(PulumiCommand):
    """A ``PulumiCommand`` whose commands run in their own session (see the module doc)."""

    def run(self, args: list[str], cwd: str, additional_env: Mapping[str, str],
            on_output: OnOutput | None = None,
            on_error: OnOutput | None = None) -> CommandResult:
        """Run the CLI with ``args`` (as the SDK's ``run`` does, in its own session); a run
        that lost the tags-file race (``TAGS_FILE_RACE``) is run again, up to ``ATTEMPTS``."""
        if "--non-interactive" not in args:
            args.insert(0, "--non-interactive")
        for attempt in range(1, ATTEMPTS + 1):
            result = self._run_once(args, cwd, additional_env, on_output, on_error)
            if not lost_tags_race(result) or attempt == ATTEMPTS:
                break
            log.info("pulumi %s read the stack's tags while they were being written; "
                     "running it again", args[1] if len(args) > 1 else "")
            time.sleep(0.1 * attempt)
        if result.code != 0:
            raise create_command_error(result)
        return result

    def _run_once(self, args: list[str], cwd: str, additional_env: Mapping[str, str],
                  on_output: OnOutput | None, on_error: OnOutput | None) -> CommandResult:
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        engine_dir = os.path.dirname(self.command)
        env["PATH"] = os.pathsep.join([engine_dir, env.get("PATH", "")])
        stdout: list[str] = []
        stderr: list[str] = []
        process = subprocess.Popen([self.command, *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, cwd=cwd, env=env, encoding="utf-8",
                                   start_new_session=True)
        readers = [threading.Thread(target=_consume, args=(process.stdout, on_output, stdout),
                                    daemon=True),
                   threading.Thread(target=_consume, args=(process.stderr, on_error, stderr),
                                    daemon=True)]
        for reader in readers:
            reader.start()
        interrupted = _wait(process, interrupt_policy(args))
        for reader in readers:
            reader.join()
        if interrupted is not None:
            raise interrupted
        return CommandResult(stdout="\n".join(stdout), stderr="\n".join(stderr),
                             code=process.returncode)


def _wait(process: subprocess.Popen[str], policy: str) -> KeyboardInterrupt | None:
    """Wait for the engine to exit, applying ``policy`` to every Ctrl+C; returns the first
    interrupt to raise afterwards."""
    interrupted: KeyboardInterrupt | None = None
    while True:
        try:
            process.wait()
            return interrupted
        except KeyboardInterrupt as exc:
            first = interrupted is None
            interrupted = interrupted or exc
            if policy == "wait":
                if first:
                    log.warning("Ctrl+C: the destroy under way goes on to the end, so the stack "
                                "stays readable; it takes a few seconds")
                continue
            log.warning("Ctrl+C: asking the engine to stop (SIGINT)")
            try:
                os.killpg(process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass


def _consume(stream: IO[str] | None, callback: OnOutput | None, lines: list[str]) -> None:
    if stream is None:
        return
    for line in iter(stream.readline, ""):
        stripped = line.rstrip()
        if callback is not None:
            callback(stripped)
        lines.append(stripped)
    stream.close()
