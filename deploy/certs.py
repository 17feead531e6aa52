"""The TLS files of a seedrl deployment: a private CA and the learner's certificate.

``make cluster`` and ``make k8s-secret`` run ``python deploy/certs.py --out DIR`` beside
the token, once; nothing here is ever committed (.gitignore) or sent to an image build
(.dockerignore). With them, actors verify that the learner they reach is the one this
CA signed (so nobody else can learn their token or name their env), and the token and
every frame travel encrypted.

DIR (mode 0700) gets:

- ``ca.pem``: the CA certificate, public: actors (``--tls-ca``) and the learner's
  healthcheck verify the learner against it.
- ``server.pem``, ``server-key.pem``: the learner's certificate and key
  (``--tls-cert``/``--tls-key``), for the names actors dial: ``learner`` (the compose and
  Kubernetes service), its Kubernetes forms, localhost, and each ``--name``.
- ``ca-key.pem`` (0600): signs certificates for more names later (``--renew-server``); it
  is never mounted into a container.

The files containers read are 0644 because compose bind-mounts them as they are and the
containers run as uid 10001; the 0700 directory keeps every other user of this host out.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used, so a missing package is one line from main()
    from cryptography import x509

DEFAULT_NAMES = (
    "learner",
    "learner-standby",
    "learner.seedrl",
    "learner.seedrl.svc",
    "learner.seedrl.svc.cluster.local",
    "localhost",
    "127.0.0.1",
    "::1",
)
"""Names (DNS or IP) the learner's certificate is valid for: the service name actors dial
in compose and Kubernetes (namespace seedrl), compose's standby learner (the same
certificate serves both), and this host's loopback for healthchecks."""
CA_DAYS = 3650
SERVER_DAYS = 825
"""Validity; the server certificate can be renewed from the kept CA key (--renew-server)."""
PUBLIC = 0o644
PRIVATE = 0o600


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with ``mode`` from the first byte (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    from cryptography import x509

    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def generate(out: Path, names: Sequence[str], renew_server: bool = False) -> list[Path]:
    """Write the CA (unless renewing) and a server certificate for ``names`` into ``out``;
    returns the files written."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    out.chmod(0o700)
    now = datetime.datetime.now(datetime.UTC)
    start = now - datetime.timedelta(minutes=5)  # a little slack for clocks that differ
    pem = serialization.Encoding.PEM
    written = []
    if renew_server:
        ca_key = serialization.load_pem_private_key((out / "ca-key.pem").read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "seedrl deployment CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        key_bytes = ca_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _write(out / "ca-key.pem", key_bytes, PRIVATE)
        written.append(out / "ca-key.pem")
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key_bytes = server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(out / "server-key.pem", server_key_bytes, PUBLIC)
    _write(out / "server.pem", server_cert.public_bytes(pem), PUBLIC)
    written += [out / "server-key.pem", out / "server.pem"]
    if not renew_server:  # last: its presence is what tells make the set is complete
        _write(out / "ca.pem", ca_cert.public_bytes(pem), PUBLIC)
        written.append(out / "ca.pem")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deploy/certs.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the PEM files")
    parser.add_argument(
        "--name", action="append", default=[],
        help="another DNS name or IP actors dial the learner by (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--renew-server", action="store_true",
        help="only a new server certificate (e.g. for more --name), signed by the kept CA",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        print(
            "deploy/certs.py: error: needs the cryptography package (in seedrl's dev extra: "
            "make install; or pip install cryptography)",
            file=sys.stderr,
        )
        return 2
    if not args.renew_server and (args.out / "ca.pem").exists():
        print(f"deploy/certs.py: error: {args.out}/ca.pem exists; keeping it", file=sys.stderr)
        return 2
    names = [*DEFAULT_NAMES, *(n for n in args.name if n)]
    for path in generate(args.out, names, args.renew_server):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
