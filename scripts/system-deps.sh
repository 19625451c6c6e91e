#!/usr/bin/env bash
# System packages the tests need beyond .venv: promtool (Debian's prometheus package) to check and
# unit-test the alerting rules. Installed with apt-get when run as root; otherwise a clear error.
# Idempotent; called by `make test` before the tests run.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

say() { printf 'system-deps: %s\n' "$*" >&2; }

if command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "error: promtool is needed to test the Prometheus alerting rules. Install it, then run make test again:
    sudo apt-get install -y --no-install-recommends prometheus     (Debian/Ubuntu; promtool comes with it)"
    exit 1
fi
say "installing promtool (Debian package prometheus, without recommends)"
apt-get update -qq
# The package's service must not start here: policy-rc.d refuses service starts during the install.
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq --no-install-recommends prometheus </dev/null >/dev/null
command -v promtool >/dev/null 2>&1 || { say "error: promtool is still missing after installing prometheus"; exit 1; }
say "promtool: $(promtool --version 2>&1 | head -n 1)"
