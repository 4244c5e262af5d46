"""``PoolIdentity``: which stack and run a pool's parts speak for.

One object per set of parts (``parts.py``), built from the settled plan and shared by
reference by every part that names the pool in an event, a log line or a thread: the
dispatcher and its task events, the node events and every node start, the reconciler, the
heartbeat, the budget guard and the collections tunnel. None keeps a copy of the stack's name,
so none can name another stack than the rest (the lease renewer, in ``infra/``, is given the
settled name); a pool that adopts a warm pool's stack settles that first and builds its parts for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PoolIdentity:
    """The stack a pool runs in and the id of this run (its collections and
    ``instance_info().job_id``: a warm pool's stack outlives its runs)."""

    stack: str
    run_id: str = ""
