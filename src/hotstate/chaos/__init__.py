"""Chaos testing against real processes: a cluster of hosts in Linux network namespaces (netns), a seeded
nemesis (nemesis), a recording workload (workload) and a checker (checker); run by `python -m hotstate.chaos`
(run) and tests/chaos. docs/chaos.md."""
