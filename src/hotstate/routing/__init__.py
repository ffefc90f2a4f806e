"""Pull-query routing: failure detection, the global lag table, and the choice of replica (KLIP-12)."""
