"""The sentiment serving image itself: `make image` builds it for linux/arm64, and it serves one request.

Needs a Docker engine with buildx whose builder lists linux/arm64 (on x86: QEMU's arm64 handler). Where any is
missing, as on this project's build machine and CI (the Docker client alone answers `docker --version` but
`docker info` fails), the test is skipped naming what is missing: CI runs the same entry point from `.venv-image`
(tests/inference/test_server.py), and the Dockerfile's rules are checked below without building.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import REPO_ROOT

DOCKERFILE = REPO_ROOT / "inference" / "sentiment" / "image" / "Dockerfile"
TAG = "sentiment-server:test"


def docker_engine() -> str | None:
    """None when a Docker engine answers, else why not (the skip reason)."""
    if shutil.which("docker") is None:
        return "no docker command"
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                           timeout=60)
    if probe.returncode != 0:
        return f"no Docker engine (docker info: {(probe.stderr.strip().splitlines() or ['failed'])[-1]})"
    buildx = subprocess.run(["docker", "buildx", "inspect"], capture_output=True, text=True, timeout=60)
    if buildx.returncode != 0:
        return f"no docker buildx (docker buildx inspect: {(buildx.stderr.strip().splitlines() or ['failed'])[-1]})"
    platforms = [line for line in buildx.stdout.splitlines() if line.strip().startswith("Platforms:")]
    if platforms and "linux/arm64" not in platforms[0]:
        return f"the buildx builder cannot build linux/arm64 (no QEMU arm64 handler?): {platforms[0].strip()}"
    return None


def test_the_dockerfile_keeps_the_images_rules():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=\S+@sha256:[0-9a-f]{64}$", text, re.M)  # base pinned by digest
    build, final = text.split("\nFROM ", 2)[1:]  # the build stage, then the stage that serves
    assert final.startswith("${BASE_IMAGE}\n")
    # Root, as SageMaker hosting requires, with AWS's words cited (issue 32).
    assert re.search(r"^USER root$", final, re.M) and "USER 10001" not in text
    assert "SageMaker AI expects all containers to run with root users" in final
    assert "sagemaker/latest/dg/your-algorithms-inference-code.html" in final
    assert re.search(r"for tool in gcc cc c\+\+ g\+\+ clang make; do if command -v", final)  # no compilers
    # No pip: the base's removed (and ensurepip's wheel), the venv's removed in the build stage; both checked.
    assert "python -m pip uninstall --yes --quiet pip" in final and "ensurepip/_bundled/*.whl" in final
    assert 'if python -c "import pip"' in final and 'if /opt/venv/bin/python -c "import pip"' in final
    assert "/opt/venv/bin/python -m pip uninstall --yes pip" in build
    # The code and packages are root's and read-only, checked after the chmod.
    assert "COPY --from=build --chown=root:root /opt/venv /opt/venv" in final
    assert "chmod -R a-w,a+rX /opt/venv /opt/server" in final and "! -type l -perm /222" in final
    assert 'ENTRYPOINT ["python", "-m", "inference.sentiment.server"]' in final
    assert final.rstrip().endswith('CMD ["serve"]')
    assert "EXPOSE 8080" in final


def test_the_build_installs_only_hashed_wheels_and_fails_on_the_torch_and_onnxruntime_check():
    build = DOCKERFILE.read_text().split("\nFROM ", 2)[1]
    joined = re.sub(r"\\\n\s*", " ", build)  # continuation lines joined: one line per RUN
    installs = [step for step in re.split(r"&&|\n", joined) if "/opt/venv/bin/pip install" in step]
    assert len(installs) == 2, installs
    for command in installs:
        assert "--require-hashes" in command and "--no-deps" in command and "--only-binary=:all:" in command
    assert "-r /tmp/torch.lock" in installs[0] and "https://download.pytorch.org/whl/cpu" in installs[0]
    assert "-r /tmp/requirements.lock" in installs[1] and "--index-url" not in installs[1]
    assert "/opt/venv/bin/pip check" in build
    # The torch/oneDNN check is a RUN step of its own outcome: nothing may swallow its exit status.
    [check] = [line for line in build.splitlines() if "inference.sentiment.image_check" in line]
    assert check.startswith("RUN /opt/venv/bin/python -m inference.sentiment.image_check --torch-lock /tmp/torch.lock")
    assert "--lock /tmp/requirements.lock" in check  # onnxruntime at the lock's version, or no image (issue 35)
    assert not re.search(r"\|\||; *true|\|\s*true", build)


@pytest.mark.slow
@pytest.mark.skipif(docker_engine() is not None, reason=f"needs a Docker engine with buildx: {docker_engine()}")
def test_make_image_builds_it_and_it_answers_one_request(archive, tmp_path):
    subprocess.run(["make", "--no-print-directory", "image", f"IMAGE_TAG={TAG}"], cwd=REPO_ROOT, check=True,
                   timeout=3600)
    model = tmp_path / "model"
    model.mkdir()
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(model)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(model)], check=True)
    container = subprocess.run(
        ["docker", "run", "--detach", "--rm", "--platform", "linux/arm64", "-p", "127.0.0.1::8080",
         "-v", f"{model}:/opt/ml/model:ro", TAG, "serve"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        port = subprocess.run(["docker", "port", container, "8080"], capture_output=True, text=True,
                              check=True).stdout.split(":")[-1].strip()
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "no 200 from /ping within 10 minutes"
                time.sleep(2)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=b'{"inputs": "what a game"}',
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            [prediction] = json.loads(answer.read())
        assert prediction["label"] in ("negative", "neutral", "positive") and 0 <= prediction["score"] <= 1
    finally:
        stopped = subprocess.run(["docker", "stop", "--time", "30", container], capture_output=True, text=True)
        assert stopped.returncode == 0, stopped.stderr
