"""The HTTP API of a server: the query endpoints and every door to them, tables, auth, limits, metrics."""
