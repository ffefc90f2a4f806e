"""What travels between hotstate processes, importable by clients without the server.

- `wire.MESSAGES`: the one registry (type id <-> message class) of the RPC codec, for servers and clients.
- `cluster`: the DescribeCluster messages.

The message classes themselves live beside the cores that speak them (raft/messages.py,
replica/messages.py, controller/requests.py); this package only gathers them under their wire ids.
"""
