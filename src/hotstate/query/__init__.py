"""Pull queries: SQL parsed into a `PullQuery`, planned against a table's key into lookups or a range."""
