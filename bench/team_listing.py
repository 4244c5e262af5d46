"""Team scale: ``skyward-iac history``, ``ls`` and ``cost`` over many recorded runs, on a shared
S3 backend (moto's server on loopback, KMS secrets) beside the file backend, in one run.

One real run is recorded through the engine (a Local pool: 1 node, a call, a resize to 2,
closed); its objects are then copied under new names (``tests/state_clones.py``) until each
backend holds N runs, and each command runs as a user runs it: a new ``python -m
skyward_iac.cli`` process, timed from start to exit. On S3, "first" is the team's first look
(no machine's cache, none shared in the backend: every object read), "cold" a new machine's
first look once the team's summaries are shared (its own cache removed), "warm" any later one.

    .venv/bin/python bench/team_listing.py [--runs 100 250 500 1000] [--json FILE]

About 10 minutes on 2 idle cores (copying 10,000 objects into moto is most of it).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3

import skyward_iac as sky
from skyward_iac.infra.engine import locate as engine
from tests.s3_server import s3_server, team_state_env
from tests.state_clones import (
    clones,
    put_files,
    put_s3,
    s3_objects,
    template_objects,
)

BUCKET = "team-bench"
#: The team's shared summaries of the runs (``state_s3.SHARED``).
SHARED = ".skyward/listings/skyward.json.gz"


@sky.function
def answer() -> int:
    return 42


def record_template() -> str:
    """One real run in the backend in force; its stack's name."""
    with sky.Compute(provider=sky.Local(usd_per_hour=0.5), nodes=1,
                     options=sky.Options(console=False, gc_on_start=False,
                                         tags={"team": "bench"})) as pool:
        assert (answer() >> pool) == 42
        pool.resize(2)
        return pool.stack_name


def cpu_of(pid: int | None) -> float:
    """CPU seconds (user + system) ``pid`` used so far; 0 without one."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def recorded(client: Any, saved: Path | None) -> tuple[str, dict[str, bytes]]:
    """The template run's name and the backend's objects: recorded now through a real pool,
    or read back from ``saved`` (a file an earlier run wrote) and put in the bucket."""
    if saved is not None and saved.is_file():
        data = json.loads(saved.read_text())
        objects = {k: base64.b64decode(v) for k, v in data["objects"].items()}
        put_s3(client, BUCKET, objects)
        return data["name"], objects
    started = time.monotonic()
    name = record_template()
    print(f"template run {name} recorded in {time.monotonic() - started:.0f}s", flush=True)
    objects = s3_objects(client, BUCKET)
    if saved is not None:
        saved.write_text(json.dumps({"name": name, "objects": {
            k: base64.b64encode(v).decode() for k, v in objects.items()}}))
    return name, objects


def timed(env: dict[str, str], server: int | None, *command: str) -> tuple[dict[str, float],
                                                                            Any]:
    """``skyward-iac COMMAND`` as a new process: its wall seconds, its CPU seconds, the S3
    server's CPU seconds meanwhile, the machine's load; and its JSON output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    served, started = cpu_of(server), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "skyward_iac.cli", *command], env=env,
                          capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{command}: {done.stderr[-2000:]}")
    return {"wall": round(wall, 3),
            "cpu": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3),
            "server_cpu": round(cpu_of(server) - served, 3),
            "load": os.getloadavg()[0]}, json.loads(done.stdout)


def measure(env: dict[str, str], runs: int, cache: Path | None,
            server: int | None = None, client: Any = None) -> dict[str, dict[str, float]]:
    """The commands' figures over ``runs`` runs; ``cache`` (S3): removed first for "first"
    (with the team's shared summaries, through ``client``) and for "cold"."""
    figures: dict[str, dict[str, float]] = {}
    limit = ("--limit", str(runs + 10))
    figures["startup"], _ = timed(env, None, "cost", "--json", "--since", "2099-01")
    if cache is not None:
        client.delete_object(Bucket=BUCKET, Key=SHARED)
        cache.unlink(missing_ok=True)
        figures["history first"], listed = timed(env, server, "history", "--json", *limit)
        assert len(listed) == runs, (len(listed), runs)
        client.head_object(Bucket=BUCKET, Key=SHARED)  # the first look shared its summaries
        cache.unlink(missing_ok=True)
        figures["history cold"], listed = timed(env, server, "history", "--json", *limit)
        assert len(listed) == runs, (len(listed), runs)
    figures["history"], listed = timed(env, server, "history", "--json", *limit)
    assert len(listed) == runs, (len(listed), runs)
    figures["ls"], _ = timed(env, server, "ls", "--json")
    figures["cost"], report = timed(env, server, "cost", "--json", "--by", "month")
    assert report["total"]["runs"] == runs, report["total"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[100, 250, 500, 1000])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--template", type=Path,
                        help="reuse (or save) the recorded run's objects in this file")
    args = parser.parse_args()
    os.environ["SKYWARD_PULUMI_ROOT"] = str(engine.find_engine().root)
    work = Path(tempfile.mkdtemp(prefix="skyward-team-bench-"))
    results: list[dict[str, Any]] = []
    try:
        with s3_server() as server:
            state = team_state_env(server, BUCKET)
            s3_home, file_home = work / "s3-home", work / "file-home"
            os.environ.update({**state, "SKYWARD_HOME": str(s3_home)})
            client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                  aws_access_key_id=server.access_key,
                                  aws_secret_access_key=server.secret_key)
            name, objects = recorded(client, args.template)
            template = template_objects(objects, name)
            file_state = work / "file-state"
            put_files(file_state, {k: v for k, v in objects.items()
                                   if k.startswith(".pulumi/") and not k.startswith(
                                       (".pulumi/locks/", ".pulumi/backups/"))})
            # Bytecode as an installed package has it (pip compiles it; this machine's
            # environment may say not to write it: then every start compiles botocore anew).
            s3_env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                      "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(work / "pycache")}
            file_env = {**s3_env, "SKYWARD_HOME": str(file_home),
                        "SKYWARD_BACKEND_URL": f"file://{file_state}"}
            have = 1
            for runs in sorted(args.runs):
                started = time.monotonic()
                made = dict(clones(template, name, runs - have))
                put_s3(client, BUCKET, {k: v for o in made.values() for k, v in o.items()})
                put_files(file_state, {k: v for o in made.values() for k, v in o.items()})
                have = runs
                print(f"{runs} runs in both backends ({time.monotonic() - started:.0f}s to "
                      "copy)", flush=True)
                row = {"runs": runs,
                       "file": measure(file_env, runs, None),
                       "s3": measure(s3_env, runs, s3_home / "cache" / _cache_name(state),
                                     server.pid, client)}
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def _cache_name(state: dict[str, str]) -> str:
    from skyward_iac.infra.stacks.records import cache_file

    return cache_file(state["SKYWARD_BACKEND_URL"]).name


def print_table(results: list[dict[str, Any]]) -> None:
    """Wall seconds (CPU seconds of the command + of the S3 server) per command and size."""
    columns = [("file", "history"), ("file", "ls"), ("file", "cost"), ("s3", "history first"),
               ("s3", "history cold"),
               ("s3", "history"), ("s3", "ls"), ("s3", "cost")]
    print("\nwall s (CPU s of the command + of the S3 server); startup: the command's fixed "
          "cost (a cost report of no run)")
    print("| runs | startup | " + " | ".join(f"{'S3' if b == 's3' else b}: {c}"
                                            for b, c in columns) + " | load |")
    print("| ---: " * (len(columns) + 3) + "|")
    for row in results:
        cells = [_cell(row["file"]["startup"])]
        cells += [_cell(row[backend][command]) for backend, command in columns]
        print(f"| {row['runs']:,} | " + " | ".join(cells)
              + f" | {row['s3']['history']['load']:.1f} |")
    print("\nS3 startup (the command's fixed cost, its first look at the runs): "
          + ", ".join(f"{row['runs']:,} runs {_cell(row['s3']['startup'])}" for row in results))


def _cell(figure: dict[str, float]) -> str:
    server = f" + {figure['server_cpu']:.1f}" if figure["server_cpu"] else ""
    return f"{figure['wall']:.2f} ({figure['cpu']:.1f}{server})"


if __name__ == "__main__":
    main()
