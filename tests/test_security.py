"""Security on real processes: loopback bind, shared token, TLS, health and reflection; no
host runs an env module it did not choose; no secret is written down."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import os
import secrets
import signal
import stat
import sys
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
    actors_reach_every_frontend,
    certs_script,
    free_port,
    learner_args,
    learner_process,
    read_records,
    running,
    wait_until,
)
from wire_clients import act, fake_learner, get_info, hello

from seedrl import envs
from seedrl.cli import parse_config
from seedrl.config import AUTH_TOKEN_ENV, ActorConfig, LearnerConfig, to_json_dict
from seedrl.proto import seedrl_pb2 as pb
from seedrl.security import (
    UnprotectedBindError,
    check_bind_protected,
    check_metrics_bind_protected,
    is_loopback_bind,
)
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
    """Both actors connected, ``frames`` seen and a learner step taken, then SIGTERM:
    everyone exits 0. Frames alone are not enough: on a loaded host the first
    training step can come well after the actors have streamed ``frames``."""

    def trained() -> bool:
        records = read_records(logdir)
        return (
            bool(records)
            and records[-1]["actors_connected"] == 2
            and records[-1]["frames"] >= frames
            and records[-1]["learner_steps"] > 0
        )

    wait_until(trained, 120, what=f"{frames} frames from 2 actors and a learner step")
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
            assert "--auth-token on the command line is visible" in bad.output()

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


def deployment_certificates(directory: Path) -> dict[str, Path]:
    """What `make cluster` / `make k8s-secret` write (deploy/certs.py): keys ca, server,
    server-key, ca-key."""
    assert certs_script().main(["--out", str(directory)]) == 0
    return {name: directory / f"{name}.pem" for name in ("ca", "server", "server-key", "ca-key")}


def test_deployment_certificates_are_private_and_kept(tmp_path, capsys):
    """The folder is its owner's, the CA key too; a second run keeps the first CA."""
    out = tmp_path / "tls"
    pki = deployment_certificates(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE(pki["ca-key"].stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate(pki["ca"].read_bytes())
    server = x509.load_pem_x509_certificate(pki["server"].read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"learner", "learner.seedrl.svc.cluster.local", "localhost"} <= set(
        names.get_values_for_type(x509.DNSName)
    )
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    before = pki["ca"].read_bytes()
    certs = certs_script()
    assert certs.main(["--out", str(out)]) == 2
    assert "exists; keeping it" in capsys.readouterr().err
    assert certs.main(["--out", str(out), "--renew-server", "--name", "gpu-host"]) == 0
    assert pki["ca"].read_bytes() == before
    renewed = x509.load_pem_x509_certificate(pki["server"].read_bytes())
    renewed.verify_directly_issued_by(ca)
    names = renewed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpu-host" in names.get_values_for_type(x509.DNSName)


def test_tls_training_and_plaintext_client_refused(tmp_path):
    """With the files the deployments use: actors dial 127.0.0.1 but check the name
    `learner`, as compose and Kubernetes actors do."""
    pki = deployment_certificates(tmp_path / "tls")
    ca, cert, key = pki["ca"], pki["server"], pki["server-key"]
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
        tls_actors = actor_args(
            port, 2, 4, "--tls-ca", str(ca), "--tls-server-name", "learner", "--exit-on-shutdown"
        )
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


def test_tls_on_a_unix_bind_is_served_by_every_frontend_and_only_over_tls(tmp_path):
    """On a unix --bind the frontends beside the first listen on sockets beside the path,
    with its TLS: a plaintext client is refused on each, and actors that dial the path
    and trust the CA train through both frontends."""
    pki = make_certificates(tmp_path / "pki")
    bound, beside = f"unix:{tmp_path}/learner.sock", f"unix:{tmp_path}/learner-frontend-1.sock"
    tls = ["--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])]
    extra = ("--serving-processes", "2", "--bind", bound, *tls)
    info_logs = {"SEEDRL_LOG_LEVEL": "INFO"}
    with learner_process(tmp_path / "run", *extra, env=info_logs, timeout=240) as (learner, _):
        trusted = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
        # A unix target's authority is its path: the client names the certificate's host.
        named = [("grpc.ssl_target_name_override", "localhost")]
        with grpc.secure_channel(bound, trusted, named) as channel:
            turns = sorted(get_info(channel).local_address for _ in range(2))
        assert turns == sorted([bound, beside]), turns
        for address in (bound, beside):
            with grpc.insecure_channel(address) as plain:
                assert rpc_code(lambda: get_info(plain)) == grpc.StatusCode.UNAVAILABLE
            with grpc.secure_channel(address, trusted, named) as channel:
                assert get_info(channel).env.env_id == "CartPole-v1"
        actors = ActorConfig(
            learner=bound, num_actors=4, envs_per_actor=1, tls_ca=str(pki["ca"]),
            tls_server_name="localhost",
        )  # fmt: skip
        actors_reach_every_frontend(learner, actors, 2, info_logs)
        learner.stop()
        assert learner.popen.returncode == 0, learner.output()
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


def test_metrics_bind_protection_rule():
    """/metrics has no authentication: off or loopback always passes, any other address
    needs --metrics-insecure, whatever protects the gRPC port; a unix socket is refused."""
    check_metrics_bind_protected(LearnerConfig(metrics_bind="0.0.0.0"))  # /metrics off
    for bind in ("127.0.0.1", "::1", "localhost"):
        check_metrics_bind_protected(LearnerConfig(metrics_port=9100, metrics_bind=bind))
    for bind in ("0.0.0.0", "::", UNASSIGNED, "learner.example"):
        config = LearnerConfig(metrics_port=9100, metrics_bind=bind)
        with pytest.raises(UnprotectedBindError, match="--metrics-insecure"):
            check_metrics_bind_protected(config)
        protected = dataclasses.replace(config, auth_token="a-token", insecure=True)
        with pytest.raises(UnprotectedBindError, match="no authentication"):
            check_metrics_bind_protected(protected)  # the token guards gRPC, not /metrics
        check_metrics_bind_protected(dataclasses.replace(config, metrics_insecure=True))
    with pytest.raises(UnprotectedBindError, match="served over TCP"):
        check_metrics_bind_protected(
            LearnerConfig(metrics_port=9100, metrics_bind="unix:/tmp/m.sock", metrics_insecure=True)
        )


def test_learner_refuses_an_open_metrics_bind_in_one_line(tmp_path):
    """Exit 2 before anything listens, even with a token: the token does not guard /metrics."""
    port = free_port()
    args = learner_on(
        "127.0.0.1", tmp_path, "--metrics-port", str(port), "--metrics-bind", UNASSIGNED
    )
    with running(args, env={AUTH_TOKEN_ENV: "a-token"}) as refused:
        assert refused.wait(60) == 2, refused.output()
    (line,) = refused.lines
    assert line.startswith(f"python -m learner: error: --metrics-bind {UNASSIGNED} "), line
    assert "--metrics-insecure" in line
    assert not (tmp_path / "config.json").exists(), "refused before the run started"


def test_learner_passes_the_check_with_a_token_or_client_certificates(tmp_path):
    """A way out gets past the check: the learner then fails only to bind UNASSIGNED.

    The token from the environment and mutual TLS run as processes (the two ways whose
    files and variables the process itself reads); every way out is checked in-process
    in test_bind_protection_rule."""
    pki = make_certificates(tmp_path / "pki")
    mutual_tls = ["--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])]
    mutual_tls += ["--tls-client-ca", str(pki["ca"])]
    cases = {
        AUTH_TOKEN_ENV: ([], {AUTH_TOKEN_ENV: TOKEN}),
        "mutual TLS": (mutual_tls, {AUTH_TOKEN_ENV: ""}),
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


# ------------------------------------------------------------------ hosts run only what they chose

PROBE = """
\"\"\"An env module that leaves a mark when imported: did this host run its code?\"\"\"
import pathlib

pathlib.Path({marker!r}).write_text("imported")


def make(**kwargs):
    import gymnasium

    return gymnasium.make("CartPole-v1", **kwargs)
"""
ALLOW_FLAG = "--allow-env-module"


def write_probe(directory: Path) -> tuple[str, Path]:
    """A fresh probe module in ``directory``: (its name, the file its import creates)."""
    name = f"seedrl_probe_{secrets.token_hex(4)}"
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f"{name}.imported"
    (directory / f"{name}.py").write_text(PROBE.format(marker=str(marker)))
    return name, marker


def test_the_env_allowance_rule():
    """Plain ids always; a module's ids only when that module (or a package above it) or
    the exact id is allowed."""
    allowed = ("mypkg", "other.envs:make", "  ")
    for env_id in ("CartPole-v1", "ALE/Pong-v5", "MinAtar/Breakout-v1"):
        assert envs.env_allowed(env_id, ()), env_id
    for env_id in ("mypkg:make", "mypkg.envs:make", "mypkg:CartPole-v1", "other.envs:make"):
        assert envs.env_allowed(env_id, allowed), env_id
    refused = ("builtins:open", "os:system", "mypkgevil:make", "other.envs:make2",
               "other:make", "other.envs.sub:make", ":make", "ALE/x:y")  # fmt: skip
    for env_id in refused:
        assert not envs.env_allowed(env_id, allowed), env_id
        with pytest.raises(envs.EnvNotAllowed, match=ALLOW_FLAG) as refusal:
            envs.check_env_allowed(env_id, allowed, "the learner")
        assert "\n" not in str(refusal.value)


def test_stock_actors_refuse_a_learner_that_names_code(tmp_path):
    """A fake learner names builtins:open (which would create a file) or an importable
    module: a stock `python -m actors` exits 2 with one line naming the flag, and
    nothing is created or imported; with the allowance the same actor plays."""
    modules = tmp_path / "modules"
    probe, imported = write_probe(modules)
    victim = tmp_path / "created-by-the-learner"
    cartpole = envs.describe_env("CartPole-v1")
    pythonpath = os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": pythonpath}
    with fake_learner() as (fake, port):
        attacks = {
            "builtins:open": json.dumps({"file": str(victim), "mode": "w"}),
            f"{probe}:make": "{}",
            f"{probe}:CartPole-v1": "{}",  # gymnasium's own module:EnvId form imports too
        }
        for env_id, kwargs_json in attacks.items():
            fake.env = pb.EnvSpec(env_id=env_id, env_kwargs_json=kwargs_json)
            with running(actor_args(port, 1, 1), env=env) as actor:
                assert actor.wait(60) == 2, (env_id, actor.output())
            refusals = [line for line in actor.lines if ALLOW_FLAG in line]
            assert len(refusals) == 1, (env_id, actor.output())
            module = env_id.partition(":")[0]
            assert f"names env {env_id!r}" in refusals[0], refusals
            assert f"{ALLOW_FLAG} {module}" in refusals[0], refusals
            assert "Traceback" not in actor.output(), actor.output()
            assert not victim.exists() and not imported.exists(), env_id
        assert fake.hellos == [], "refused before any stream"

        # The actor host allows the module: the same stock actor builds the env and plays.
        fake.env = pb.EnvSpec()
        fake.env.CopyFrom(cartpole)
        fake.env.env_id = f"{probe}:make"
        with running(actor_args(port, 1, 1, ALLOW_FLAG, probe), env=env) as actor:
            assert actor.wait(60) == 0, actor.output()
        assert imported.exists() and fake.hellos == [f"{probe}:make"]


def test_evaluate_refuses_a_crafted_checkpoints_callable_env(tmp_path, monkeypatch, capsys):
    """A checkpoint from elsewhere names a module:callable env: refused in one line with
    nothing imported; --allow-env-module runs it; --env runs the user's env instead."""
    from support import small_learner

    from learner.parts import save_checkpoint
    from learner.state import checkpoint
    from learner.tools import evaluate as evaluate_cli

    learner = small_learner(tmp_path / "run", length=5, batch=2)
    save_checkpoint(learner)
    probe, imported = write_probe(tmp_path / "modules")
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    state = checkpoint.load(learner.config.checkpoint_path)
    env_spec = pb.EnvSpec.FromString(state["env_spec"])
    env_spec.env_id = f"{probe}:make"
    state["env_spec"] = env_spec.SerializeToString()
    crafted = tmp_path / "downloaded.pt"
    checkpoint.save(crafted, state)
    run = ["--checkpoint", str(crafted), "--episodes", "1", "--max-steps", "20"]

    with pytest.raises(SystemExit) as refused:
        evaluate_cli.main(run)
    assert refused.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{ALLOW_FLAG} {probe}" in line and str(crafted) in line, line
    assert not imported.exists() and probe not in sys.modules

    assert evaluate_cli.main([*run, "--env", "CartPole-v1"]) == 0
    assert "seedrl evaluate: CartPole-v1:" in capsys.readouterr().out
    assert not imported.exists() and probe not in sys.modules

    assert evaluate_cli.main([*run, ALLOW_FLAG, probe]) == 0
    assert f"seedrl evaluate: {probe}:make:" in capsys.readouterr().out
    assert imported.exists()


def test_allowance_and_token_file_flags():
    """--allow-env-module repeats and survives the launcher's command line; a token file
    that cannot be read is one line naming the flag, not a traceback or the token."""
    from seedrl.commands import config_flags

    argv = [ALLOW_FLAG, "a", ALLOW_FLAG, "b.c,d:make", "--auth-token-file", __file__]
    config = parse_config(ActorConfig, argv, "t", "t")
    assert config.allow_env_module == ("a", "b.c", "d:make")
    assert parse_config(ActorConfig, config_flags(config), "t", "t") == config
    with pytest.raises(ValueError, match="give one of them"):
        LearnerConfig(auth_token="x", auth_token_file="f")


def test_a_missing_token_file_is_one_line(tmp_path):
    missing = tmp_path / "no-token"
    for command in (learner_args(free_port(), tmp_path), actor_args(free_port())):
        with running([*command, "--auth-token-file", str(missing)]) as proc:
            assert proc.wait(60) == 2, proc.output()
        (line,) = proc.lines
        assert f"--auth-token-file {missing}: cannot read it" in line, line


@pytest.mark.parametrize("ca", ["missing", "directory", "empty", "not-pem"])
def test_an_unreadable_ca_file_is_one_line(tmp_path, capsys, ca):
    """An actor's --tls-ca that holds no certificate exits 2 in one line at start-up, never
    a channel that gRPC would verify against the system's public CAs instead."""
    path = tmp_path / ca
    if ca == "directory":
        path.mkdir()
    elif ca != "missing":
        path.write_text("" if ca == "empty" else "not a certificate\n")
    with pytest.raises(SystemExit) as stop:
        parse_config(ActorConfig, ["--tls-ca", str(path)], "actors", "", check_files=True)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--tls-ca {path}: " in line, line
    good = make_certificates(tmp_path / "certs")["ca"]
    assert parse_config(ActorConfig, ["--tls-ca", str(good)], "actors", "", check_files=True)
    # a command line checked for another host (a container's paths) names files not here
    assert parse_config(ActorConfig, ["--tls-ca", str(path)], "actors", "").tls_ca == str(path)


# ------------------------------------------------------------------ no secret written down


def test_a_token_on_the_command_line_is_never_written_down(tmp_path):
    """A run started with --auth-token X: X is in no file of the run (config.json,
    checkpoints, TensorBoard events, metrics) nor in any output; the learner warns that
    the flag shows in the process list; the run directory and checkpoints are private.
    Actors take the same token from --auth-token-file."""
    token = f"tok-{secrets.token_hex(16)}"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    logdir = tmp_path / "run"
    flags = ["--auth-token", token, "--tensorboard", "--checkpoint-interval-s", "1",
             "--checkpoint-history-frames", "200"]  # fmt: skip
    with learner_process(logdir, *flags) as (learner, port):
        assert "--auth-token on the command line is visible" in learner.output()
        actors = actor_args(port, 2, 4, "--auth-token-file", str(token_file), "--exit-on-shutdown")
        with running(actors, env={AUTH_TOKEN_ENV: ""}) as actor_proc:
            train_then_stop(learner, logdir, actor_proc, 400)
    files = [p for p in logdir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.json", "checkpoint.pt", "metrics.jsonl", "result.json"} <= names, names
    assert any(name.startswith("events.out.tfevents") for name in names), names
    assert list((logdir / "checkpoints").glob("frames-*.pt")), "a history checkpoint too"
    for path in files:
        assert token.encode() not in path.read_bytes(), path
    for proc in (learner, actor_proc):
        assert token not in "\n".join(proc.lines)
    assert "auth_token" not in json.loads((logdir / "config.json").read_text())
    assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
    for path in (logdir / "checkpoint.pt", *(logdir / "checkpoints").glob("*.pt")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # What wrote config.json and the checkpoint's config leaves secrets out, and a
    # config's repr (what a log line or a traceback would show) never has the token.
    assert "auth_token" not in to_json_dict(LearnerConfig(auth_token=token))
    assert token not in repr(LearnerConfig(auth_token=token))
    assert token not in repr(ActorConfig(auth_token=token))
