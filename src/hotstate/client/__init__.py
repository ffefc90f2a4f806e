"""Clients of a hotstate cluster."""
