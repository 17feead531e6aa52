"""Security on real processes: loopback bind, shared token, TLS, health and reflection."""

from __future__ import annotations

import datetime
import ipaddress
import json
import signal
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support import (
    Proc,
    actor_args,
    free_port,
    learner_args,
    learner_process,
    read_records,
    running,
    wait_until,
)
from wire_clients import act, get_info, hello

from seedrl.config import AUTH_TOKEN_ENV, LearnerConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.security import UnprotectedBindError, check_bind_protected, is_loopback_bind
from seedrl.transport import auth_metadata

TOKEN = "s3cret-token-for-tests"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def listening_addresses(port: int) -> list[str]:
    """Local addresses of LISTEN sockets on ``port``, read from /proc/net/tcp{,6}."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            hex_address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                # 32-bit words in host (little-endian) byte order.
                words = [bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, 32, 8)]
                address = ipaddress.ip_address(b"".join(words))
                if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                    address = address.ipv4_mapped
                found.append(str(address))
    return found


def health_status(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def list_services(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    replies = list(stub.ServerReflectionInfo(iter([request]), metadata=metadata, timeout=10))
    return [s.name for s in replies[0].list_services_response.service]


def rpc_code(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def train_then_stop(learner: Proc, logdir: Path, actors: Proc, frames: int) -> None:
    """Both actors connected and ``frames`` trained, then SIGTERM: everyone exits 0."""

    def trained() -> bool:
        records = read_records(logdir)
        return (
            bool(records)
            and records[-1]["actors_connected"] == 2
            and (records[-1]["frames"] >= frames)
        )

    wait_until(trained, 120, what=f"{frames} frames from 2 actors")
    learner.signal(signal.SIGTERM)
    assert learner.wait(30) == 0, learner.output()
    assert actors.wait(30) == 0, actors.output()


def test_token_auth_bind_health_and_reflection(tmp_path):
    env = {"SEEDRL_AUTH_TOKEN": TOKEN, "SEEDRL_LOG_LEVEL": "INFO"}
    with learner_process(tmp_path, env=env) as (learner, port):
        # Loopback only, unless --bind says otherwise.
        assert listening_addresses(port) == ["127.0.0.1"], listening_addresses(port)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            good = auth_metadata(TOKEN)
            wrong = auth_metadata("not-the-token")
            almost = auth_metadata(TOKEN[:-1] + "X")
            spec = get_info(channel, good).env
            for metadata in ((), wrong, almost, (("authorization", TOKEN),)):
                assert rpc_code(lambda m=metadata: get_info(channel, m)) == UNAUTHENTICATED
                outcome = act(channel, [hello(spec, 2)], metadata=metadata)
                assert outcome.code == UNAUTHENTICATED, outcome
                assert "auth token" in outcome.details
                assert rpc_code(lambda m=metadata: list_services(channel, m)) == UNAUTHENTICATED
            # Health checks need no token; reflection with the token lists our service.
            serving = health_pb2.HealthCheckResponse.SERVING
            assert health_status(channel) == serving
            assert health_status(channel, "seedrl.v1.Learner") == serving
            services = list_services(channel, good)
            assert "seedrl.v1.Learner" in services and "grpc.health.v1.Health" in services

        # An actor with the wrong token stops with a clear line instead of retrying forever.
        bad_actor = actor_args(port, 1, 2, "--auth-token", "wrong")
        with running(bad_actor, env={"SEEDRL_LOG_LEVEL": "INFO"}) as bad:
            assert bad.wait(60) == 2, bad.output()
            assert "learner refused: UNAUTHENTICATED: missing or wrong auth token" in bad.output()
            assert "restarting" not in bad.output()

        # Actors taking the token from the same variable train a few hundred frames.
        with running(actor_args(port, 2, 4, "--exit-on-shutdown"), env=env) as actors:
            train_then_stop(learner, tmp_path, actors, 600)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["frames"] >= 600 and result["learner_steps"] > 0
    assert "Traceback" not in learner.output()


# ------------------------------------------------------------------ TLS


_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
    key_encipherment=False, data_encipherment=False, key_agreement=False,
    encipher_only=False, decipher_only=False,
)  # fmt: skip


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def make_certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and a client
    certificate, as PEM files: keys ca, cert, key, client_cert, client_key."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("seedrl test CA"))
        .issuer_name(_name("seedrl test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {n: directory / f"{n}.pem" for n in ("ca", "cert", "key", "client_cert", "client_key")}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    server_names = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    for prefix, common_name, san in (("", "localhost", server_names), ("client_", "actor", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        paths[f"{prefix}cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(paths[f"{prefix}key"], key)
    return paths


def test_tls_training_and_plaintext_client_refused(tmp_path):
    pki = make_certificates(tmp_path / "pki")
    ca, cert, key = pki["ca"], pki["cert"], pki["key"]
    logdir = tmp_path / "run"
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    with learner_process(logdir, *tls) as (learner, port):
        target = f"127.0.0.1:{port}"
        # A plaintext client gets a clean UNAVAILABLE; the learner does not mind.
        with grpc.insecure_channel(target) as plain:
            assert rpc_code(lambda: get_info(plain)) == grpc.StatusCode.UNAVAILABLE
        # A client that trusts another CA is refused as well.
        other_ca = make_certificates(tmp_path / "other")["ca"]
        with grpc.secure_channel(
            target, grpc.ssl_channel_credentials(other_ca.read_bytes())
        ) as untrusted:
            assert rpc_code(lambda: get_info(untrusted)) == grpc.StatusCode.UNAVAILABLE
        credentials = grpc.ssl_channel_credentials(ca.read_bytes())
        with grpc.secure_channel(target, credentials) as channel:
            assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
            info: pb.LearnerInfo = get_info(channel)
            assert info.env.env_id == "CartPole-v1"
        tls_actors = actor_args(port, 2, 4, "--tls-ca", str(ca), "--exit-on-shutdown")
        with running(tls_actors) as actors:
            train_then_stop(learner, logdir, actors, 400)
    result = json.loads((logdir / "result.json").read_text())
    assert result["frames"] >= 400
    assert "Traceback" not in learner.output()


def test_mutual_tls_needs_a_client_certificate(tmp_path):
    pki = make_certificates(tmp_path / "pki")
    logdir = tmp_path / "run"
    tls = ["--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])]
    with learner_process(logdir, *tls, "--tls-client-ca", str(pki["ca"])) as (learner, port):
        target = f"127.0.0.1:{port}"
        server_only = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
        with grpc.secure_channel(target, server_only) as anonymous:
            assert rpc_code(lambda: get_info(anonymous)) == grpc.StatusCode.UNAVAILABLE
        client_tls = ["--tls-cert", str(pki["client_cert"]), "--tls-key", str(pki["client_key"])]
        mtls_actors = actor_args(port, 2, 2, "--tls-ca", str(pki["ca"]), *client_tls)
        with running([*mtls_actors, "--exit-on-shutdown"]) as actors:
            train_then_stop(learner, logdir, actors, 200)
    assert "Traceback" not in learner.output()


# ------------------------------------------------------------------ protected mode

# TEST-NET-1 (RFC 5737): routable-looking and never assigned to this host, so a learner
# that passes the check fails to bind it afterwards and nothing listens on the network.
UNASSIGNED = "192.0.2.1"
REFUSAL = "would let anyone who reaches the port join unauthenticated"


def learner_on(bind: str, tmp_path: Path, *extra: str) -> list[str]:
    return learner_args(free_port(), tmp_path, "--bind", bind, "--no-local-socket", *extra)


def test_bind_protection_rule():
    """Loopback and unix sockets are private; anything else needs a token, mTLS or --insecure."""
    for bind in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "unix:/tmp/s.sock"):
        assert is_loopback_bind(bind), bind
        check_bind_protected(LearnerConfig(bind=bind), None)
    for bind in ("0.0.0.0", "::", "10.1.2.3", UNASSIGNED, "learner.example", ""):
        assert not is_loopback_bind(bind), bind
        with pytest.raises(UnprotectedBindError, match="--auth-token"):
            check_bind_protected(LearnerConfig(bind=bind), None)
        check_bind_protected(LearnerConfig(bind=bind), "a-token")
        check_bind_protected(LearnerConfig(bind=bind, insecure=True), None)
        server_tls = {"tls_cert": "c.pem", "tls_key": "k.pem"}
        # TLS alone encrypts but admits anyone; client certificates are what authenticate.
        with pytest.raises(UnprotectedBindError):
            check_bind_protected(LearnerConfig(bind=bind, **server_tls), None)
        check_bind_protected(LearnerConfig(bind=bind, tls_client_ca="ca.pem", **server_tls), None)
    with pytest.raises(ValueError, match="--tls-client-ca needs --tls-cert"):
        LearnerConfig(tls_client_ca="ca.pem")


def test_learner_refuses_an_unprotected_network_bind(tmp_path):
    """Exit 2 with one line naming the fixes, before anything listens."""
    no_token = {AUTH_TOKEN_ENV: ""}
    for bind in ("0.0.0.0", UNASSIGNED):
        with running(learner_on(bind, tmp_path), env=no_token) as refused:
            assert refused.wait(60) == 2, refused.output()
        (line,) = refused.lines
        assert line.startswith("python -m learner: error: --bind ") and REFUSAL in line, line
        for fix in ("--auth-token", AUTH_TOKEN_ENV, "--tls-client-ca", "--insecure"):
            assert fix in line, fix
        assert not (tmp_path / "config.json").exists(), "refused before the run started"


def test_learner_passes_the_check_with_a_token_client_certificates_or_insecure(tmp_path):
    """Each way out gets past the check: the learner then fails only to bind UNASSIGNED."""
    pki = make_certificates(tmp_path / "pki")
    mutual_tls = ["--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])]
    mutual_tls += ["--tls-client-ca", str(pki["ca"])]
    cases = {
        "--auth-token": (["--auth-token", TOKEN], {AUTH_TOKEN_ENV: ""}),
        AUTH_TOKEN_ENV: ([], {AUTH_TOKEN_ENV: TOKEN}),
        "mutual TLS": (mutual_tls, {AUTH_TOKEN_ENV: ""}),
        "--insecure": (["--insecure"], {AUTH_TOKEN_ENV: ""}),
    }
    for name, (extra, env) in cases.items():
        with running(learner_on(UNASSIGNED, tmp_path / name, *extra), env=env) as learner:
            assert learner.wait(90) == 2, (name, learner.output())
        assert "error: could not bind the learner to 192.0.2.1:" in learner.output(), name
        assert REFUSAL not in learner.output(), name
        # What the run wrote before the bind failed (config.json) holds no token.
        assert (tmp_path / name / "config.json").is_file(), name
        for written in (tmp_path / name).rglob("*"):
            if written.is_file():
                assert TOKEN.encode() not in written.read_bytes(), written
