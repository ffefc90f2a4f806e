"""Metadata records, the metadata image every server replays them into, and the quorum controller."""
