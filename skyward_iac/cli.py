"""skyward-iac: inspect the engine and the stacks skyward_iac keeps, list offers, preview a pool."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence

from skyward_iac import __version__
from skyward_iac.api.errors import SkywardError, StackNotFoundError
from skyward_iac.cli_commands import live, paths

#: The module of ``cli_commands`` that adds each command, and the function that adds them. A
#: command imports its own module only: all of them cost two seconds of imports (the engine's
#: API, pydantic's models, Fabric) that ``history``, ``cost`` or ``ls`` never use. Help for the
#: whole CLI, or a command not listed here, builds the full parser
#: (tests/unit/test_cli_startup.py checks the table against it).
MODULES = {"offers": "add_parser", "preview": "add_parser", "lifecycle": "add_commands",
           "cost": "add_parser", "live": "add_commands", "debug": "add_commands",
           "policy": "add_commands"}
COMMANDS = {"version": "", "show": "", "offers": "offers", "preview": "preview", "plan": "preview", "apply": "preview",
            "gc": "lifecycle", "history": "lifecycle", "cost": "cost", "ls": "live",
            "down": "live", "logs": "live", "ssh": "debug", "forward": "debug", "cp": "debug",
            "policy": "policy"}


def _version(args: argparse.Namespace) -> int:
    from skyward_iac.infra.engine import locate as engine

    found = engine.find_engine()
    if args.json:
        print(json.dumps({"skyward_iac": __version__, "pulumi": found.version,
                          "engine": str(found.binary)}))
    else:
        print(f"skyward_iac {__version__}\npulumi {found.version} ({found.binary})")
    return 0


def _show(args: argparse.Namespace) -> int:
    from skyward_iac.infra.stacks import access
    from skyward_iac.infra.stacks.stack import ClusterStack

    stack = ClusterStack.select(args.stack)
    updates = stack.history()
    tags = stack.tags()
    report = {
        "stack": args.stack,
        "tags": {k: v for k, v in tags.items() if not k.startswith(access.ACCESS)},
        "access": access.listing(tags),
        "resources": stack.resource_count(),
        "updates": [
            {"version": u.version, "kind": u.kind, "result": u.result,
             "start": u.start_time.isoformat(), "end": u.end_time.isoformat() if u.end_time else None,
             "changes": u.resource_changes or {}}
            for u in updates
        ],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"stack {args.stack}: {report['resources']} resource(s) now")
    for key, value in sorted(report["tags"].items()):
        print(f"  {key:<11} {value}")
    print("updates (newest first):")
    for u in report["updates"]:
        changes = ", ".join(f"{k} {v}" for k, v in u["changes"].items()) or "no changes"
        print(f"  #{u['version']:<3} {u['kind']:<8} {u['result']:<10} {u['start']}  {changes}")
    if report["access"]:
        print("access: ssh, forward, cp (newest first):")
        for entry in report["access"]:
            print(f"  {entry['at']}  {entry['by']}  {entry['action']}")
    return 0


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser, one sub-command per action (with ``only``, a module of
    ``MODULES``: that module's commands, beside ``version`` and ``show``; "": just those)."""
    root = argparse.ArgumentParser(prog="skyward-iac", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    version = commands.add_parser("version", help="versions of skyward_iac and its Pulumi engine")
    version.add_argument("--json", action="store_true", help="machine-readable output")
    version.set_defaults(run=_version)
    show = commands.add_parser("show", help="a stack's tags, resources and update history")
    show.add_argument("stack", help="stack name, as printed when the pool started")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=_show)
    for name, adds in MODULES.items():
        if only is None or name == only:
            module = importlib.import_module(f"skyward_iac.cli_commands.{name}")
            getattr(module, adds)(commands)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``skyward-iac``.

    Exit codes (docs/operations.md): 0 success, 1 error, 2 usage error (argparse's own),
    3 no such stack, 4 refused (``down`` of a stack whose owner still runs).
    """
    paths.absolute_environment()  # before anything reads them or starts a child process
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in words if not word.startswith("-")), None)
    args = parser(COMMANDS.get(command or "")).parse_args(words)
    try:
        return int(args.run(args))
    except StackNotFoundError as exc:
        print(f"skyward-iac: {exc}", file=sys.stderr)
        return live.NOT_FOUND
    except SkywardError as exc:
        print(f"skyward-iac: {exc}", file=sys.stderr)
        return live.ERROR
    except BrokenPipeError:
        # The reader went away (`skyward-iac offers --json | head`): stop quietly, and point
        # stdout at /dev/null so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return live.ERROR
    except OSError as exc:  # a file named on the command line that cannot be written or read
        print(f"skyward-iac: {exc}", file=sys.stderr)
        return live.ERROR
    except Exception as exc:
        if (message := _engine_failure(exc)) is None:
            raise
        print(f"skyward-iac: {message}", file=sys.stderr)
        return live.ERROR


def _engine_failure(exc: Exception) -> str | None:
    """What to say of an engine command's failure (None for any other exception)."""
    from pulumi.automation.errors import CommandError

    from skyward_iac.cli_commands.failures import engine_failure
    from skyward_iac.infra.stacks import home

    if not isinstance(exc, CommandError):
        return None
    return engine_failure(str(exc), home.backend_url())


if __name__ == "__main__":
    sys.exit(main())
