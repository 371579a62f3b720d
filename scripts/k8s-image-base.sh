#!/usr/bin/env bash
# A Debian base image for gpupool's Containerfile where no container registry is reachable
# (docker.io, ghcr.io): debootstrap from Debian's mirror, `podman import` of the result.
#
#   scripts/k8s-image-base.sh            # prints the image's name once it exists (builds it once)
#   scripts/k8s-image-base.sh --print    # prints the name if the image or its cached root exists,
#                                        # else exits 1 (builds nothing)
#   podman build --build-arg BASE="$(scripts/k8s-image-base.sh)" -f deploy/kubernetes/Containerfile .
#
# The root file system (Debian bookworm, minbase, python3 with venv, ca-certificates) is cached
# as ${GPUPOOL_IMAGE_CACHE:-~/.cache/gpupool/image}/debian-<suite>-python3.tar, so it is made
# once per machine; the podman image is imported again from it when podman lost it. Needs root
# and debootstrap (.ci/services.sh installs it). The Containerfile's default base stays the one a
# user would use (python:3.11-slim-bookworm): this is the same Debian with Debian's Python 3.11.
set -euo pipefail

SUITE="${GPUPOOL_IMAGE_SUITE:-bookworm}"
MIRROR="${GPUPOOL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${GPUPOOL_IMAGE_CACHE:-$HOME/.cache/gpupool/image}"
IMAGE="localhost/gpupool-base:debian-$SUITE"
TARBALL="$CACHE/debian-$SUITE-python3.tar"

have_image() { podman image exists "$IMAGE" 2>/dev/null; }

if [ "${1:-}" = "--print" ]; then
    if have_image || [ -s "$TARBALL" ]; then echo "$IMAGE"; exit 0; fi
    echo "no $IMAGE and no cached root at $TARBALL: run scripts/k8s-image-base.sh" >&2
    exit 1
fi

if ! command -v podman >/dev/null 2>&1; then
    echo "error: podman is not installed (apt-get install podman runc)" >&2
    exit 1
fi

if [ ! -s "$TARBALL" ]; then
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "error: debootstrap is not installed (apt-get install debootstrap; .ci/services.sh does)" >&2
        exit 1
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: debootstrap needs root to make the base's root file system" >&2
        exit 1
    fi
    mkdir -p "$CACHE"
    root="$(mktemp -d "$CACHE/root.XXXXXX")"
    trap 'rm -rf "$root"' EXIT
    echo "k8s-image-base: debootstrap $SUITE from $MIRROR (once; a few minutes)" >&2
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
        echo "error: debootstrap failed; see $CACHE/debootstrap.log" >&2
        tail -5 "$CACHE/debootstrap.log" >&2
        exit 1
    }
    # As Debian's own images: no package lists or downloaded packages kept in the layer.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$root" -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
fi

if ! have_image; then
    podman import --change 'CMD ["/bin/bash"]' "$TARBALL" "$IMAGE" >/dev/null
fi
echo "$IMAGE"
