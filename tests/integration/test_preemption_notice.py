"""A cloud preemption notice on a real Local pool: the node's agent watches a stand-in metadata
server (``SKYWARD_PREEMPTION``/``SKYWARD_METADATA_URL``, as a cloud node's agent watches the real
one), and the pool replaces the node before it dies while work goes on."""

from __future__ import annotations

import skyward_iac as sky
from tests.fake_metadata import SPOT_ACTION, FakeMetadataServer
from tests.workload import repeatedly, wait_for


@sky.function
def cube(x: int) -> int:
    return x * x * x


def test_a_spot_notice_gets_the_node_replaced_early() -> None:
    metadata = FakeMetadataServer()
    events: list[sky.Event] = []
    image = sky.Image(env={"SKYWARD_PREEMPTION": "aws", "SKYWARD_METADATA_URL": metadata.url})
    options = sky.Options(default_compute_timeout=60, console=False)
    try:
        with sky.Compute(provider=sky.Local(), nodes=2, image=image, options=options,
                         on_event=events.append) as pool:
            assert wait_for(lambda: any(path == SPOT_ACTION for _, path in metadata.requests),
                            30), "no agent polled the metadata server"
            assert not [e for e in events if isinstance(e, sky.InstancePreempted)]
            addresses = {n.address.index: n.address.public_address for n in pool.nodes}

            with repeatedly(lambda: pool.map(cube, range(6))) as results:
                metadata.announce()
                assert wait_for(lambda: any(isinstance(e, sky.InstanceReplaced) for e in events),
                                180), "the noticed node was never replaced"

            preempted = [e for e in events if isinstance(e, sky.InstancePreempted)]
            assert len(preempted) == 1
            assert "AWS spot interruption notice (terminate)" in preempted[0].reason
            replaced = [e for e in events if isinstance(e, sky.InstanceReplaced)]
            assert [(e.node, e.old_instance_id) for e in replaced] == [
                (preempted[0].node, addresses[preempted[0].node])]
            assert results and all(r == [x ** 3 for x in range(6)] for r in results)
            assert pool.current_nodes() == 2
            assert pool.map(cube, range(8)) == [x ** 3 for x in range(8)]
    finally:
        metadata.close()
