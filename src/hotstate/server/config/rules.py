"""The rules that compare settings with each other: quorum membership, heartbeat windows, frame sizes, TLS.

Each rule gets the values that passed the rules of their kind (Kafka name -> typed value, kinds.py) and runs
only when all of its keys are among them, so a bad value is reported once, not again by every rule that
compares it with others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

from hotstate.server.config.addresses import Listener, Voter
from hotstate.server.config.errors import MISSING, ConfigError
from hotstate.server.settings import FRAME_DATA_SHARE, FRAME_HEADROOM_BYTES, MAX_QUERY_TIMEOUT_MS


def _membership_problem(values: Mapping[str, Any]) -> ConfigError | None:
    node_id: int = values["node.id"]
    controller = "controller" in values["process.roles"]
    rpc: Listener = values["listeners"][0]
    voters: tuple[Voter, ...] = values["controller.quorum.voters"]
    me = next((voter for voter in voters if voter.node_id == node_id), None)
    listed = ",".join(str(voter) for voter in voters)
    # A controller not listed is no error: it starts as an observer of the metadata log and becomes a voter
    # once added (`hotstate cluster voters add`, KIP-853); the server says so when it starts.
    if controller and me is not None and me.port != rpc.port:
        return ConfigError(
            "controller.quorum.voters",
            str(me),
            f"must give this controller the port of its rpc listener ({rpc}); "
            "the other voters connect to it there"
            + (" (a controller cannot use port 0)" if rpc.port == 0 else ""),
        )
    if not controller and me is not None:
        return ConfigError(
            "controller.quorum.voters",
            listed,
            f"must not include this node (node.id={node_id}): it is broker-only, so it would count "
            "toward the quorum without ever voting; add controller to process.roles "
            "or drop it from the voters",
        )
    return None


_Rule: TypeAlias = Callable[[Mapping[str, Any]], ConfigError | None]


def _below(key: str, bound: str, otherwise: str) -> tuple[tuple[str, ...], _Rule]:
    """The rule that setting `key` is below setting `bound`; `otherwise`: what goes wrong when it is not."""

    def problem(values: Mapping[str, Any]) -> ConfigError | None:
        value, limit = values[key], values[bound]
        if value < limit:
            return None
        return ConfigError(key, value, f"must be below {bound}={limit}, {otherwise}")

    return (key, bound), problem


def _heartbeat_window_problem(values: Mapping[str, Any]) -> ConfigError | None:
    """HeartbeatConfig's rule: the window holds window // send whole slots, at least the larger threshold."""
    send, window = values["heartbeat.send.interval.ms"], values["heartbeat.window.ms"]
    missed, received = values["heartbeat.missed.threshold"], values["heartbeat.received.threshold"]
    slots = max(missed, received)
    if window // send >= slots:
        return None
    why = (
        f"heartbeat.missed.threshold={missed}, or a dead peer is never marked down"
        if missed >= received
        else f"heartbeat.received.threshold={received}, or a peer marked down never comes back up"
    )
    return ConfigError(
        "heartbeat.window.ms",
        window,
        f"must be at least {send * slots}: {slots} slots of heartbeat.send.interval.ms={send}, "
        f"the larger of the thresholds, {why}",
    )


_QUORUM_SIZE_KEYS: Final = ("controller.quorum.fetch.max.bytes", "controller.quorum.snapshot.chunk.bytes")
_DATA_SIZE_KEYS: Final = ("replica.fetch.max.bytes", "produce.max.bytes")


def _frame_problem(values: Mapping[str, Any]) -> ConfigError | None:
    """rpc.max.frame.bytes must hold the largest quorum message and the largest partition message; each
    part is checked when its sizes are valid."""
    needs: list[tuple[int, str]] = []
    if all(key in values for key in _QUORUM_SIZE_KEYS):
        largest = max(values[key] for key in _QUORUM_SIZE_KEYS)
        needs.append(
            (
                largest + FRAME_HEADROOM_BYTES,
                "the largest of controller.quorum.fetch.max.bytes and controller.quorum.snapshot.chunk.bytes "
                f"({largest}) plus {FRAME_HEADROOM_BYTES} bytes for headers, or quorum messages do not fit",
            )
        )
    if all(key in values for key in _DATA_SIZE_KEYS):
        # A fetch answer carries at least one whole batch, and a batch can be as large as a Produce.
        largest = max(values[key] for key in _DATA_SIZE_KEYS)
        needs.append(
            (
                largest * FRAME_DATA_SHARE,
                f"{FRAME_DATA_SHARE} times the largest of replica.fetch.max.bytes and produce.max.bytes "
                f"({largest}), to leave room for the framing of every row and batch, or Produce requests "
                "and replica fetch answers do not fit",
            )
        )
    frame = values["rpc.max.frame.bytes"]
    unmet = [(need, why) for need, why in needs if frame < need]
    if not unmet:
        return None
    return ConfigError(
        "rpc.max.frame.bytes",
        frame,
        f"must be at least {max(need for need, _ in unmet)}: " + "; and ".join(why for _, why in unmet),
    )


def _tls_problem(listener: str) -> _Rule:
    """`{listener}.tls.*`: a certificate comes with its key, and the rest needs a certificate."""
    cert, key, ca = (f"{listener}.tls.{name}.file" for name in ("cert", "key", "ca"))

    def problem(values: Mapping[str, Any]) -> ConfigError | None:
        if values[cert] is not None and values[key] is None:
            return ConfigError(key, MISSING, f"must be set with {cert} (the certificate's private key)")
        if values[cert] is None:
            for other in (key, ca):
                if values[other] is not None:
                    return ConfigError(
                        other,
                        str(values[other]),
                        f"needs {cert}: TLS is on only with a certificate (and its key)",
                    )
        return None

    return problem


def _client_auth_problem(values: Mapping[str, Any]) -> ConfigError | None:
    if values["rpc.tls.client.auth"] != "required":
        return None
    for needed in ("rpc.tls.cert.file", "rpc.tls.ca.file"):
        if values[needed] is None:
            return ConfigError(
                "rpc.tls.client.auth",
                "required",
                f"needs {needed}: client certificates are checked against the CA, over TLS",
            )
    return None


def _query_timeout_problem(values: Mapping[str, Any]) -> ConfigError | None:
    timeout: int = values["query.timeout.ms"]
    if timeout <= MAX_QUERY_TIMEOUT_MS:
        return None
    return ConfigError(
        "query.timeout.ms", timeout, f"must be at most {MAX_QUERY_TIMEOUT_MS} (the most a query may ask for)"
    )


_RULES: Final[Sequence[tuple[tuple[str, ...], _Rule]]] = (
    (("node.id", "process.roles", "listeners", "controller.quorum.voters"), _membership_problem),
    _below(
        "broker.heartbeat.interval.ms",
        "broker.session.timeout.ms",
        "or a healthy server is fenced between two heartbeats",
    ),
    (("query.timeout.ms",), _query_timeout_problem),
    _below(
        "replica.fetch.max.wait.ms",
        "replica.fetch.timeout.ms",
        "or an idle follower's fetch times out before the active answers it",
    ),
    (
        (
            "heartbeat.send.interval.ms",
            "heartbeat.window.ms",
            "heartbeat.missed.threshold",
            "heartbeat.received.threshold",
        ),
        _heartbeat_window_problem,
    ),
    (("rpc.max.frame.bytes",), _frame_problem),
    (("rpc.tls.cert.file", "rpc.tls.key.file", "rpc.tls.ca.file"), _tls_problem("rpc")),
    (("http.tls.cert.file", "http.tls.key.file", "http.tls.ca.file"), _tls_problem("http")),
    (("rpc.tls.client.auth", "rpc.tls.cert.file", "rpc.tls.ca.file"), _client_auth_problem),
)


def rule_problems(valid: Mapping[str, object]) -> list[ConfigError]:
    problems = (rule(valid) for keys, rule in _RULES if all(key in valid for key in keys))
    return [problem for problem in problems if problem is not None]
