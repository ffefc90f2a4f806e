"""The bearer token a cluster's own processes present to its servers' HTTP API when authentication is on
(docs/security.md): derived from `cluster.secret`, so every server accepts it (role `read`, logged as
`cluster-server`) and anything holding the secret can make it, without a user's credentials. Servers use
it for the console's `/v1/cluster/rates`, the Spark sink for its table check over HTTP. Changing
`cluster.secret` changes it."""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

_CONTEXT: Final = b"hotstate http server token v1"


def cluster_token(cluster_secret: str) -> str:
    return hmac.new(cluster_secret.encode(), _CONTEXT, hashlib.sha256).hexdigest()
