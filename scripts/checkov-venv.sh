#!/usr/bin/env bash
# checkov (PyPI) in a virtualenv of its own: it pins dependencies that conflict with the project's
# (packaging < 24 among them), so it never goes into the dev extra. It is kept in the user's cache
# ($ELECTOR_CACHE_DIR, else $XDG_CACHE_HOME/elector, else ~/.cache/elector), not in the clone: a
# fresh clone (as CI's) reuses it instead of paying the ~3.5 min install again. Created once under a
# lock (pytest-xdist workers may ask at the same moment), marked complete only when it works.
# tests/helm/test_checkov.py calls this. Idempotent; prints the checkov binary's path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CHECKOV_VERSION=3.3.30
cache=${ELECTOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/elector}
venv=$cache/checkov-$CHECKOV_VERSION
mkdir -p "$cache"
exec 9>"$cache/checkov.lock"
flock 9
if [[ -e $venv/.complete && -x $venv/bin/checkov ]]; then
    echo "$venv/bin/checkov"
    exit 0
fi
python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] && python=.venv/bin/python
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION" >&2
[[ $("$venv/bin/checkov" --version 2>/dev/null) == "$CHECKOV_VERSION" ]] \
    || { echo "checkov-venv: $venv/bin/checkov does not report version $CHECKOV_VERSION" >&2; exit 1; }
touch "$venv/.complete"
echo "$venv/bin/checkov"
