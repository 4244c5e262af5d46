"""Every retry of a pool, one policy: how many attempts, which delay before each, which failures.

A loop that tries something again asks its ``RetryPolicy`` three things: may attempt ``n`` be
made (``allows``: within ``attempts`` and ``within`` seconds), how long to wait before it
(``delay_before``: one formula, ``delay * factor ** (n - 2)`` capped at ``cap``, with optional
jitter), and is this failure worth another attempt (``retryable``). The policies are built
here from the ``Options`` that bound them (the ``for_*`` functions), so the Options that bound
each retry are named in one place; docs/architecture.md ("Retries") lists every loop. A
sequence shared by several loops (a stack update's node fallback and capacity failover spend
one budget) is an ``Attempts``. Pure: no I/O, no clock; callers pass the elapsed time.

Why not tenacity: it wraps one call in a decorator, but our loops are not calls tried again --
the reconciler waits on an event that a resize wakes, node starts are scheduled at a
``retry_at`` the converge step reads, capacity failover changes the request between attempts --
so each loop keeps its own shape and takes only the numbers and the verdicts from here.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from skyward_iac.api.options import Options

#: Longest wait between two attempts of anything, unless a policy says otherwise.
MAX_DELAY = 60.0
#: Delay before the first retry of a stack update or node start when
#: ``Options(provision_retry_delay)`` is unset (doubling from there).
PROVISION_RETRY_DELAY = 2.0
#: Attempts of a node start, and stack updates of one provisioning sequence (zones, regions,
#: Specs), when ``Options(max_provision_attempts)`` is unset.
PROVISION_ATTEMPTS = 3


def any_exception(error: BaseException) -> bool:
    """Every ``Exception`` is worth another attempt (a ``KeyboardInterrupt`` never is)."""
    return isinstance(error, Exception)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one kind of operation is tried again (see the module doc)."""

    #: What is tried (for logs and docs), e.g. ``"node start"``.
    kind: str
    #: Most attempts in all, the first included (None: bounded by ``within`` only).
    attempts: int | None = None
    #: Most seconds from the first attempt's start to the last one's (None: no time bound).
    within: float | None = None
    #: Seconds before the second attempt; each later delay is ``factor`` times the one before
    #: (1: a fixed interval), at most ``cap``.
    delay: float = 0.0
    factor: float = 2.0
    cap: float = MAX_DELAY
    #: Each delay is spread by up to this fraction either way (0: none), so that processes
    #: that failed together do not try again together.
    jitter: float = 0.0
    #: Whether a failure is worth another attempt.
    retryable: Callable[[BaseException], bool] = field(default=any_exception, compare=False)

    def delay_before(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait before attempt ``attempt`` (1 is the first: no wait). ``draw``
        gives the jitter's number in [0, 1) (tests pass their own)."""
        if attempt <= 1 or self.delay <= 0:
            return 0.0
        base = min(self.cap, self.delay * self.factor ** (attempt - 2))
        if self.jitter:
            base *= 1 + self.jitter * (2 * draw() - 1)
        return max(0.0, min(self.cap, base))

    def allows(self, attempt: int, elapsed: float = 0.0) -> bool:
        """Whether attempt ``attempt`` may be made ``elapsed`` seconds after the first began
        (pass the elapsed time plus the delay before it)."""
        if self.attempts is not None and attempt > self.attempts:
            return False
        return self.within is None or attempt <= 1 or elapsed < self.within

    def again(self, error: BaseException, failed: int, elapsed: float = 0.0) -> float | None:
        """After attempt ``failed`` failed with ``error``, ``elapsed`` seconds after the first
        began: the delay before the next attempt, or None when there is to be none."""
        if not self.retryable(error):
            return None
        wait = self.delay_before(failed + 1)
        return wait if self.allows(failed + 1, elapsed + wait) else None


class Attempts:
    """One bounded sequence of attempts spent by more than one loop: a stack update's node
    fallback (a node to a sibling zone, on demand) and capacity failover (the pool to another
    zone, region or Spec) each spend one attempt per update they run again."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        #: Attempts made so far (the first counts: it is being made).
        self.made = 1
        #: Set when a loop wanted one more attempt and the limit refused it.
        self.cut_short = False

    def exhausted(self) -> bool:
        """Whether no attempt is left."""
        return self.limit is not None and self.made >= self.limit

    def spend(self) -> int | None:
        """Take the next attempt: its number, or None (and ``cut_short``) when none is left."""
        if self.exhausted():
            self.cut_short = True
            return None
        self.made += 1
        return self.made


# ---- the policies, from the Options that bound them -------------------------------------


def for_provision(options: Options) -> RetryPolicy:
    """The stack updates of one provisioning sequence: the first, then one per place tried
    (a node moved to a sibling zone or on demand, the pool to another zone, region or Spec),
    at most ``max_provision_attempts``, ``provision_retry_delay`` apart (none by default: a
    refusal names the place, so the next place is tried at once). Only a capacity, quota,
    price or offering refusal is retried (``infra/capacity/refusals.py`` decides)."""
    return RetryPolicy("place", attempts=options.max_provision_attempts or PROVISION_ATTEMPTS,
                       delay=options.provision_retry_delay or 0.0, factor=1.0)


def for_node_start(options: Options) -> RetryPolicy:
    """A node whose start failed (its instance, SSH, bootstrap) is recreated after a doubling
    delay from ``provision_retry_delay``, and given up after ``max_provision_attempts``
    failures in a row. No jitter: the nodes due together are recreated by one stack update."""
    return RetryPolicy("node start",
                       attempts=options.max_provision_attempts or PROVISION_ATTEMPTS,
                       delay=options.provision_retry_delay or PROVISION_RETRY_DELAY)


def for_converge(options: Options) -> RetryPolicy:
    """A failed converge step (a stack update of a running pool) is tried again for as long
    as the pool lives, a doubling delay from ``provision_retry_delay`` apart."""
    return RetryPolicy("converge step",
                       delay=options.provision_retry_delay or PROVISION_RETRY_DELAY)


def for_ssh_connect(interval: float, wait: float) -> RetryPolicy:
    """Reaching a node over SSH (``Options(ssh_retry_interval)`` apart, for ``wait`` seconds:
    ``ssh_timeout``, at least ``remote.ssh.CLOUD_BOOT_WAIT`` on a cloud node). ``remote/ssh.py``
    never retries a host key other than the pinned one."""
    return RetryPolicy("ssh connect", within=wait, delay=interval, factor=1.0)


def for_task(options: Options) -> RetryPolicy:
    """A task whose node was lost runs again at most ``retry_on_interruption`` times, at
    once (it is held until the lost node is fenced, which is its own wait)."""
    return RetryPolicy("task", attempts=1 + options.retry_on_interruption)


#: An engine command that lost the race on the stack's tags file, or read a state file being
#: written, runs again: 3 runs, 0.1 s then 0.2 s apart, spread by a quarter either way (the
#: race is with another process, which retries too).
ENGINE_COMMAND = RetryPolicy("engine command", attempts=3, delay=0.1, jitter=0.25)

#: A destroyer that finds the stack's lock held tries again every half second within its
#: patience (``for_stack_lock``).
LOCK_POLL = 0.5
#: The patience of a dead Jupyter kernel's reaper.
REAPER_PATIENCE = 120.0


def for_stack_lock(patience: float) -> RetryPolicy:
    """A destroy that found the stack locked by another update: tried again every
    ``LOCK_POLL`` seconds for ``patience`` seconds (the owner: ``Options(shutdown_timeout)``;
    the reaper: ``REAPER_PATIENCE``; gc and ``down``: none)."""
    return RetryPolicy("destroy of a locked stack", within=patience, delay=LOCK_POLL,
                       factor=1.0)
