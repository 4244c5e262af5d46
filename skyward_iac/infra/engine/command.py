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
* A Ctrl+C while the engine is being started (``Popen`` waits for its exec, tens of ms under
  load) is held back until the wait above applies its policy: raised there, it left the
  engine running unwatched with its pipes closed, to die by SIGPIPE holding the stack's lock.

``cancel(stack)`` does what a first Ctrl+C does to every such command running on a stack, from
any thread: a spent budget stops the ``up`` under way rather than wait for it
(``orchestration/budget.py``).

A command that writes the state backend is not started without room for it, and a failed
run is classified (both in ``engine_failures``) before the SDK's own ``create_command_error``:
a lost race on the tags file runs again; a full disk raises ``OutOfSpaceError`` naming the
path and the space; a broken state file (``unexpected end of JSON input``, which names none)
is mended by ``state_repair`` (or, too young to judge, most often a file a live engine is
writing, waited for) and the command runs again, up to ``ATTEMPTS`` in all, as
``api/retry.ENGINE_COMMAND`` says (its delays jittered: the race is with another process).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from types import FrameType
from typing import IO, Any

from pulumi.automation import CommandResult, PulumiCommand
from pulumi.automation._cmd import (
    _SKIP_VERSION_CHECK_VAR,
    OnOutput,
    _parse_and_validate_pulumi_version,
)
from pulumi.automation._minimum_version import _MINIMUM_VERSION
from pulumi.automation.errors import create_command_error

from skyward_iac.api import retry
from skyward_iac.infra.engine.failures import (
    TAGS_FILE_RACE,
    Failure,
    backend_dir,
    broken_state_hint,
    classify,
    lacking_room,
    no_room_error,
    stack_of,
)
from skyward_iac.infra.engine.state_repair import SETTLE_SMALL, mend

__all__ = ["ATTEMPTS", "TAGS_FILE_RACE", "EngineCommand", "cancel", "interrupt_policy",
           "stopped_on_purpose"]

log = logging.getLogger("skyward")


def interrupt_policy(args: list[str]) -> str:
    """What a Ctrl+C does to the engine running ``args``: ``"wait"`` (never signal it: a
    destroy) or ``"cancel"`` (send it SIGINT)."""
    return "wait" if "destroy" in args else "cancel"


#: How many times a command that lost the tags race, or read a broken state file, is run.
ATTEMPTS = retry.ENGINE_COMMAND.attempts or 1
#: A state file being written is given more time than the tags race: the same policy from
#: ``SETTLE_SMALL``, the age below which a file is too young to judge, so without jitter (a
#: wait shorter than that would find it still too young).
_SETTLE = replace(retry.ENGINE_COMMAND, delay=SETTLE_SMALL, jitter=0.0)

#: The commands running now that a Ctrl+C cancels (not a destroy), and the stack of each.
_cancellable: dict[subprocess.Popen[str], str | None] = {}
_cancellable_lock = threading.Lock()


#: The stacks whose commands ``cancel`` stopped on purpose, and why: their failures are
#: expected, so the pool says why once instead of relaying the engine's errors.
_stopped_on_purpose: dict[str, str] = {}


def cancel(stack: str, why: str = "asked to stop") -> int:
    """Ask every command running on ``stack`` but a destroy to stop, as a first Ctrl+C does
    (one SIGINT: the engine's graceful cancel; the command then fails in its own thread); how
    many were asked. ``stopped_on_purpose(stack)`` says ``why`` from now on."""
    with _cancellable_lock:
        _stopped_on_purpose[stack] = why
        running = [process for process, name in _cancellable.items() if name == stack]
    for process in running:
        log.warning("stack %s: asking the engine to stop (SIGINT)", stack)
        try:
            os.killpg(process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    return len(running)


def stopped_on_purpose(stack: str) -> str | None:
    """Why ``cancel`` stopped ``stack``'s commands, or None if it never did."""
    with _cancellable_lock:
        return _stopped_on_purpose.get(stack)


class EngineCommand(PulumiCommand):
    """A ``PulumiCommand`` whose commands run in their own session (see the module doc)."""

    def __init__(self, root: str, version: str | None = None) -> None:
        """The engine under ``root``. Given its ``version`` (as ``locate.find_engine`` read it),
        the SDK's check of it is made on that, not on another ``pulumi version`` run (a Go
        start, 0.2-0.3 CPU-s per client process)."""
        if version is None:
            super().__init__(root=root)
            return
        self.command = os.path.join(root, "bin", "pulumi")
        self.version = _parse_and_validate_pulumi_version(
            min_version=_MINIMUM_VERSION, current_version=version,
            opt_out=os.getenv(_SKIP_VERSION_CHECK_VAR) is not None,
        )

    def run(self, args: list[str], cwd: str, additional_env: Mapping[str, str],
            on_output: OnOutput | None = None,
            on_error: OnOutput | None = None) -> CommandResult:
        """Run the CLI with ``args`` (as the SDK's ``run`` does, in its own session). A run
        that lost the tags-file race is run again, up to ``ATTEMPTS``, as is one that read a
        broken state file, once the backend is mended or the file's writer had time; one that
        found no room raises ``OutOfSpaceError`` (``classify``)."""
        if "--non-interactive" not in args:
            args.insert(0, "--non-interactive")
        if short := lacking_room(args, additional_env):
            raise short
        for attempt in range(1, ATTEMPTS + 1):
            result = self._run_once(args, cwd, additional_env, on_output, on_error)
            failure = classify(result)
            if attempt == ATTEMPTS:
                break
            if failure is Failure.TAGS_RACE:
                log.info("pulumi %s read the stack's tags while they were being written; "
                         "running it again", args[1] if len(args) > 1 else "")
                time.sleep(retry.ENGINE_COMMAND.delay_before(attempt + 1))
                continue
            if failure is Failure.BROKEN_STATE:
                # The engine read a broken file before doing anything. Mend what has settled;
                # a file too young to judge is most often one a live engine is writing (a
                # sidecar is written in place), so give it time. Either way, run again.
                if not _mend_backend(additional_env):
                    log.info("pulumi %s read a state file being written; running it again",
                             args[1] if len(args) > 1 else "")
                    time.sleep(_SETTLE.delay_before(attempt + 1))
                continue
            break
        if failure is Failure.NO_ROOM:
            raise no_room_error(result, args, cwd, additional_env)
        if failure is Failure.BROKEN_STATE:
            result = CommandResult(stdout=result.stdout, code=result.code,
                                   stderr=result.stderr + broken_state_hint(additional_env))
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
        policy = interrupt_policy(args)
        held = _HeldInterrupt()  # until _wait applies the policy to it: see the module doc
        try:
            process = subprocess.Popen([self.command, *args], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, cwd=cwd, env=env,
                                       encoding="utf-8", start_new_session=True)
            readers = [threading.Thread(target=_consume, daemon=True,
                                        args=(process.stdout, on_output, stdout)),
                       threading.Thread(target=_consume, daemon=True,
                                        args=(process.stderr, on_error, stderr))]
            for reader in readers:
                reader.start()
        except BaseException:
            held.release()
            raise
        if policy == "cancel":
            with _cancellable_lock:
                _cancellable[process] = stack_of(args)
        try:
            interrupted = _wait(process, policy, held)
        finally:
            with _cancellable_lock:
                _cancellable.pop(process, None)
        for reader in readers:
            reader.join()
        result = CommandResult(stdout="\n".join(stdout), stderr="\n".join(stderr),
                               code=process.returncode)
        if interrupted is not None:
            if policy == "wait":  # the command ran to its end: say how it ended
                interrupted.completed = result  # type: ignore[attr-defined]
            raise interrupted
        return result


def _mend_backend(env: Mapping[str, str]) -> bool:
    """Repair the file backend of ``env``; whether anything was mended. Raises the
    ``OutOfSpaceError`` of a repair that lacked the room to restore a checkpoint."""
    backend = backend_dir(env)
    outcomes = mend(backend) if backend is not None else []
    if lacking := next((outcome.no_room for outcome in outcomes if outcome.no_room), None):
        raise lacking
    return any(outcome.mended for outcome in outcomes)


def completed(interrupt: KeyboardInterrupt) -> CommandResult | None:
    """How a command that a Ctrl+C let run to its end (a destroy) ended, or None."""
    return getattr(interrupt, "completed", None)


class _HeldInterrupt:
    """Holds back a Ctrl+C (in the main thread, the only one it lands in) from now until
    ``release``, which raises it then, as the handler it replaced would have."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._caught: list[FrameType | None] = []
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is not None:  # None: set outside Python
            self._previous = signal.signal(signal.SIGINT, self._hold)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._caught.append(frame)

    def release(self) -> None:
        """Put the handler back; a Ctrl+C held meanwhile is handled by it now."""
        previous, self._previous = self._previous, None
        if previous is None:
            return
        signal.signal(signal.SIGINT, previous)
        if not self._caught:
            return
        if callable(previous):
            previous(signal.SIGINT, self._caught[0])  # Python's own: raises KeyboardInterrupt
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


def _wait(process: subprocess.Popen[str], policy: str,
          held: _HeldInterrupt | None = None) -> KeyboardInterrupt | None:
    """Wait for the engine to exit, applying ``policy`` to every Ctrl+C (one ``held`` while
    it started included); returns the first interrupt to raise afterwards."""
    interrupted: KeyboardInterrupt | None = None
    while True:
        try:
            if held is not None:
                release, held = held.release, None
                release()
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
