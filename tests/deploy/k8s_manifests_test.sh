#!/usr/bin/env bash
# The Kubernetes manifests, offline: renders the base, every overlay and a
# GPU + TLS composition with `kubectl kustomize` and validates each with
# deploy/k8s/validate/validate.mjs (schemas + strata's own rules). Then the
# self-test: broken renders the validator must reject, each with its
# expected message, so that a validator that accepts anything fails here.
# Needs kubectl, node and the validator's node_modules (deploy/install-deps.sh).
# Usage: tests/deploy/k8s_manifests_test.sh [--renders | --self-test]   (default: both)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
k8s="$root/deploy/k8s"
validator="$k8s/validate/validate.mjs"
mode="${1:-all}"
case "$mode" in all | --renders | --self-test) ;; *) echo "usage: $0 [--renders | --self-test]" >&2; exit 2 ;; esac

fail() { echo "k8s_manifests_test: FAILED: $*" >&2; exit 1; }
for tool in kubectl node; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH; run deploy/install-deps.sh"
done
[ -f "$k8s/validate/node_modules/kubernetes-models/package.json" ] \
  || fail "deploy/k8s/validate/node_modules is missing; run deploy/install-deps.sh (it runs npm ci there)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# render DIR OUT: kubectl kustomize, failing the test with its message.
render() {
  kubectl kustomize "$1" >"$2" 2>"$tmp/kustomize.err" \
    || fail "kubectl kustomize ${1#"$root"/}: $(cat "$tmp/kustomize.err")"
}

# overlay NAME KUSTOMIZATION: a kustomization in $tmp/NAME, written with
# @K8S@ standing for the path of deploy/k8s relative to it (kustomize takes
# no absolute paths).
overlay() {
  mkdir -p "$tmp/$1"
  local rel
  rel="$(realpath --relative-to="$tmp/$1" "$k8s")"
  printf '%s\n' "${2//@K8S@/$rel}" >"$tmp/$1/kustomization.yaml"
}

# expect_in FILE TEXT: the render carries TEXT (the overlay did its job).
expect_in() { grep -qF -- "$2" "$1" || fail "${1##*/}: expected '$2' in the render"; }

failures=0
if [ "$mode" != --self-test ]; then
  dirs=("$k8s/base")
  for d in "$k8s"/overlays/*/; do dirs+=("${d%/}"); done
  overlay gpu-tls 'resources: [@K8S@/overlays/gpu]
components: [@K8S@/components/tls]'
  dirs+=("$tmp/gpu-tls")
  for dir in "${dirs[@]}"; do
    name="${dir#"$k8s"/}"
    name="${name#"$tmp"/}"
    out="$tmp/render-${name//\//-}.yaml"
    render "$dir" "$out"
    echo "--- $name"
    if ! (cd "$tmp" && node "$validator" "${out##*/}"); then
      failures=$((failures + 1))
    fi
  done
  expect_in "$tmp/render-overlays-cpu.yaml" "sizeLimit: 8Gi"
  expect_in "$tmp/render-overlays-gpu.yaml" "nvidia.com/gpu: 1"
  expect_in "$tmp/render-overlays-gpu.yaml" "storageClassName: local-nvme"
  expect_in "$tmp/render-overlays-tls.yaml" "--tls-cert=/tls/tls.crt"
  # shellcheck disable=SC2016  # the kubelet expands these, not the shell
  expect_in "$tmp/render-overlays-tls.yaml" '$(POD_NAME).strata-worker.$(POD_NAMESPACE).svc:50061'
  expect_in "$tmp/render-overlays-tls-cert-manager.yaml" "kind: Certificate"
  expect_in "$tmp/render-gpu-tls.yaml" "nvidia.com/gpu: 1"
  expect_in "$tmp/render-gpu-tls.yaml" "secretName: strata-worker-tls"
  [ "$failures" -eq 0 ] || fail "$failures render(s) did not validate"
  echo "k8s_manifests_test: ${#dirs[@]} renders valid"
fi

if [ "$mode" != --renders ]; then
  # broken NAME EXPECTED TARGET PATCH: overlays/cpu with one JSON patch
  # (PATCH, on the object TARGET names), or with one more document
  # (TARGET "doc", PATCH the document); the validator must exit 1 with a
  # line containing EXPECTED.
  broken() {
    local name="$1" expected="$2" target="$3" patch="$4"
    if [ "$target" = doc ]; then
      overlay "broken-$name" 'resources: [@K8S@/overlays/cpu]'
    else
      overlay "broken-$name" "resources: [@K8S@/overlays/cpu]
patches:
  - target: {$target}
    patch: '$patch'"
    fi
    render "$tmp/broken-$name" "$tmp/broken-$name.yaml"
    [ "$target" != doc ] || printf -- '---\n%s\n' "$patch" >>"$tmp/broken-$name.yaml"
    local output status=0
    output="$(cd "$tmp" && node "$validator" "broken-$name.yaml" 2>&1)" || status=$?
    if [ "$status" -ne 1 ]; then
      echo "self-test $name: validator exited $status, expected 1; it said:"$'\n'"$output" >&2
      failures=$((failures + 1))
    elif ! grep -qF -- "$expected" <<<"$output"; then
      echo "self-test $name: no line with '$expected'; the validator said:"$'\n'"$output" >&2
      failures=$((failures + 1))
    else
      echo "self-test $name: rejected: $(grep -F -- "$expected" <<<"$output" | head -1)"
    fi
  }
  coordinator='kind: Deployment, name: strata-coordinator'
  worker='kind: StatefulSet, name: strata-worker'
  redis='kind: StatefulSet, name: strata-redis'
  container=/spec/template/spec/containers/0
  broken no-resources \
    'Deployment/strata-coordinator: spec.template.spec.containers[coordinator].resources.limits.cpu: missing' \
    "$coordinator" "[{\"op\": \"remove\", \"path\": \"$container/resources\"}]"
  broken init-no-limits \
    'StatefulSet/strata-worker: spec.template.spec.initContainers[secrets].resources.limits.memory: missing' \
    "$worker" '[{"op": "remove", "path": "/spec/template/spec/initContainers/0/resources/limits"}]'
  broken target-port \
    'Service/strata-coordinator: spec.ports[grpc].targetPort: 50052 matches no containerPort of the selected pods' \
    'kind: Service, name: strata-coordinator' '[{"op": "replace", "path": "/spec/ports/0/targetPort", "value": 50052}]'
  broken selector \
    'Service/strata-worker: spec.selector: {"app.kubernetes.io/component":"wroker","app.kubernetes.io/name":"strata"} matches no pod template' \
    'kind: Service, name: strata-worker' '[{"op": "replace", "path": "/spec/selector/app.kubernetes.io~1component", "value": "wroker"}]'
  broken replicas-string \
    'Deployment/strata-coordinator: spec.replicas: schema: must be integer' \
    "$coordinator" '[{"op": "replace", "path": "/spec/replicas", "value": "two"}]'
  broken unknown-field \
    'StatefulSet/strata-worker: spec.template.spec.containers[worker].readinesProbe: schema: unknown field' \
    "$worker" "[{\"op\": \"move\", \"from\": \"$container/readinessProbe\", \"path\": \"$container/readinesProbe\"}]"
  broken unknown-kind \
    'Widget/w: kind: unknown kind Widget in example.com/v1' \
    doc '{apiVersion: example.com/v1, kind: Widget, metadata: {name: w}}'
  broken beta-api \
    'PodDisruptionBudget/old: apiVersion: policy/v1beta1 is not a GA version; use policy/v1' \
    doc '{apiVersion: policy/v1beta1, kind: PodDisruptionBudget, metadata: {name: old},
          spec: {maxUnavailable: 0, selector: {matchLabels: {app.kubernetes.io/component: worker}}}}'
  broken root-fs \
    'StatefulSet/strata-redis: spec.template.spec.containers[redis].securityContext.readOnlyRootFilesystem: must be true' \
    "$redis" "[{\"op\": \"replace\", \"path\": \"$container/securityContext/readOnlyRootFilesystem\", \"value\": false}]"
  broken no-drop-all \
    'Deployment/strata-coordinator: spec.template.spec.containers[coordinator].securityContext.capabilities.drop: must include ALL' \
    "$coordinator" "[{\"op\": \"remove\", \"path\": \"$container/securityContext/capabilities\"}]"
  broken probe-port \
    'StatefulSet/strata-worker: spec.template.spec.containers[worker].readinessProbe.grpc.port: 50062 is not a declared containerPort' \
    "$worker" "[{\"op\": \"replace\", \"path\": \"$container/readinessProbe/grpc/port\", \"value\": 50062}]"
  # shellcheck disable=SC2016  # $(POD_NAME) is the validator's text, not the shell's
  broken listen-port \
    'StatefulSet/strata-worker: spec.template.spec.containers[worker].args: --listen $(POD_NAME).strata-worker:50071: port 50071 is not a declared containerPort' \
    "$worker" "[{\"op\": \"replace\", \"path\": \"$container/args/2\", \"value\": \"\$(POD_NAME).strata-worker:50071\"}]"
  broken metrics-port \
    'Deployment/strata-coordinator: spec.template.spec.containers[coordinator].args: --metrics-listen 0.0.0.0:9401: port 9401 is not a declared containerPort' \
    "$coordinator" "[{\"op\": \"replace\", \"path\": \"$container/args/10\", \"value\": \"0.0.0.0:9401\"}]"
  broken missing-secret \
    'Secret strata-tokn is neither in the render nor a documented user Secret' \
    "$worker" '[{"op": "replace", "path": "/spec/template/spec/volumes/1/projected/sources/0/secret/name", "value": "strata-tokn"}]'
  broken secret-key \
    'StatefulSet/strata-redis: spec.template.spec.containers[redis].env[REDISCLI_AUTH].valueFrom.secretKeyRef: Secret strata-redis has no key pasword' \
    "$redis" "[{\"op\": \"replace\", \"path\": \"$container/env/0/valueFrom/secretKeyRef/key\", \"value\": \"pasword\"}]"
  broken missing-pvc \
    'Deployment/strata-coordinator: spec.template.spec.volumes[data].persistentVolumeClaim.claimName: PersistentVolumeClaim strata-dat is not in the render' \
    "$coordinator" '[{"op": "replace", "path": "/spec/template/spec/volumes/0/persistentVolumeClaim/claimName", "value": "strata-dat"}]'
  broken service-account \
    'StatefulSet/strata-worker: spec.template.spec.serviceAccountName: ServiceAccount strata-wrker is not in the render' \
    "$worker" '[{"op": "replace", "path": "/spec/template/spec/serviceAccountName", "value": "strata-wrker"}]'
  broken host-memory \
    '--max-host-mib 8192 is not below resources.limits.memory 4Gi' \
    "$worker" "[{\"op\": \"replace\", \"path\": \"$container/env/0/value\", \"value\": \"8192\"}]"
  [ "$failures" -eq 0 ] || fail "$failures broken render(s) not rejected as expected"
  echo "k8s_manifests_test: self-test: all broken renders rejected"
fi
