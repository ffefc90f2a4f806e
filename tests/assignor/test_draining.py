"""A draining server (`hotstate server remove`) gets nothing, and every partition keeps its standbys.

The controller drains a server by leaving it out of the servers it gives the assignor while its replicas
are still in the previous assignment and its lags are still reported (it keeps its data until the moves
are done). Property: from any settled assignment, with one or more servers drained one after another,
every assignment places nothing on a drained server and gives every partition min(asked, servers left - 1
- its active's warmups) standbys, the rule test_lost_standbys holds for lost servers.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotstate.assignor import Assignment

from .test_lost_standbys import Cluster, Scenario, check, scenarios


class DrainingCluster(Cluster):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.drained: set[str] = set()

    def drain(self, server: str) -> None:
        # Unlike a lost server, a draining one keeps its data (its progress stays) until it holds nothing.
        self.drained.add(server)
        self.live = [x for x in self.live if x.id != server]

    def step(self) -> Assignment:
        # The controller keeps a drained server's copies (reported caught up) until the new ones are in
        # sync: here, for ever, the harder case.
        kept = {k: v for k, v in self.progress.items() if k[1] in self.drained}
        out = super().step()
        for pid, pa in out.partitions.items():
            assert not set(pa.replicas()) & self.drained, f"{pid} placed on draining {self.drained}: {pa}"
        self.progress.update(kept)
        return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_a_draining_server_gets_nothing_and_every_partition_keeps_its_standbys(
    scenario: Scenario, data: st.DataObject
) -> None:
    cluster = DrainingCluster(scenario)
    for _ in range(3):
        cluster.step()
    ids = [s.id for s in scenario.servers]
    drained = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids) - 1, unique=True))
    for server in drained:
        cluster.drain(server)
        for _ in range(data.draw(st.integers(1, 3))):
            cluster.step()
    # Settled: every partition has its standbys on the servers left, none on the drained ones.
    out = cluster.step()
    check(cluster, out, cluster.lags())
