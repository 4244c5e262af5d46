"""``python -m skyward_iac.node ROLE [ARGS...]``: runs one of ``ROLES`` (node/__init__.py)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from skyward_iac.node import ROLES

USAGE = f"usage: python -m skyward_iac.node {{{','.join(ROLES)}}} [ARGS...]"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the role ``argv[0]`` with the rest; its ``main`` returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ROLES:
        print(USAGE, file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    status = importlib.import_module(ROLES[args[0]]).main(args[1:])
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
