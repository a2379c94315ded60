"""test_image.py - builds the CPU image without a registry (deploy/image/build.sh) and runs it under podman
as Kubernetes would: read-only root, uid 10001, no capabilities, state on a volume, model
mounted read-only. Drives it over HTTP (healthz, one step, metrics, history), runs its
HEALTHCHECK, and stops it with SIGTERM. Skips, saying why, only where podman cannot run a
container on this machine; every wait is bounded and every container, volume and image it
made is removed.
"""
import os
import resource
import shutil
import socket
import subprocess
import time
import uuid

import pytest

from client import Client
from conftest import REPO

BUILD_TIMEOUT_S = 900.0
START_TIMEOUT_S = 60.0
GRACE_S = 30
TOKEN = "image-test-token"
IMAGE_UID = "10001:10001"


def run(cmd, timeout=120.0, check=True):
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s -> exit %d\n%s\n%s" % (" ".join(cmd), p.returncode,
                                                        p.stdout[-4000:], p.stderr[-4000:]))
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def limits():
    """--ulimit values no higher than this process's: podman would otherwise raise them,
    which needs CAP_SYS_RESOURCE."""
    out = []
    for name, res in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(res)
        cap = [v for v in (soft, hard, 8192) if v != resource.RLIM_INFINITY]
        n = min(cap)
        out += ["--ulimit", "%s=%d:%d" % (name, n, n)]
    return out


class Image:
    def __init__(self, tag):
        self.tag = tag
        self.runtime = None
        self.made = []  # ("container"|"volume", name), removed at teardown

    def podman_run(self, *args, timeout=120.0, check=True):
        rt = ["--runtime", self.runtime] if self.runtime else []
        return run(["podman", "run"] + rt + limits() + list(args), timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image(bins):
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip("%s is not installed (deploy/devio.sh setup installs it)" % tool)
    tag = "localhost/devio-test:%s" % uuid.uuid4().hex[:12]
    img = Image(tag)
    try:
        p = run(["bash", str(REPO / "deploy/image/build.sh"), "--bin", str(bins.root),
                 "--tag", tag], timeout=BUILD_TIMEOUT_S)
        assert p.stdout.strip().splitlines()[-1] == tag, p.stdout
        # The first runtime that starts a container here: crun refuses a cgroup v1/v2
        # hybrid with controllers on the v2 side, runc does not.
        tried = []
        for rt in ("runc", None):
            if rt and shutil.which(rt) is None:
                continue
            img.runtime = rt
            p = img.podman_run("--rm", "--network", "none", tag, "--version", check=False)
            if p.returncode == 0 and p.stdout.startswith("devio-server "):
                break
            tried.append("runtime %s: exit %d: %s" % (rt or "default", p.returncode,
                                                       p.stderr.strip()[-600:]))
        else:
            pytest.skip("podman cannot run a container on this machine: " + " | ".join(tried))
        yield img
    finally:
        for kind, name in reversed(img.made):
            run(["podman", kind, "rm", "-f", name], check=False)
        run(["podman", "rmi", "-f", tag], check=False)


def test_image_config(image):
    """The image's own settings: numeric non-root user, health check, state volume, no git."""
    p = run(["podman", "image", "inspect", "--format",
             "{{.Config.User}}|{{json .Config.Healthcheck}}|{{json .Config.Env}}|"
             "{{json .Config.Volumes}}|{{json .Config.Entrypoint}}", image.tag])
    user, health, env, volumes, entry = p.stdout.strip().split("|")
    assert user == IMAGE_UID
    assert "devio-healthcheck" in health, health
    assert "DEVIO_DB=/var/lib/devio/devio.db" in env and "DEVIO_LISTEN=0.0.0.0:8080" in env
    assert "/var/lib/devio" in volumes
    assert entry == '["/usr/local/bin/devio-server"]'
    # Nothing of the work tree but the binaries; the state folder is the user's.
    p = image.podman_run("--rm", "--network", "none", "--entrypoint", "/bin/bash", image.tag,
                         "-c", "find / -xdev \\( -name .git -o -name .devio -o -name '*.c' "
                         "-o -name 'bazel-*' \\) -print; stat -c '%u:%g %a' /var/lib/devio; "
                         "stat -c '%u' /usr/local/bin/devio-server; ls /usr/local/bin")
    lines = p.stdout.split("\n")
    assert lines[0] == "10001:10001 750", p.stdout
    assert lines[1] == "0", p.stdout
    assert sorted(lines[2:-1]) == ["devio-healthcheck", "devio-mkmodel", "devio-ref",
                                   "devio-server"], p.stdout


def test_image_serves_and_stops_on_sigterm(image, tiny_model, contract, tmp_path):
    name = "devio-test-" + uuid.uuid4().hex[:12]
    volume = name + "-state"
    image.made.append(("volume", volume))
    image.made.append(("container", name))
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, 0o644)
    port = free_port()
    # What the Kubernetes manifests ask of the pod: read-only root, no capabilities,
    # no privilege escalation, the state on a volume the image owns, model read-only.
    image.podman_run(
        "-d", "--name", name, "--network", "host", "--read-only", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "-v", "%s:/models/current:ro" % tiny_model,
        "-v", "%s:/etc/devio/token:ro" % token,
        "-v", "%s:/var/lib/devio" % volume,
        "-e", "DEVIO_LISTEN=127.0.0.1:%d" % port,
        image.tag, "--model", "/models/current", "--token-file", "/etc/devio/token",
        "--drain-ms", "10000")

    def logs():
        return run(["podman", "logs", name], check=False).stderr

    c = Client("127.0.0.1", port, contract, token=TOKEN, timeout=30.0)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if c.call("GET", "/healthz").json == {"status": "ok"}:
                break
        except Exception:  # noqa: BLE001 - not up yet; the deadline bounds the wait
            c.close()
        state = run(["podman", "inspect", "--format", "{{.State.Status}}", name]).stdout.strip()
        assert state == "running", "container %s: %s\n%s" % (name, state, logs())
        assert time.monotonic() < deadline, "no /healthz in %.0fs\n%s" % (START_TIMEOUT_S, logs())
        time.sleep(0.2)
    try:
        assert c.call("GET", "/readyz").json == {"status": "ready"}
        # The image's HEALTHCHECK, run on demand (podman's timers need systemd).
        hc = run(["podman", "healthcheck", "run", name], check=False)
        assert hc.returncode == 0, hc.stdout + hc.stderr
        seq = c.create()
        r = c.step({"rows": [{"seq": seq, "tokens": [1, 2, 3], "logits": "last",
                              "sample": {"temperature": 0}}]})
        (row,) = r["rows"]
        assert r["tokens"] == 3 and row["seq"] == seq and row["len"] == 3, r
        assert len(row["tokens"]) == 1, r
        hist = c.tickets()["tickets"]
        assert len(hist) == 1 and hist[0]["status"] == "ok", hist
        text = c.call("GET", "/metrics").raw.decode()
        assert "\ndevio_" in text or text.startswith("devio_"), text[:400]
        c.call("POST", "/v1/sequences", token="wrong", expect=401)
    finally:
        c.close()
    t0 = time.monotonic()
    run(["podman", "stop", "-t", str(GRACE_S), name], timeout=GRACE_S + 30)
    took = time.monotonic() - t0
    st = run(["podman", "inspect", "--format", "{{.State.ExitCode}}", name]).stdout.strip()
    log = logs()
    assert st == "0", "exit %s after SIGTERM\n%s" % (st, log)
    assert took < GRACE_S, "stop took %.1fs of a %ds grace\n%s" % (took, GRACE_S, log)
    assert "draining" in log and "stopped" in log, log
    # The SQLite history outlives the container: it is on the volume, owned by the image's user.
    p = image.podman_run("--rm", "--network", "none", "-v", "%s:/var/lib/devio:ro" % volume,
                         "--entrypoint", "/usr/bin/stat", image.tag, "-c", "%u:%g",
                         "/var/lib/devio/devio.db")
    assert p.stdout.strip() == IMAGE_UID


def test_cuda_image_loads_its_plugin(image, bins, tiny_model):
    """The CUDA recipe builds where the plugin was built, and the plugin loads inside the image:
    with no driver here, --backend auto reports the CUDA runtime's own error and serves on the
    reference, which shows every library the plugin links is in the image."""
    plugin = bins.root / "kernels" / "libdevio-backend-cuda.so"
    if not plugin.is_file():
        pytest.skip("no %s (built only where the CUDA toolkit is)" % plugin)
    tag = image.tag.replace("devio-test:", "devio-test-cuda:")
    try:
        run(["bash", str(REPO / "deploy/image/build.sh"), "--flavour", "cuda", "--bin",
             str(bins.root), "--tag", tag], timeout=BUILD_TIMEOUT_S)
        p = image.podman_run(
            "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
            "-v", "%s:/models/current:ro" % tiny_model, "--entrypoint", "/usr/bin/timeout", tag,
            "-s", "TERM", "5", "/usr/local/bin/devio-server", "--model", "/models/current",
            "--db", "/tmp/devio.db", "--adapters", "/tmp", "--backend", "auto", check=False)
        log = p.stderr
        assert "with backend ref" in log, log
        assert "passed over cuda" in log and "no plugin" not in log, log
        assert "cannot open shared object" not in log, log
    finally:
        run(["podman", "rmi", "-f", tag], check=False)
