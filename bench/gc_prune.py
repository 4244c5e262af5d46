"""gc's prune at team scale (issue 34 goal 6): RUNS empty runs (default 1,000) removed by
`skyward-iac gc --retention-days 1` on moto's S3 (KMS secrets) and on the file backend, engine
starts counted by an audit hook. The runs are copies of one real Local run
(tests/state_clones.py). Before: the engine's `stack rm` per stack (the direct removal given no
store) over SAMPLE stacks (default 20); after: the rest. Runs alone, about 7 minutes:
`.venv/bin/python bench/gc_prune.py`; see docs/benchmarks.md (gc's prune)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import boto3

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.engine import state_removal
from skyward_iac.infra.stacks import gc
from tests.s3_server import s3_server, team_state_env
from tests.state_clones import clones, put_files, put_s3, s3_objects, template_objects

TOTAL = int(os.environ.get("RUNS", "1000"))
SAMPLE = int(os.environ.get("SAMPLE", "20"))
started_programs: list[str] = []


def hook(event, args):
    if event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], list | tuple) else [str(args[1])]
        started_programs.append(os.path.basename(str(args[0] or (argv[0] if argv else ""))))


sys.addaudithook(hook)


@sky.function
def answer() -> int:
    return 42


def run(*command: str):
    started_programs.clear()
    out = io.StringIO()
    t = time.monotonic()
    with contextlib.redirect_stdout(out):
        code = main(list(command))
    took = time.monotonic() - t
    engines = [p for p in started_programs if "pulumi" in p]
    result = json.loads(out.getvalue()) if "--json" in command else out.getvalue()
    pruned = len([a for a in result if a["action"] == "pruned"]) if "--json" in command else 0
    print(f"$ skyward-iac {' '.join(command)}: exit {code}, {took:.2f}s, {pruned} pruned, "
          f"{len(engines)} engine starts, load {os.getloadavg()[0]:.1f}", flush=True)
    return result


def engine_prune(victims: list[str]) -> None:
    """The old path: gc's prune through the engine's `stack rm` (no direct store)."""
    saved = state_removal.store_for
    state_removal.store_for = lambda url: None
    try:
        started_programs.clear()
        t = time.monotonic()
        done = gc.collect(retention_days=1, only=victims)
        took = time.monotonic() - t
    finally:
        state_removal.store_for = saved
    print(f"before (engine stack rm), gc.collect only={len(victims)}: "
          f"{len([a for a in done if a.action == 'pruned'])} pruned, {took:.1f}s, "
          f"{len([p for p in started_programs if 'pulumi' in p])} engine starts, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def main_() -> None:
    from skyward_iac.infra.engine import locate

    os.environ["SKYWARD_PULUMI_ROOT"] = str(locate.find_engine().root)  # before the home moves
    scratch = Path(tempfile.mkdtemp(prefix="gc-prune-"))
    os.environ["SKYWARD_HOME"] = str(scratch / "home")
    with s3_server(timeout=120) as server:
        os.environ.update(team_state_env(server, "team-prune"))
        with sky.Compute(provider=sky.Local(usd_per_hour=0.5), nodes=1,
                         options=sky.Options(console=False, gc_on_start=False)) as pool:
            assert (answer() >> pool) == 42
            name = pool.stack_name
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id=server.access_key,
                              aws_secret_access_key=server.secret_key)
        everything = s3_objects(client, "team-prune")
        template = template_objects(everything, name)
        made = dict(clones(template, name, TOTAL))
        objects = {k: v for o in made.values() for k, v in o.items()}
        names = sorted(made)
        print(f"--- S3 (moto, KMS): {TOTAL} empty runs, {len(template)} objects each", flush=True)
        put_s3(client, "team-prune", objects)
        run("gc", "--dry-run", "--retention-days", "1", "--json")
        engine_prune(names[:SAMPLE])
        run("gc", "--dry-run", "--retention-days", "1", "--json")
        run("gc", "--retention-days", "1", "--json")
        run("ls", "--json")
        left = [k for k in s3_objects(client, "team-prune") if any(n in k for n in names)]
        print(f"objects of the runs left in the bucket: {len(left)}", flush=True)

        state = scratch / "state"
        put_files(state, {".pulumi/meta.yaml": everything[".pulumi/meta.yaml"]})
        put_files(state, objects)
        os.environ["SKYWARD_BACKEND_URL"] = f"file://{state}"
        print(f"--- file backend: {TOTAL} empty runs", flush=True)
        run("gc", "--dry-run", "--retention-days", "1", "--json")
        engine_prune(names[:SAMPLE])
        run("gc", "--retention-days", "1", "--json")
        left = [p for p in (state / ".pulumi").rglob("*") if p.is_file()
                and any(n in str(p) for n in names)]
        print(f"files of the runs left: {len(left)}", flush=True)


if __name__ == "__main__":
    main_()
