"""Certificates for the cluster of docs/deploy.md: a CA, one certificate per server, one for clients.

    python deploy/make-certs.py deploy/tls controller-1 controller-2 controller-3 broker-1 broker-2

writes DIR/ca.crt and ca.key (or reuses the CA already in DIR), NAME.crt and NAME.key for each server,
valid for the host NAME (add more names or addresses as NAME=HOST,HOST: `broker-1=broker-1.example.com,
10.0.0.21`), and client.crt and client.key for the Spark sink and admin tools (`rpc.tls.client.auth =
"required"`). Keys are written readable by their owner only. Needs `pip install hotstate` (it uses
hotstate.cli.certificates, as `hotstate cluster up --tls` does).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hotstate.cli.certificates import CertificateAuthority


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    directory = Path(argv[0])
    if (directory / "ca.crt").exists():
        ca = CertificateAuthority.load(directory)
    else:
        ca = CertificateAuthority.create(directory, "hotstate cluster CA")
    for spec in argv[1:]:
        name, _, extra = spec.partition("=")
        hosts = [name, *(host for host in extra.split(",") if host)]
        issued = ca.issue(directory, name, hosts)
        print(f"{issued.cert_file}: {', '.join(hosts)}")
    client = ca.issue(directory, "client", ["hotstate-client"])
    print(f"{client.cert_file}: a client certificate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
