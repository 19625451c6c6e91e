#!/usr/bin/env bash
# checkov (PyPI) in a virtualenv of its own under .venv/checkov: it pins dependencies that conflict with
# the project's (packaging < 24 among them), so it never goes into the dev extra. Created once and kept;
# tests/helm/test_checkov.py calls this when the venv is missing. Idempotent; prints the checkov binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CHECKOV_VERSION=3.3.30
venv=.venv/checkov
if [[ -x $venv/bin/checkov ]] && [[ $("$venv/bin/checkov" --version 2>/dev/null) == "$CHECKOV_VERSION" ]]; then
    echo "$venv/bin/checkov"
    exit 0
fi
python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] && python=.venv/bin/python
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION" >&2
"$venv/bin/checkov" --version >/dev/null
echo "$venv/bin/checkov"
