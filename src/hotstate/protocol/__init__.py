"""What travels between hotstate processes, importable by clients without the server.

- `wire.MESSAGES`: the one registry (type id <-> message class) of the RPC codec, for servers and clients.
- `cluster`: the DescribeCluster messages.
- `http_api`: what HTTP query clients and servers agree on (the default query timeout, error codes).
- `replica_state`: `ReplicaState`, a replica's state in lag reports and query answers.
- `keys`, `rows`: the key encoding and partitioner, and the row and record codec, which writers, servers
  and the Spark sink all use, and the key of a Produce entry (row or tombstone).

The message classes themselves live beside the cores that speak them (raft/messages.py,
replica/messages.py, controller/requests.py): they are those packages' public wire API, which a client
imports as a server does; this package only gathers them under their wire ids.
"""
