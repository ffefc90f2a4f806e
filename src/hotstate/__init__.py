"""hotstate: highly available, queryable materialized tables for PySpark Structured Streaming."""

__version__ = "0.1.0"
