"""A command imports only its own module of ``cli_commands``: ``skyward-iac history`` and
``cost`` start without importing the engine's API, gRPC or Fabric (two seconds of CPU for every
listing, before anything was read)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from skyward_iac import cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_table_is_the_full_parsers() -> None:
    full = cli.parser()
    [commands] = [a for a in full._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(cli.COMMANDS)
    for command, module in cli.COMMANDS.items():
        alone = cli.parser(module)
        [sub] = [a for a in alone._actions if isinstance(a, argparse._SubParsersAction)]
        assert command in sub.choices, command


def test_a_listing_imports_neither_the_engine_nor_ssh(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / ".pulumi" / "stacks" / "skyward").mkdir(parents=True)
    (state / ".pulumi" / "meta.yaml").write_text("version: 1\n")
    probe = ("import sys, json, contextlib, io\n"
             "from skyward_iac.cli import main\n"
             "out = io.StringIO()\n"
             "with contextlib.redirect_stdout(out):\n"
             "    codes = [main(['history', '--json']), main(['cost', '--json'])]\n"
             "print(json.dumps({'codes': codes, 'modules': sorted(sys.modules)}))\n")
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT,
        check=False, env={"PATH": "/usr/bin:/bin", "SKYWARD_HOME": str(tmp_path / "home"),
                          "SKYWARD_BACKEND_URL": f"file://{state}", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["codes"] == [0, 0]
    heavy = [m for m in result["modules"]
             if m.split(".")[0] in ("pulumi", "grpc", "fabric", "paramiko")]
    assert not heavy, heavy[:10]
