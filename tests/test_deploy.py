"""deploy/ for production, checked without a Docker engine: the compose file, the Dockerfile, .env.example, and
the README's configuration table, all against the settings class."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.services import ROOT
from worker.settings import Settings
from worker.settings_doc import COMPOSE_INPUTS, REQUIRED_BY_COMPOSE, env_example, env_names, markdown_table

DEPLOY = ROOT / "deploy"
COMPOSE_TEXT = (DEPLOY / "docker-compose.yml").read_text()


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
    return document


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "environment must be a mapping"
    return {str(k): str(v) for k, v in env.items()}


def test_compose_has_every_service_with_its_image() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "neo4j", "extract-worker", "persist-worker", "flower", "api"}
    assert re.fullmatch(r"redis:7(\.\d+)*(-\w+)?", services["redis"]["image"])
    assert re.fullmatch(r"neo4j:5\.26(\.\d+)?-community", services["neo4j"]["image"])
    for name in ("extract-worker", "persist-worker", "flower", "api"):
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert services[name]["depends_on"]["neo4j"]["condition"] == "service_healthy"
    assert services["extract-worker"]["command"][:3] == ["worker", "--queues", "memory.extract"]
    assert services["persist-worker"]["command"][:3] == ["worker", "--queues", "memory.persist"]
    for worker in ("extract-worker", "persist-worker"):  # scalable: no fixed name, no published port
        assert "container_name" not in services[worker] and "ports" not in services[worker]


def test_redis_is_durable_authenticated_and_never_evicts() -> None:
    redis = compose()["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert re.search(r"--requirepass \$\{REDIS_PASSWORD:\?", command)
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "ports" not in redis


def test_redis_has_a_memory_limit_so_noeviction_applies() -> None:
    command = compose()["services"]["redis"]["command"]
    assert "--maxmemory" in command and command[command.index("--maxmemory") + 1]


def test_neo4j_has_auth_volumes_and_no_published_port() -> None:
    neo4j = compose()["services"]["neo4j"]
    auth = environment(neo4j)["NEO4J_AUTH"]
    assert auth.startswith("neo4j/${NEO4J_PASSWORD:?") and auth != "none"
    assert any(v.endswith(":/data") for v in neo4j["volumes"])
    assert "ports" not in neo4j


def test_no_healthcheck_puts_a_password_on_a_command_line() -> None:
    for name, service in compose()["services"].items():
        check = " ".join(service.get("healthcheck", {}).get("test", []))
        assert not re.search(r"(^|\s)(-p|-a|--pass(word)?)(\s|=)", check), (name, check)


def test_workers_get_a_stop_grace_longer_than_their_own_shutdown_grace() -> None:
    grace = Settings.load().shutdown_grace_s
    for name in ("extract-worker", "persist-worker"):
        period = compose()["services"][name]["stop_grace_period"]
        assert period.endswith("s") and float(period[:-1]) > grace, (name, period, grace)


def test_everything_that_listens_requires_credentials() -> None:
    services = compose()["services"]
    workers_env = environment(services["extract-worker"])
    assert "${REDIS_PASSWORD:?" in workers_env["MEMORY_REDIS_URL"]
    assert "${NEO4J_PASSWORD:?" in workers_env["MEMORY_NEO4J_PASSWORD"]
    flower = environment(services["flower"])
    assert flower["MEMORY_FLOWER_USER"].startswith("${MEMORY_FLOWER_USER:?")
    assert flower["MEMORY_FLOWER_PASSWORD"].startswith("${MEMORY_FLOWER_PASSWORD:?")
    assert "--insecure-no-auth" not in services["flower"]["command"]
    api = environment(services["api"])
    assert api["MEMORY_HTTP_TOKEN"].startswith("${MEMORY_HTTP_TOKEN:?")
    assert api["MEMORY_HTTP_AUTH_DISABLED"] == "false"
    for name in ("flower", "api"):
        assert all(str(p).startswith("127.0.0.1:") for p in services[name]["ports"])


def test_every_memory_variable_of_the_compose_file_is_a_setting() -> None:
    known = env_names()
    used = set(re.findall(r"\bMEMORY_[A-Z0-9_]+", COMPOSE_TEXT))
    assert used, "the compose file configures the service through MEMORY_ variables"
    assert used <= known, f"not settings: {sorted(used - known)}"
    referenced = set(re.findall(r"(?<!\$)\$\{([A-Z0-9_]+)", COMPOSE_TEXT))  # $${X} is the container shell's
    assert referenced - known <= set(COMPOSE_INPUTS), "compose inputs must be documented in .env.example"
    assert used >= REQUIRED_BY_COMPOSE


def test_the_image_is_slim_and_runs_as_a_non_root_user() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert bases and bases[-1].endswith("-slim")
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert "uv sync --frozen --no-dev" in dockerfile  # exactly the lock, no dev tools
    assert re.search(r'^ENTRYPOINT \["memctl"\]', dockerfile, re.M)


def test_env_example_documents_every_setting_and_matches_the_generator() -> None:
    text = (DEPLOY / ".env.example").read_text()
    assert text == env_example(), "regenerate with: .venv/bin/memctl config --env > deploy/.env.example"
    for name in env_names() | set(COMPOSE_INPUTS):
        assert re.search(rf"^#? ?{name}[= ]", text, re.M), name


def test_readme_configuration_table_matches_the_settings_class() -> None:
    readme = (ROOT / "README.md").read_text()
    start, end = "<!-- settings-table:start -->\n", "<!-- settings-table:end -->"
    assert start in readme and end in readme
    table = readme.split(start, 1)[1].split(end, 1)[0]
    assert table == markdown_table(), "regenerate with: .venv/bin/memctl config --markdown"
    assert len(table.strip().splitlines()) == len(Settings.model_fields) + 2
