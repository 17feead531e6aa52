"""deploy/ must say what the code really does: images, flags, ports, probes, variables.

These tests parse every compose/Kubernetes/Docker file and cross-check it against the
code, so a renamed flag, port or variable breaks the build instead of a cluster. With a
compose installed, ``config`` validates the compose file; the Kubernetes objects are
checked strictly against the API's JSON schemas (kubernetes-validate), and rendered with
``kubectl kustomize`` where kubectl is installed. tests/test_cluster.py builds and runs
the compose cluster for real (``make test-cluster``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from docker_engine import EngineUnavailable, compose_command
from support import ROOT, certs_script, learner_process, running

from learner.serving.healthcheck import build_parser as healthcheck_parser
from seedrl import envs
from seedrl.cli import parse_config
from seedrl.config import AUTH_TOKEN_ENV, ActorConfig, LearnerConfig
from seedrl.transport import SERVICE_NAME

yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extra")

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
STANDBY = DEPLOY / "docker-compose.standby.yml"
IMAGES = {"learner": "seedrl-learner", "actor": "seedrl-actor"}
DOCKERFILES = {"learner": DEPLOY / "Dockerfile.learner", "actor": DEPLOY / "Dockerfile.actor"}
ENTRY_MODULES = {"learner": "learner", "actor": "actors"}
CONFIGS: dict[str, type] = {"learner": LearnerConfig, "actor": ActorConfig}


def interpolate(value: str, variables: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR:-default}`` -> VAR's value in ``variables``, else the default
    (what runs when VAR is unset)."""
    given = variables or {}
    return re.sub(r"\$\{([A-Z_]+):-([^}]*)\}", lambda m: given.get(m[1]) or m[2], value)


def parse_flags(role: str, args: list[Any], variables: dict[str, str] | None = None):
    """Parse a container's arguments with the real CLI; an unknown flag fails the test."""
    argv = [interpolate(str(a), variables) for a in args]
    try:
        return parse_config(CONFIGS[role], argv, f"{role} in deploy/", "")
    except SystemExit as exc:
        pytest.fail(f"{role} arguments {argv} are not valid {CONFIGS[role].__name__} flags: {exc}")


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with backslash continuations joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def exec_form(path: Path, instruction: str) -> list[str]:
    (value,) = [v for k, v in dockerfile_instructions(path) if k == instruction]
    return json.loads(value)


def env_file_names(path: Path) -> set[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return {line.split("=", 1)[0] for line in lines if line and not line.startswith("#")}


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ---------------------------------------------------------------------- Dockerfiles


@pytest.mark.parametrize("role", ["learner", "actor"])
def test_dockerfile_entrypoint_and_flags_are_real(role):
    path = DOCKERFILES[role]
    assert exec_form(path, "ENTRYPOINT") == ["python", "-m", ENTRY_MODULES[role]]
    config = parse_flags(role, exec_form(path, "CMD"))
    if role == "learner":
        assert config.bind == "0.0.0.0", "a learner in a container must listen on all interfaces"
        assert config.port == LearnerConfig().port
        assert f"EXPOSE {config.port}" in path.read_text()
    defaults = dockerfile_arg_defaults(path)
    for kind, args in dockerfile_instructions(path):
        if kind == "COPY" and not args.startswith("--from="):
            for source in args.split()[:-1]:
                source = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], source)
                if "*" not in source:
                    assert (ROOT / source).exists(), f"{path.name} copies missing {source}"


def dockerfile_arg_defaults(path: Path) -> dict[str, str]:
    """ARG NAME=default values (a build without --build-arg uses these)."""
    pairs = [a.partition("=") for k, a in dockerfile_instructions(path) if k == "ARG"]
    return {name: default for name, _, default in pairs}


def test_actor_image_has_no_torch_and_learner_image_does():
    actor = DOCKERFILES["actor"].read_text()
    install = [a for k, a in dockerfile_instructions(DOCKERFILES["actor"]) if k == "RUN"]
    assert any(re.search(r"pip install .*\s\.( |$)", a) for a in install), install
    assert "[learner]" not in actor and "COPY learner" not in actor
    assert "'torch' not in sys.modules" in actor, "the build should prove torch is absent"
    learner = DOCKERFILES["learner"].read_text()
    assert "p['optional-dependencies']['learner']" in learner and "TORCH_INDEX_URL" in learner
    assert "import torch" in learner, "the build should prove torch is there"


@pytest.mark.parametrize("role", ["learner", "actor"])
def test_images_install_offline_from_a_wheelhouse_and_leave_it_behind(role):
    """Wheels in WHEELHOUSE mean --no-index; only the built venv reaches the final stage."""
    path = DOCKERFILES[role]
    steps = dockerfile_instructions(path)
    stages = [i for i, (k, _) in enumerate(steps) if k == "FROM"]
    assert len(stages) == 2, "a build stage and a runtime stage"
    build, final = steps[stages[0] : stages[1]], steps[stages[1] :]
    assert dockerfile_arg_defaults(path)["WHEELHOUSE"] == "deploy/wheelhouse"
    assert (DEPLOY / "wheelhouse" / "README.md").exists(), "the default wheelhouse must exist"
    assert any(k == "COPY" and a.startswith("${WHEELHOUSE}/ ") for k, a in build)
    installs = [a for k, a in build if k == "RUN" and "pip install" in a]
    assert len(installs) == 2, "dependencies (cached layer), then the package with --no-deps"
    assert all("--no-index --find-links /wheelhouse" in a for a in installs)
    assert "-r /tmp/requirements.txt" in installs[0] and "--no-deps" in installs[1]
    assert "pip uninstall --yes pip" in installs[-1], "the installer stays in the build stage"
    assert [a for k, a in final if k == "COPY"] == ["--from=build /opt/venv /opt/venv"]
    assert all(a.split()[0] != "build" for k, a in final if k == "FROM")
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!deploy/wheelhouse" in ignored, "the wheelhouse must reach the build context"


def test_learner_image_healthcheck_uses_grpc_health():
    (check,) = [a for k, a in dockerfile_instructions(DOCKERFILES["learner"]) if k == "HEALTHCHECK"]
    command = json.loads(check.split("CMD", 1)[1])
    assert command[:4] == ["python", "-m", "learner", "healthcheck"]
    args = healthcheck_parser().parse_args(command[4:])
    assert host_port(args.address)[1] == LearnerConfig().port


# ---------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = load_yaml_docs(COMPOSE)
    return doc


def test_compose_services_images_and_dockerfiles(compose):
    services = compose["services"]
    assert set(services) == {"learner", "actor"}
    for role, service in services.items():
        assert service["image"].split(":")[0] == IMAGES[role]
        build = service["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == (
            DOCKERFILES[role].resolve()
        )


def test_compose_learner_port_token_volume_and_health(compose):
    learner = compose["services"]["learner"]
    config = parse_flags("learner", learner["command"])
    assert config.bind == "0.0.0.0"
    published = [interpolate(p) for p in learner["ports"]]
    assert any(p.endswith(f":{config.port}") for p in published), published
    # HOST:HOSTPORT:PORT on loopback: the learner is not published beyond this host by default.
    assert all(p.split(":")[0] == "127.0.0.1" for p in published), published
    volumes = [interpolate(v) for v in learner["volumes"]]
    assert any(v.split(":")[1] == str(Path(config.logdir).parent) for v in volumes)
    test = learner["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1:5] == ["python", "-m", "learner", "healthcheck"]
    args = healthcheck_parser().parse_args(test[5:])
    assert host_port(args.address)[1] == config.port
    assert args.service in ("", SERVICE_NAME)
    for role in ("learner", "actor"):
        (env_file,) = compose["services"][role]["env_file"]
        assert env_file == "seedrl.env"
    assert AUTH_TOKEN_ENV in env_file_names(DEPLOY / "seedrl.env.example")


def test_compose_actors_reach_the_learner_service_and_wait_for_health(compose):
    actor = compose["services"]["actor"]
    config = parse_flags("actor", actor["command"])
    host, port = host_port(config.learner)
    assert host == "learner", "actors dial the learner service by name"
    assert port == parse_flags("learner", compose["services"]["learner"]["command"]).port
    assert config.num_actors == 1, "one container = one actor: --scale actor=N is the count"
    assert config.first_index == -1, "identical replicas need distinct seeds"
    assert actor["depends_on"]["learner"]["condition"] == "service_healthy"
    assert actor["restart"] in ("on-failure", "unless-stopped", "always")


def test_compose_standby_shares_the_run_and_actors_fail_over_to_it(compose):
    """The standby file: a learner that waits on the primary's health over TLS, resumes
    from the same run directory, and is the actors' fallback; each names itself for the
    other (leader.json) by a name the certificate holds."""
    (extra,) = load_yaml_docs(STANDBY)
    primary = parse_flags("learner", extra["services"]["learner"]["command"])
    standby_service = extra["services"]["learner-standby"]
    standby = parse_flags("learner", standby_service["command"])
    actor = parse_flags("actor", extra["services"]["actor"]["command"])
    base = parse_flags("learner", compose["services"]["learner"]["command"])
    assert primary.port == base.port and primary.logdir == base.logdir == standby.logdir
    assert standby.standby == f"{primary.advertise_host}:{primary.port}"
    assert standby.resume and primary.resume
    assert standby.standby_tls_ca and primary.standby_tls_ca, "both may stand by over TLS"
    assert actor.learner == f"{primary.advertise_host}:{primary.port}"
    assert actor.fallback_learner == f"{standby.advertise_host}:{standby.port}"
    names = certs_script().DEFAULT_NAMES
    assert primary.advertise_host in names and standby.advertise_host in names
    volumes = {interpolate(v) for v in standby_service["volumes"]}
    assert volumes >= {interpolate(v) for v in compose["services"]["learner"]["volumes"]}
    assert standby_service["image"] == compose["services"]["learner"]["image"]


def test_compose_config_validates_with_docker():
    """`docker compose config` (plugin) or `docker-compose config` (1.29) accepts the file."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client installed")
    try:
        compose = compose_command(dict(os.environ))
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    env_file = DEPLOY / "seedrl.env"
    made = not env_file.exists()
    if made:
        env_file.write_text((DEPLOY / "seedrl.env.example").read_text())
    try:
        done = subprocess.run(
            [*compose, "-f", str(COMPOSE), "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if made:
            env_file.unlink()
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of the kustomization, by (kind, name)."""
    kustomization = load_yaml_docs(K8S / "kustomization.yaml")[0]
    objects = {}
    for resource in kustomization["resources"]:
        for doc in load_yaml_docs(K8S / resource):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    objects[("Kustomization", "")] = kustomization
    return objects


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def test_every_k8s_file_parses_and_is_listed():
    listed = set(load_yaml_docs(K8S / "kustomization.yaml")[0]["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    for path in K8S.glob("*.yaml"):
        assert load_yaml_docs(path), path


def test_k8s_images_match_compose(k8s, compose):
    images = {i["name"] for i in k8s[("Kustomization", "")]["images"]}
    assert images == set(IMAGES.values())
    for role in ("learner", "actor"):
        assert container(k8s[("Deployment", role)])["image"] == IMAGES[role]


def test_k8s_learner_flags_ports_probes_gpu(k8s):
    learner = container(k8s[("Deployment", "learner")])
    config = parse_flags("learner", learner["args"])
    assert config.bind == "0.0.0.0"
    (port,) = learner["ports"]
    assert port["containerPort"] == config.port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # The learner speaks TLS only, which Kubernetes' native gRPC probes cannot.
        command = learner[probe]["exec"]["command"]
        assert command[:4] == ["python", "-m", "learner", "healthcheck"], probe
        args = healthcheck_parser().parse_args(command[4:])
        assert host_port(args.address)[1] == config.port, probe
        assert args.service in ("", SERVICE_NAME), probe
        assert args.tls_ca is not None, probe
    assert int(learner["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    (service_port,) = k8s[("Service", "learner")]["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], config.port)
    mount = learner["volumeMounts"][0]["mountPath"]
    assert Path(config.logdir).is_relative_to(mount)


def test_k8s_actors_dial_the_service_with_the_token(k8s):
    actor = container(k8s[("Deployment", "actor")])
    config = parse_flags("actor", actor["args"])
    host, port = host_port(config.learner)
    (service_port,) = k8s[("Service", "learner")]["spec"]["ports"]
    assert host == "learner" and port == service_port["port"]
    assert config.num_actors == 1 and config.first_index == -1
    (generator,) = [g for g in k8s[("Kustomization", "")]["secretGenerator"] if "envs" in g]
    for role in ("learner", "actor"):
        (source,) = container(k8s[("Deployment", role)])["envFrom"]
        assert source["secretRef"]["name"] == generator["name"]
    (env_file,) = generator["envs"]
    assert AUTH_TOKEN_ENV in env_file_names(K8S / f"{env_file}.example")


def test_k8s_learner_port_admits_only_the_actor_pods(k8s):
    """A NetworkPolicy lets only actor pods reach the learner's port: a stranger in the
    cluster cannot even open a connection to it (the learner's probes run in its pod)."""
    learner = k8s[("Deployment", "learner")]
    actor = k8s[("Deployment", "actor")]
    policy = k8s[("NetworkPolicy", "learner")]["spec"]
    learner_labels = learner["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= learner_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert set(source) == {"podSelector"}  # this namespace's pods, no namespace or IP block
    actor_labels = actor["spec"]["template"]["metadata"]["labels"]
    assert source["podSelector"]["matchLabels"].items() <= actor_labels.items()
    assert not source["podSelector"]["matchLabels"].items() <= learner_labels.items()
    (port,) = rule["ports"]
    assert port["port"] == parse_flags("learner", container(learner)["args"]).port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "exec" in container(learner)[probe], probe  # inside the pod: no rule needed


# The oldest Kubernetes whose gRPC probes are GA, and the newest schema the package ships.
K8S_VERSIONS = ("1.27.0", "latest")


@pytest.fixture(scope="module")
def kubernetes_validate():
    return pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in dev")


def strict_k8s_errors(validator: Any, doc: dict[str, Any]) -> list[str]:
    """Schema errors of one object against the Kubernetes API types (unknown fields too)."""
    errors = []
    for version in K8S_VERSIONS:
        if version == "latest":
            version = validator.latest_version()
        try:
            validator.validate(doc, version, strict=True)
        except validator.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']} @ {version} {path}: {exc}")
    return errors


def test_k8s_manifests_match_the_api_schemas(k8s, kubernetes_validate):
    """Every field of every object is one the Kubernetes API has, of the right type."""
    objects = [doc for key, doc in k8s.items() if key[0] != "Kustomization"]
    assert len(objects) == 6
    errors = [e for doc in objects for e in strict_k8s_errors(kubernetes_validate, doc)]
    assert not errors, "\n".join(errors)


def test_kustomization_renders_to_valid_objects(kubernetes_validate):
    """`kubectl kustomize` (kustomize built into kubectl) renders what `apply -k` applies."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl installed to render the kustomization")
    env_file, tls = K8S / "seedrl.env", K8S / "tls"
    made_env, made_tls = not env_file.exists(), not tls.exists()
    if made_env:
        env_file.write_text((K8S / "seedrl.env.example").read_text())
    if made_tls:
        assert certs_script().main(["--out", str(tls)]) == 0
    try:
        done = subprocess.run(
            [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
        )
    finally:
        if made_env:
            env_file.unlink()
        if made_tls:
            shutil.rmtree(tls)
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Namespace", "NetworkPolicy",
                     "PersistentVolumeClaim", "Secret", "Secret", "Service"]  # fmt: skip
    for doc in rendered:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "seedrl"
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "seedrl"
    by_name = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in rendered}
    secret = by_name["seedrl-token"]
    assert set(secret["data"]) == {AUTH_TOKEN_ENV}
    assert set(by_name["seedrl-learner-tls"]["data"]) == {"server.pem", "server-key.pem"}
    assert set(by_name["seedrl-ca"]["data"]) == {"ca.pem"}
    for deployment in (d for d in rendered if d["kind"] == "Deployment"):
        # The generated Secret's hashed name is what the pods refer to.
        (source,) = container(deployment)["envFrom"]
        assert source["secretRef"]["name"] == secret["metadata"]["name"]
    errors = [e for doc in rendered for e in strict_k8s_errors(kubernetes_validate, doc)]
    assert not errors, "\n".join(errors)


def test_healthcheck_command_against_a_real_learner(tmp_path):
    """The compose healthcheck's command: 0 while serving (even with a token set), 1 when gone."""
    check = [sys.executable, "-m", "learner", "healthcheck", "--timeout-s", "5"]
    with learner_process(tmp_path, env={AUTH_TOKEN_ENV: "s3cret"}) as (_learner, port):
        for service in ("", SERVICE_NAME):
            with running([*check, "--address", f"127.0.0.1:{port}", "--service", service]) as p:
                assert p.wait(timeout=30) == 0, p.output()
            assert "SERVING" in p.output()
    with running([*check, "--address", f"127.0.0.1:{port}"]) as gone:
        assert gone.wait(timeout=30) == 1, gone.output()


# ---------------------------------------------------------------------- TLS and env allowance


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path (relative to deploy/) of a compose service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = interpolate(volume).split(":")
        if source.startswith("./"):
            mounts[target] = source
    return mounts


def test_compose_serves_tls_with_the_files_make_cluster_writes(compose):
    """The learner's certificate and key, the actors' CA: the files `make cluster` makes
    (deploy/certs.py into deploy/tls), mounted one by one, the CA key and the learner's
    key never where they are not needed; actors and healthcheck dial certified names."""
    learner, actor = compose["services"]["learner"], compose["services"]["actor"]
    learner_config = parse_flags("learner", learner["command"])
    actor_config = parse_flags("actor", actor["command"])
    learner_mounts, actor_mounts = bind_mounts(learner), bind_mounts(actor)
    assert learner_config.tls_cert and learner_config.tls_key and actor_config.tls_ca
    assert learner_mounts[learner_config.tls_cert] == "./tls/server.pem"
    assert learner_mounts[learner_config.tls_key] == "./tls/server-key.pem"
    assert actor_mounts[actor_config.tls_ca] == "./tls/ca.pem"
    assert "./tls/ca-key.pem" not in {*learner_mounts.values(), *actor_mounts.values()}
    assert "./tls/server-key.pem" not in actor_mounts.values()
    health = healthcheck_parser().parse_args(learner["healthcheck"]["test"][5:])
    assert health.tls_ca and learner_mounts[health.tls_ca] == "./tls/ca.pem"
    names = certs_script().DEFAULT_NAMES
    assert host_port(actor_config.learner)[0] in names
    assert host_port(health.address)[0] in names
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^cluster: .*deploy/tls/ca\.pem", makefile, re.M)
    assert re.search(r"^k8s-secret: .*deploy/k8s/tls/ca\.pem", makefile, re.M)
    rule = subprocess.run(
        ["make", "-n", "-B", "deploy/tls/ca.pem"], cwd=ROOT, capture_output=True, text=True
    )
    assert "deploy/certs.py --out deploy/tls" in rule.stdout, rule.stdout + rule.stderr


def k8s_mounted_file(deployment: dict[str, Any], path: str) -> tuple[str, str]:
    """(volume kind, Secret or ConfigMap name) of the volume a container's ``path`` is in."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for mount in container(deployment).get("volumeMounts", []):
        if Path(path).parent == Path(mount["mountPath"]):
            volume = volumes[mount["name"]]
            if "secret" in volume:
                return "secret", volume["secret"]["secretName"]
            if "configMap" in volume:
                return "configMap", volume["configMap"]["name"]
    raise AssertionError(f"{path} is on no Secret or ConfigMap volume")


def test_k8s_serves_tls_from_the_files_make_k8s_secret_writes(k8s):
    """The learner's certificate and key from a Secret only it mounts, readable by the
    image's user alone; the CA, public, from a ConfigMap; all three generated from
    deploy/k8s/tls, never the CA key."""
    kustomization = k8s[("Kustomization", "")]
    generated = {
        (kind, g["name"]): {Path(f).name: f for f in g["files"]}
        for kind, key in (("secret", "secretGenerator"), ("configMap", "configMapGenerator"))
        for g in kustomization[key]
        if "files" in g
    }
    learner, actor = k8s[("Deployment", "learner")], k8s[("Deployment", "actor")]
    learner_config = parse_flags("learner", container(learner)["args"])
    actor_config = parse_flags("actor", container(actor)["args"])
    wanted = [
        (learner, learner_config.tls_cert, "secret"),
        (learner, learner_config.tls_key, "secret"),
        (actor, actor_config.tls_ca, "configMap"),
    ]
    for deployment, path, kind in wanted:
        assert path is not None
        volume = k8s_mounted_file(deployment, path)
        assert volume[0] == kind, path
        assert generated[volume][Path(path).name] == f"tls/{Path(path).name}", path
    sources = {f for files in generated.values() for f in files.values()}
    assert sources == {"tls/server.pem", "tls/server-key.pem", "tls/ca.pem"}, sources
    (secret_volume,) = [v for v in learner["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert secret_volume["secret"]["defaultMode"] == 0o440
    uid = re.search(r"useradd .*--uid (\d+)", DOCKERFILES["learner"].read_text())
    assert uid is not None
    assert learner["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == int(uid[1])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        args = healthcheck_parser().parse_args(container(learner)[probe]["exec"]["command"][4:])
        assert k8s_mounted_file(learner, args.tls_ca) == ("configMap", "seedrl-ca"), probe
    assert host_port(actor_config.learner)[0] in certs_script().DEFAULT_NAMES


def test_secret_files_never_reach_git_or_an_image():
    """The tokens and the TLS files are ignored by git and left out of the build context."""
    private = ["deploy/seedrl.env", "deploy/tls/server-key.pem", "deploy/tls/ca-key.pem",
               "deploy/k8s/seedrl.env", "deploy/k8s/tls/server-key.pem"]  # fmt: skip
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *private], cwd=ROOT, capture_output=True, text=True
    )
    assert done.stdout.split() == private, done.stdout + done.stderr
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in private:
        parts = Path(path).parts
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for pattern in patterns:  # the last pattern that matches decides, as Docker reads it
            negated = pattern.startswith("!")
            if any(fnmatch.fnmatch(c, pattern.lstrip("!")) for c in candidates):
                excluded = not negated
        assert excluded, f"{path} would be sent to docker build"


def test_deployed_actors_build_the_env_their_learner_runs(compose, k8s):
    """Compose, Kubernetes and `make actors` let actors build the env the deployment is
    configured with, module:callable ones included, and no other module."""
    services = compose["services"]
    for env_id in ("CartPole-v1", "mypkg.envs:make"):
        variables = {"SEEDRL_ENV": env_id}
        learner = parse_flags("learner", services["learner"]["command"], variables)
        actor = parse_flags("actor", services["actor"]["command"], variables)
        assert learner.env == env_id
        assert envs.env_allowed(env_id, actor.allow_env_module), env_id
        assert not envs.env_allowed("builtins:open", actor.allow_env_module)
    learner = parse_flags("learner", container(k8s[("Deployment", "learner")])["args"])
    actor = parse_flags("actor", container(k8s[("Deployment", "actor")])["args"])
    assert learner.env in actor.allow_env_module, "actor.yaml names the learner's env"
    for target in ("actors", "evaluate"):
        own = subprocess.run(
            ["make", "-n", target, "ENV=mypkg.envs:make"], cwd=ROOT, capture_output=True, text=True
        )
        assert "--allow-env-module mypkg.envs:make" in own.stdout, own.stdout + own.stderr
        plain = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert "--allow-env-module" not in plain.stdout, plain.stdout
