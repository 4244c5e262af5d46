"""Pulumi engine events -> skyward events: the engine's output becomes progress, not a dump.

Pass an ``EngineEventTranslator`` as the ``on_event`` of ``stack.up/destroy/preview`` (the
Automation API calls it with ``pulumi.automation.EngineEvent`` objects, from its own thread).
Each resource step becomes a ``StackProgress``; resources named ``node-<i>`` (every stack
program names its instances so) also become ``InstanceLaunched``/``InstanceProvisioned``/
``InstanceReplaced``/``InstanceDestroyed``; error diagnostics become ``Error``; the summary
becomes ``StackUpdated``/``StackDestroyed``/``StackPreviewed``. The stack itself and provider
resources (types ``pulumi:*``) are left out of every count, as ``ClusterStack`` does.

Attributes are read by name, so this module imports nothing from Pulumi.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from skyward_iac.observability.events import (
    Error,
    Event,
    InstanceDestroyed,
    InstanceLaunched,
    InstanceProvisioned,
    InstanceReplaced,
    Log,
    StackDestroyed,
    StackOperation,
    StackPreviewed,
    StackProgress,
    StackUpdated,
)

# The SDK cannot parse the engine's cancel event and warns about it on stderr whenever an
# on_event callback is given; that line is noise in a console, so it is filtered here.
warnings.filterwarnings("ignore", message="Failed to parse engine event", category=UserWarning)

_NODE = re.compile(r"^node-(\d+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CREATES = ("create", "create-replacement")
_DELETES = ("delete", "delete-replaced")


def _op(metadata: Any) -> str:
    op = getattr(metadata, "op", "")
    return str(getattr(op, "value", op))


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


class EngineEventTranslator:
    """Callable ``on_event`` for one Pulumi operation on one stack; emits skyward events.

    ``total``: the number of resource steps expected (from a preview), for a bounded bar.
    """

    def __init__(self, stack: str, operation: StackOperation, emit: Callable[[Event], Any],
                 total: int | None = None) -> None:
        self.stack = stack
        self.operation = operation
        self.emit = emit
        self.total = total
        self.started = 0
        self.done = 0
        #: Steps per operation (failed ones left out), resources of type ``pulumi:*`` too.
        self.changes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._begun = time.monotonic()

    def __call__(self, event: Any) -> None:
        with self._lock:
            if (pre := getattr(event, "resource_pre_event", None)) is not None:
                self._step(pre.metadata, "started")
            elif (out := getattr(event, "res_outputs_event", None)) is not None:
                self._step(out.metadata, "completed")
            elif (failed := getattr(event, "res_op_failed_event", None)) is not None:
                self._step(failed.metadata, "failed")
            elif (diagnostic := getattr(event, "diagnostic_event", None)) is not None:
                self._diagnostic(diagnostic)
            elif (summary := getattr(event, "summary_event", None)) is not None:
                self._summary(summary)

    def _step(self, metadata: Any, status: str) -> None:
        kind: str = getattr(metadata, "type", "")
        if kind.startswith("pulumi:"):
            return
        op, urn = _op(metadata), getattr(metadata, "urn", "")
        name = _name(urn)
        # Counted when a step starts: components never report their outputs, and a
        # successful operation finishes every step it started.
        if status == "started":
            self.started += 1
            self.changes[op] = self.changes.get(op, 0) + 1
        else:
            self.done += 1
        if status == "failed":
            self.changes[op] = self.changes.get(op, 0) - 1
        self.emit(StackProgress(
            stack=self.stack, operation=self.operation, name=name, type=kind, op=op,
            status=status,  # type: ignore[arg-type]
            done=self.done, started=self.started, total=self.total,
        ))
        if self.operation != "preview" and (match := _NODE.match(name)):
            self._instance(int(match.group(1)), metadata, op, status)

    def _instance(self, node: int, metadata: Any, op: str, status: str) -> None:
        new, old = getattr(metadata, "new", None), getattr(metadata, "old", None)
        if status == "started" and op in _CREATES:
            self.emit(InstanceLaunched(stack=self.stack, node=node, instance_type=_input(
                new, "instanceType", "instance_type", "machineType")))
        elif status == "completed" and op == "create":
            self.emit(InstanceProvisioned(
                stack=self.stack, node=node, instance_id=str(getattr(new, "id", "") or ""),
                address=_output(new, "publicIp", "address", "public_address"),
            ))
        elif status == "completed" and op == "replace":
            self.emit(InstanceReplaced(
                stack=self.stack, node=node, old_instance_id=str(getattr(old, "id", "") or ""),
                instance_id=str(getattr(new, "id", "") or ""),
            ))
        elif status == "completed" and op in _DELETES:
            self.emit(InstanceDestroyed(stack=self.stack, node=node))

    def _diagnostic(self, diagnostic: Any) -> None:
        text = _ANSI.sub("", str(getattr(diagnostic, "message", ""))).strip()
        severity = str(getattr(diagnostic, "severity", ""))
        if not text or severity not in ("error", "warning", "info"):
            return  # debug chatter stays in the engine's own log
        urn = getattr(diagnostic, "urn", None) or ""
        where = f"{_name(urn)}: " if urn else ""
        if severity == "error":
            self.emit(Error(stack=self.stack, message=f"pulumi {self.operation}: {where}{text}"))
            return
        for line in text.splitlines():
            if line.strip():
                self.emit(Log(stack=self.stack, line=f"{where}{line}", stream="pulumi"))

    def _summary(self, summary: Any) -> None:
        duration = time.monotonic() - self._begun
        changes = {op: n for op, n in self.changes.items() if n > 0}
        if self.operation == "destroy":
            self.emit(StackDestroyed(stack=self.stack, deleted=changes.get("delete", 0),
                                     changes=changes, duration=duration))
        elif self.operation == "preview":
            # A preview's steps are planned, not performed; its counts are the engine's.
            planned = {str(getattr(k, "value", k)): int(v)
                       for k, v in (getattr(summary, "resource_changes", None) or {}).items()}
            planned = changes or planned
            self.emit(StackPreviewed(stack=self.stack, changes=planned, duration=duration))
        else:
            self.emit(StackUpdated(stack=self.stack, changes=changes, duration=duration))


def _input(state: Any, *keys: str) -> str | None:
    inputs = getattr(state, "inputs", None) or {}
    for key in keys:
        if isinstance(inputs.get(key), str):
            return str(inputs[key])
    return None


def _output(state: Any, *keys: str) -> str:
    outputs = getattr(state, "outputs", None) or {}
    for key in keys:
        if isinstance(outputs.get(key), str):
            return str(outputs[key])
    return ""
