"""The rich console of a real 1-node Local pool, read through a pseudo-terminal."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from tests.unit.test_console import ANSI, Pty

SCRIPT = textwrap.dedent("""
    import time
    import skyward_iac as sky

    @sky.function
    def double(x):
        print(f"hello from the task, x={x}")
        time.sleep(2.0)
        return x * 2

    image = sky.Image(metrics=[sky.metrics.CPU(interval=0.5), sky.metrics.Memory(interval=0.5)])
    with sky.Compute(provider=sky.Local(), nodes=1, image=image,
                     options=sky.Options(console="rich")) as pool:
        print("RESULT", double(21) >> pool, flush=True)
    print("SCRIPT DONE", flush=True)
""")


def test_rich_console_shows_a_real_pool_from_provisioning_to_destroy(tmp_path: Path) -> None:
    script = tmp_path / "pool.py"
    script.write_text(SCRIPT)
    child = Pty([str(script)])
    child.reader.timeout = 180
    # Each expect consumes output up to its match, so the order is asserted too.
    child.expect(r"stack local-[^\n]*: requesting 1 node\(s\) on local")
    child.expect(r"pulumi up[^\n]*━[^\n]*(\d+/\d+ resources|done:)")  # engine progress bar
    provisioning = child.before
    child.expect(r"node 0[^\n]*━[^\n]*(launching|provisioned|bootstrap)")  # node progress
    child.expect(r"ready: 1 node\(s\) in [\d.]+s")
    child.expect(r"RESULT 42")
    running = child.before  # while the task slept on the node, in whatever order they came:
    assert re.search(r"tasks[^\n]*1 running", running)                  # the task count,
    assert re.search(r"node 0[^\n]*ready[^\n]*cpu \d+% mem \d+%", running)  # live metrics,
    assert "hello from the task, x=21" in running                        # its output
    child.expect(r"destroyed in [\d.]+s")
    child.expect("SCRIPT DONE")
    transcript = child.before
    assert child.finish() == 0
    assert "\x1b[" in provisioning, "a terminal gets a redrawn, colored view"
    assert not re.search(r"Traceback", ANSI.sub("", transcript))
