#!/usr/bin/env bash
# Build and cache the real Kubernetes control plane that tests/kube/ runs: kube-apiserver,
# kube-scheduler and kube-controller-manager from the k8s.io/kubernetes module, etcd from
# go.etcd.io/etcd/server/v3 and kwok from sigs.k8s.io/kwok, all through the Go module proxy.
#
# k8s.io/kubernetes is not meant to be required as a module: its go.mod points each staging
# module (k8s.io/api, k8s.io/client-go, ...) at ./staging/src with `replace` lines, which only
# apply inside that repository. So this script writes a small wrapper module that requires
# k8s.io/kubernetes at the version and replaces every staging module with its published v0.x
# twin, the list read from k8s.io/kubernetes's own go.mod, so a new version needs no edit here.
# etcd and kwok get a wrapper module each (their dependency graphs must not mix with the
# control plane's).
#
# Cache: ${GPUPOOL_K8S_CACHE:-$HOME/.cache/gpupool/k8s}/v<k8s version>/bin/, one
# <binary>.version stamp per binary; a binary is rebuilt only when its version (or its stamp)
# changes, so a second run costs a few stat calls. The builds run with `nice -n 19` and
# `go build -p ${GPUPOOL_K8S_BUILD_JOBS:-1}` so a shared machine stays usable.
#
# Usage: scripts/k8s-bins.sh            build what is missing, print the bin folder
#        scripts/k8s-bins.sh --print    print the bin folder only (exit 1 if incomplete)
set -euo pipefail

K8S_VERSION="${GPUPOOL_K8S_VERSION:-1.37.2}"
ETCD_VERSION="${GPUPOOL_ETCD_VERSION:-3.6.17}"
KWOK_VERSION="${GPUPOOL_KWOK_VERSION:-0.8.0}"
JOBS="${GPUPOOL_K8S_BUILD_JOBS:-1}"
ROOT="${GPUPOOL_K8S_CACHE:-$HOME/.cache/gpupool/k8s}/v${K8S_VERSION}"
BIN="$ROOT/bin"
SRC="$ROOT/src"
K8S_BINS=(kube-apiserver kube-scheduler kube-controller-manager)

stamp_ok() {
    # stamp_ok NAME VERSION: the binary exists and was built from VERSION.
    [ -x "$BIN/$1" ] && [ "$(cat "$BIN/$1.version" 2>/dev/null)" = "$2" ]
}

complete() {
    local b
    for b in "${K8S_BINS[@]}"; do stamp_ok "$b" "v$K8S_VERSION" || return 1; done
    stamp_ok etcd "v$ETCD_VERSION" && stamp_ok kwok "v$KWOK_VERSION"
}

if [ "${1:-}" = "--print" ]; then
    complete || exit 1
    echo "$BIN"
    exit 0
fi
if complete; then
    echo "$BIN"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    echo "error: no 'go' on PATH: the Kubernetes binaries are built from Go modules." >&2
    echo "       Install Go 1.26 or newer (https://go.dev/dl/) and run $0 again." >&2
    exit 1
fi
mkdir -p "$BIN" "$SRC"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
gobuild() {
    nice -n 19 go build -p "$JOBS" "$@"
}

build_k8s() {
    local dir="$SRC/kubernetes" gomod
    rm -rf "$dir" && mkdir -p "$dir"
    cd "$dir"
    go mod init gpupool.local/k8sbins >/dev/null 2>&1
    go mod edit -require "k8s.io/kubernetes@v$K8S_VERSION"
    gomod="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
        sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
    # Every `k8s.io/X => ./staging/src/k8s.io/X` of kubernetes' go.mod, at v0.<minor>.<patch>.
    local staging="v0.${K8S_VERSION#*.}" mod
    for mod in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod"); do
        go mod edit -replace "$mod=$mod@$staging"
    done
    cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
    go mod tidy >/dev/null
    # The version the binaries report (kubectl version, /version, kwok's checks).
    local pkg="k8s.io/component-base/version" minor="${K8S_VERSION#*.}"
    minor="${minor%%.*}"
    local ld="-s -w -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    local b
    for b in "${K8S_BINS[@]}"; do
        gobuild -ldflags "$ld" -o "$BIN/$b" "k8s.io/kubernetes/cmd/$b"
        echo "v$K8S_VERSION" >"$BIN/$b.version"
    done
}

build_wrapped() {
    # build_wrapped NAME MODULE VERSION PACKAGE: a one-binary wrapper module.
    local name="$1" module="$2" version="$3" package="$4" dir="$SRC/$1"
    rm -rf "$dir" && mkdir -p "$dir"
    cd "$dir"
    go mod init "gpupool.local/$name" >/dev/null 2>&1
    go mod edit -require "$module@$version"
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$package" >tools.go
    go mod tidy >/dev/null
    gobuild -ldflags "-s -w" -o "$BIN/$name" "$package"
    echo "$version" >"$BIN/$name.version"
}

start=$(date +%s)
stamp_ok etcd "v$ETCD_VERSION" ||
    build_wrapped etcd go.etcd.io/etcd/server/v3 "v$ETCD_VERSION" go.etcd.io/etcd/server/v3
stamp_ok kwok "v$KWOK_VERSION" ||
    build_wrapped kwok sigs.k8s.io/kwok "v$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
for b in "${K8S_BINS[@]}"; do
    if ! stamp_ok "$b" "v$K8S_VERSION"; then
        build_k8s
        break
    fi
done
echo "k8s-bins: built in $(($(date +%s) - start)) s into $BIN ($(du -sh "$BIN" | cut -f1))" >&2
echo "$BIN"
