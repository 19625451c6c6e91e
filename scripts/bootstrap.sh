#!/usr/bin/env bash
# Set up .venv with elector and its dev tools, on a machine that has only Python >= 3.11 and make.
# Idempotent and non-interactive. Used by `make` (through the .venv/.installed stamp).
#   PYTHON=/path/to/python3.12 scripts/bootstrap.sh   to choose the interpreter
#   VENV=other-dir scripts/bootstrap.sh               to put the environment elsewhere
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 DEBIAN_FRONTEND=noninteractive

say() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
recent_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

find_python() {
    local candidate found=""
    for candidate in ${PYTHON:-} python3.13 python3.12 python3.11 python3; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if recent_enough "$candidate"; then
            command -v "$candidate"
            return 0
        fi
        found+=" $candidate ($(version_of "$candidate" || echo "unknown version") at $(command -v "$candidate"))"
    done
    if [[ -n $found ]]; then
        die "Python >= 3.11 is needed; found only:$found. Install python3.11 or newer (Debian 12: apt-get install python3)."
    fi
    die "Python >= 3.11 is needed and no python3 was found on PATH. Install it (Debian: apt-get install python3 python3-venv)."
}

venv_ok() { [[ -x $VENV/bin/python ]] && recent_enough "$VENV/bin/python" && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }

make_venv() {
    local python=$1 version log
    version=$(version_of "$python")
    log=$(mktemp)
    if "$python" -m venv "$VENV" >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    # Debian's python3 lacks ensurepip unless python3-venv (or python3.X-venv) is installed.
    rm -rf "$VENV"
    if ! grep -qiE 'ensurepip|venv' "$log"; then
        cat "$log" >&2
        rm -f "$log"
        die "'$python -m venv $VENV' failed (see above)."
    fi
    rm -f "$log"
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        die "'$python -m venv' needs the venv module with ensurepip. Install it, then run make again:
    sudo apt-get install -y python3-venv python${version}-venv     (Debian/Ubuntu)"
    fi
    say "installing python${version}-venv with apt-get"
    apt-get update -qq
    apt-get install -y -qq "python${version}-venv" </dev/null || apt-get install -y -qq python3-venv </dev/null
    "$python" -m venv "$VENV" || die "'$python -m venv $VENV' still fails after installing python${version}-venv."
}

if venv_ok; then
    say "using existing $VENV ($("$VENV/bin/python" --version))"
else
    PY=$(find_python)
    if [[ -e $VENV ]]; then
        say "$VENV is unusable (no Python >= 3.11 with pip in it): re-creating it"
        rm -rf "$VENV"
    fi
    say "creating $VENV with $PY ($(version_of "$PY"))"
    make_venv "$PY"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip </dev/null
fi

# uWSGI (in the dev extra: its recipe runs under the real server) has no wheel: pip builds it
# with a C compiler against the Python headers (and libpython), which a bare Debian lacks.
build_tools_ok() {
    command -v gcc >/dev/null 2>&1 && "$VENV/bin/python" -c \
        'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}
if [[ ,$EXTRAS, == *,dev,* ]] && ! build_tools_ok; then
    version=$(version_of "$VENV/bin/python")
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        die "the dev extra builds uWSGI from source: it needs gcc and the Python ${version} headers. Install them, then run make again:
    sudo apt-get install -y gcc python${version}-dev     (Debian/Ubuntu)"
    fi
    say "installing gcc and python${version}-dev with apt-get (uWSGI is built from source)"
    apt-get update -qq
    apt-get install -y -qq gcc "python${version}-dev" </dev/null || apt-get install -y -qq gcc python3-dev </dev/null
fi

say "installing elector with [$EXTRAS] into $VENV (pip log: $VENV/pip-install.log)"
if ! "$VENV/bin/python" -m pip install -e ".[$EXTRAS]" </dev/null >"$VENV/pip-install.log" 2>&1; then
    tail -n 40 "$VENV/pip-install.log" >&2
    die "pip install -e '.[$EXTRAS]' failed (full log: $VENV/pip-install.log)."
fi
say "done: $("$VENV/bin/python" -c 'import elector, sys; print("elector", elector.__version__, "on Python", sys.version.split()[0])')"
