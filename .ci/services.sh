#!/usr/bin/env bash
# Install and start what the test suite needs on a fresh Debian machine where no service runs by
# itself: PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth), Debian's chromium, and the
# container parts (podman with runc, busybox-static for the test images). Idempotent: a second run
# on a machine that has everything only checks. Run as root (CI is); sourced or executed.
set -euo pipefail

APT_UPDATED=0
apt_install() {
    # apt_install PACKAGE...: install the packages that are not installed yet.
    local missing=()
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: cannot install ${missing[*]}: no apt-get on this machine" >&2
        return 1
    fi
    if [ "$APT_UPDATED" -eq 0 ]; then
        apt-get update -q >/dev/null
        APT_UPDATED=1
    fi
    echo "ci: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

start_postgres() {
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null &&
        psql -h 127.0.0.1 -p 5432 -U postgres -w -Atc 'select 1' >/dev/null 2>&1; then
        return 0
    fi
    apt_install postgresql postgresql-contrib
    local version
    version="$(ls /usr/lib/postgresql | sort -V | tail -1)"
    if ! pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -q "^$version main$"; then
        pg_createcluster "$version" main -p 5432 >/dev/null
    fi
    local conf="/etc/postgresql/$version/main"
    # Trust on loopback only: the tests connect as postgres without a password.
    cat >"$conf/pg_hba.conf" <<'EOF'
# written by gpupool's .ci/services.sh: trust on loopback for the test suite
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            trust
EOF
    sed -i -E "s/^#?port = .*/port = 5432/; s/^#?listen_addresses = .*/listen_addresses = 'localhost'/" \
        "$conf/postgresql.conf"
    # max_connections: several servers and agents of the suite each keep a pool.
    sed -i -E "s/^#?max_connections = .*/max_connections = 300/" "$conf/postgresql.conf"
    if pg_ctlcluster --skip-systemctl-redirect "$version" main status >/dev/null 2>&1; then
        pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    else
        pg_ctlcluster --skip-systemctl-redirect "$version" main start
    fi
    local _
    for _ in $(seq 1 30); do
        psql -h 127.0.0.1 -p 5432 -U postgres -w -Atc 'select 1' >/dev/null 2>&1 && return 0
        sleep 1
    done
    echo "error: PostgreSQL does not answer at 127.0.0.1:5432 (user postgres, trust auth):" >&2
    echo "       see /var/log/postgresql/postgresql-$version-main.log" >&2
    return 1
}

install_chromium() {
    [ -n "${GPUPOOL_CHROMIUM:-}" ] && return 0
    apt_install chromium
}

install_containers() {
    # podman runs the container tests as root with runc and cgroupfs (crun refuses this kind of
    # machine's hybrid cgroups); busybox-static is the root file system of the test images.
    apt_install podman runc busybox-static uidmap
    apt_install debootstrap  # the gpupool image's Debian base without a registry (scripts/k8s-image-base.sh)
}

start_postgres
install_chromium
install_containers
# The Kubernetes control plane of tests/kube (built from Go modules, cached; a no-op once built;
# every core on a CI machine, GPUPOOL_K8S_BUILD_JOBS=1 on a shared one).
GPUPOOL_K8S_BUILD_JOBS="${GPUPOOL_K8S_BUILD_JOBS:-$(nproc)}" \
    bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/k8s-bins.sh" >/dev/null
