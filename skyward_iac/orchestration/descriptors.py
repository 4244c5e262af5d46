"""Room for a pool's connections in this process's descriptor limit.

A pool holds one socket per node (its agent connection), more while nodes start (SSH, SFTP), and
a default soft limit of 1,024 descriptors (``ulimit -n``) leaves a 1,000-node pool no room for
anything else. The soft limit is raised, never above the hard one, before nodes start; what the
hard limit cannot give is said once.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("skyward")

#: Descriptors a pool may hold per node at its peak (the agent's socket; SSH and SFTP while it
#: starts), and what the rest of the process needs beside them.
PER_NODE, RESERVE = 3, 256


def wanted(nodes: int) -> int:
    """Descriptors a process running a pool of up to ``nodes`` nodes should be allowed."""
    return RESERVE + PER_NODE * nodes


def raised_limit(soft: int, hard: int, need: int) -> int | None:
    """The soft limit to set for ``need`` descriptors (None: leave it), never above ``hard``."""
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    ceiling = need if hard == resource.RLIM_INFINITY else min(need, hard)
    return ceiling if ceiling > soft else None


def make_room(nodes: int) -> None:
    """Raise this process's soft descriptor limit for a pool of up to ``nodes`` nodes."""
    need = wanted(nodes)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = raised_limit(soft, hard, need)
    if new is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        log.info("open-file limit raised from %d to %d for up to %d node(s)", soft, new, nodes)
    if hard != resource.RLIM_INFINITY and hard < need:
        log.warning("a pool of up to %d node(s) may need %d open files; this process may open "
                    "%d (raise the hard limit: ulimit -Hn)", nodes, need, hard)
