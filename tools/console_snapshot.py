"""Draw docs/images/console.svg: the rich console of a real 2-node Local pool, mid-run.

Run: ``.venv/bin/python tools/console_snapshot.py [OUT.svg]``. The pool is real (Pulumi
stack, sshd, agents, metrics); the console's permanent lines and its live view, taken while
tasks run and metrics stream, are recorded with rich's ``Console(record=True)`` and saved as
SVG. The pool is destroyed afterwards.
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

from rich.console import Console as Terminal

import skyward_iac as sky
from skyward_iac.observability.console_rich import RichConsole

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 118


@sky.function
def train(shard: int) -> float:
    """Burn some CPU so the node rows show load."""
    deadline, total = time.monotonic() + 3.0, 0.0
    while time.monotonic() < deadline:
        total += sum(i * i for i in range(10_000))
    return total / (shard + 1)


def main(out: Path) -> None:
    picture = Terminal(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True,
                       color_system="truecolor")
    console = RichConsole(io.StringIO())
    console.terminal = picture  # milestone lines go to the picture; the view is drawn below
    image = sky.Image(metrics=(sky.metrics.CPU(interval=0.5), sky.metrics.Memory(interval=0.5)))
    with sky.Compute(provider=sky.Local(), nodes=2, image=image,
                     options=sky.Options(console="silent"),
                     on_event=console.handle, on_output=lambda *_: None) as pool:
        futures = [train(shard) > pool for shard in range(6)]
        time.sleep(2.0)  # tasks running, a few metric samples in
        # What a terminal shows now: the milestone lines so far, the live view under them.
        picture.print(console.renderable())
        console.terminal = Terminal(file=io.StringIO())  # later lines are not in the picture
        for future in futures:
            future.result()
    picture.save_svg(str(out), title="skyward-iac: a 2-node Local pool")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images" / "console.svg")
