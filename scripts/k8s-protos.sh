#!/usr/bin/env bash
# Regenerate src/gpupool/kube/proto/ (protobuf messages, with .pyi types) from the kubelet's
# published gRPC APIs: DRA v1 (NodePrepareResources...), DRA health v1 and plugin registration
# v1, read from the k8s.io/kubelet Go module at the version the tests run. Needs Go (to fetch the
# module) and grpcio-tools (pip install grpcio-tools, in any environment: only protoc is used).
# The gRPC services are wired by hand in gpupool/kube/grpcapi.py, so no *_grpc.py is generated.
set -euo pipefail
KUBELET_VERSION="${GPUPOOL_KUBELET_API_VERSION:-v0.37.2}"
PYTHON="${PYTHON:-python3}"
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
dir="$(cd "$work" && go mod download -json "k8s.io/kubelet@$KUBELET_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)",*/\1/p')"
mkdir -p "$work/gpupool/kube/proto"
cp "$dir/pkg/apis/dra/v1/api.proto" "$work/gpupool/kube/proto/dra_v1.proto"
cp "$dir/pkg/apis/dra-health/v1/api.proto" "$work/gpupool/kube/proto/drahealth_v1.proto"
cp "$dir/pkg/apis/pluginregistration/v1/api.proto" "$work/gpupool/kube/proto/registration_v1.proto"
out=src/gpupool/kube/proto
rm -f "$out"/*_pb2.py "$out"/*_pb2.pyi
"$PYTHON" -m grpc_tools.protoc -I "$work" --python_out=src --pyi_out=src \
    "$work"/gpupool/kube/proto/*.proto
echo "generated from k8s.io/kubelet@$KUBELET_VERSION into $out"
