"""OpenSSL only for TLS: `elector run` without a rediss:// URL runs without libssl and libcrypto.

Most daemons talk to Redis in plain TCP, yet `import ssl` (which asyncio, redis-py and
prometheus_client all do at import time) maps libssl and libcrypto and initialises OpenSSL, and
hashlib loads libcrypto again through `_hashlib`: 4.5 MiB of a daemon's idle RSS, for nothing.

So `run`, once its options are known and before anything imports asyncio, decides: when no
Redis URL is rediss:// (or rediss+sentinel://) and no --redis-tls-* file is given, it calls
`without_openssl()`, which

- blocks `_hashlib`: hashlib and hmac then use CPython's own built-in SHA-1/SHA-256/BLAKE2
  (their documented fall-back when Python has no OpenSSL); the lease code needs only those;
- imports asyncio while `ssl` is blocked, so asyncio takes its own no-ssl path (asking it for
  TLS then fails with asyncio's "Python ssl module is not available");
- then installs a stand-in `ssl` module for the libraries that name ssl's classes at import
  time although they use them only for TLS connections: redis-py 8 (its SSLConnection's
  annotations) and prometheus_client (its TLS helpers' defaults) cannot be imported without
  an `ssl` module. Every name of the stand-in is an inert class: exception names are plain
  exception classes (never raised), anything else raises `TLSNotLoaded` when called.

The library API (`elector.Elector`) never does this: only the CLI process, which knows its
whole configuration before its first import, can promise that TLS will not be needed later.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from pathlib import Path

_TLS_SCHEMES = ("rediss://", "rediss+")


class TLSNotLoaded(RuntimeError):
    """Something asked for TLS in a process started without any TLS configuration."""


def tls_configured(*, urls: Iterable[str | None], files: Iterable[Path | None]) -> bool:
    """Whether any Redis URL asks for TLS or any TLS file is given."""
    if any(file is not None for file in files):
        return True
    return any(url is not None and url.strip().lower().startswith(_TLS_SCHEMES) for url in urls)


class _StandIn(types.ModuleType):
    """The `ssl` module of a process without OpenSSL: any name is an inert class."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)  # dunder look-ups (__path__, __spec__...) must fail normally
        base: type = Exception if name.endswith(("Error", "Exception")) else _Unavailable
        made = type(name, (base,), {"__module__": "ssl"})
        setattr(self, name, made)  # the same class on every look-up
        return made


class _Unavailable:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TLSNotLoaded(
            f"ssl.{type(self).__name__}: TLS was not configured when this process started (no "
            "rediss:// URL, no --redis-tls-* file), so OpenSSL is not loaded"
        )


def without_openssl() -> bool:
    """Run this process without OpenSSL (see the module's doc); False when it is too late,
    because asyncio, ssl or hashlib's OpenSSL part is already imported."""
    if any(name in sys.modules for name in ("asyncio", "ssl", "_ssl", "_hashlib")):
        return False
    sys.modules["_hashlib"] = None  # type: ignore[assignment]  # None: "import fails", by design
    sys.modules["ssl"] = None  # type: ignore[assignment]
    import asyncio  # noqa: F401  # its no-ssl path, taken once and for all

    stand_in = _StandIn("ssl", "Stand-in for ssl in a process without TLS (elector.cli.tls).")
    stand_in.TLSNotLoaded = TLSNotLoaded  # type: ignore[attr-defined]
    sys.modules["ssl"] = stand_in
    return True
