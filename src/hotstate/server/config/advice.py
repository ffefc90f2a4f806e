"""What a valid configuration may still not mean: warnings, logged when the server starts."""

from __future__ import annotations

from hotstate.server.config.model import ServerConfig


def config_warnings(config: ServerConfig) -> list[str]:
    """Each warning about `config`, one line each."""
    warnings = []
    tags = config.assignor.rack_aware_assignment_tags
    if config.rack is not None and "rack" not in tags:
        listed = ",".join(tags) if tags else "nothing"
        warnings.append(
            f"rack={config.rack!r} is set, but rack.aware.assignment.tags ({listed}) does not list rack: "
            "standbys are not spread over racks (add rack to rack.aware.assignment.tags, e.g. "
            f"rack.aware.assignment.tags={','.join(('rack', *tags))})"
        )
    return warnings
