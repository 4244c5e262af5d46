"""The one exception tree users catch: every message says what went wrong and what to do."""

from __future__ import annotations

import os
from pathlib import Path


class SkywardError(Exception):
    """Base of every error skyward_iac raises on purpose."""


class ConfigError(SkywardError, ValueError):
    """A spec, option or argument is invalid; raised before anything is provisioned."""


class EngineNotFoundError(SkywardError):
    """No usable Pulumi engine was found; the message says how to install one."""


class ProvisionError(SkywardError):
    """The stack could not be brought up (the engine's own message is attached)."""


class BootstrapError(SkywardError):
    """A node could not be prepared: names the node, the step, its exit code and output tail."""


class HostKeyMismatchError(SkywardError):
    """A node presented an SSH host key other than the one pinned in the stack outputs."""


class NodeConnectionError(SkywardError):
    """The connection to a node's SSH server or agent failed or was lost."""


class BudgetExceededError(SkywardError):
    """A pool spent its ``Options(max_cost_usd)``: it was closed and its stack destroyed.

    Raised by the calls it had pending (and by ``sky.Compute`` when the budget ran out while
    the pool was starting). ``budget_usd`` is the budget, ``spent_usd`` what the pool had
    spent by the catalog's rates when it was stopped, ``usd_per_hour`` its rate then.
    """

    def __init__(self, message: str, *, budget_usd: float, spent_usd: float,
                 usd_per_hour: float) -> None:
        super().__init__(message)
        self.budget_usd = budget_usd
        self.spent_usd = spent_usd
        self.usd_per_hour = usd_per_hour

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments: copy and pickle need them spelled out.
        return (_budget_exceeded, (str(self), self.budget_usd, self.spent_usd,
                                   self.usd_per_hour))


def _budget_exceeded(message: str, budget_usd: float, spent_usd: float,
                     usd_per_hour: float) -> BudgetExceededError:
    return BudgetExceededError(message, budget_usd=budget_usd, spent_usd=spent_usd,
                               usd_per_hour=usd_per_hour)


class RemoteError(SkywardError):
    """A task raised an exception whose type could not be rebuilt on the client.

    ``type_name`` is the remote exception's qualified type; ``remote_traceback`` its traceback.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback


class NoActivePoolError(SkywardError, RuntimeError):
    """A dispatch targeted `sky` outside any `with sky.Compute(...)` block."""


class StackNotFoundError(SkywardError):
    """No stack of that name exists in the backend."""


class WorkerCrashedError(SkywardError):
    """The process running a task died (os._exit, a signal, out of memory); the node lives on."""


class CollectionError(SkywardError):
    """etcd refused or could not serve a collection operation; the message says why."""


class CollectionsDisabledError(SkywardError, RuntimeError):
    """Collections were asked for where they are off (``Options(cluster=False)``)."""


class StackBusyError(ProvisionError):
    """Another update holds the stack's lock (its owner, or another garbage collector)."""


class OutOfSpaceError(ProvisionError):
    """The engine (or the repair of its state) found no room to write: a full disk or quota.

    ``path`` is what could not be written, ``free`` the bytes free there when it was reported
    and ``needed`` roughly what the write needed (either None when unknown). Once space is
    back, ``skyward-iac gc`` and ``down`` mend what the failed write left in the state backend.
    """

    def __init__(self, message: str, *, path: os.PathLike[str] | str | None = None,
                 free: int | None = None, needed: int | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None
        self.free = free
        self.needed = needed


class StorageError(SkywardError):
    """An object-store operation failed; names the bucket, the key and the cause.

    ``bucket`` and ``key`` say what was asked for (``key`` is None for bucket-wide calls).
    """

    def __init__(self, message: str, *, bucket: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.key = key


class BucketNotFoundError(StorageError):
    """The bucket does not exist at that endpoint (or is not visible to these credentials)."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """No object has that key in the bucket; also a ``FileNotFoundError``."""


class StorageAccessDeniedError(StorageError, PermissionError):
    """The endpoint refused the credentials or the operation; also a ``PermissionError``."""


class PluginError(SkywardError):
    """A plugin's hook failed; the message names the plugin and the hook."""
