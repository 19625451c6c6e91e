"""Batch forms of the lease scripts: one script call runs ACQUIRE, RENEW or RELEASE for many locks.

A daemon holding many locks pays most of a renewal's CPU in the client's per-command path (pool,
pack, parse, one EVALSHA per lock), while the script itself costs Redis a few us. A batch script
carries the calls of many locks in ONE EVALSHA: the per-lock cost becomes the script's work.

The rules are not written twice. Each batch script is the single-lease script's own body (the
text after its shared Lua helpers, see `body_of`), wrapped unchanged as a Lua function
`one(KEYS, ARGV)`: inside it `KEYS[i]` and `ARGV[i]` are that lease's own keys and arguments, its
`return` is that lease's reply. A loop calls it once per lease, in order, inside `pcall`, so:

- every per-lease rule of the single script holds for each lease (owner check, TTL replaced and
  never added to, a lapsed key never re-created, ttl <= 0 refused, the meta, `served` and
  fencing parts of ACQUIRE): it is the same code;
- each lease gets its own reply, as the single call would have answered it: a grant, Held, Lost,
  or an error. An error (a refused argument, a key of the wrong type, any error a `redis.call`
  raises) becomes that lease's element of the reply (a nested error reply) and the loop goes on
  to the next lease: one lease's bad data never fails the others. Writes a lease's call made
  before its error stay, exactly as for the single script (Redis scripts are not rolled back).
- the whole batch is atomic, as each single call is (no other client runs in between).

A change to a single-lease script's body (lease.py) is carried into its batch form by itself.

Calling convention of every batch script (N leases, each with the single script's keys and
arguments, in the single script's order):
    KEYS = keys of lease 1, keys of lease 2, ..., keys of lease N
    ARGV = [keys per lease, arguments per lease, args of lease 1, ..., args of lease N]
Returns an array of N replies, reply i being what the single script returns for lease i (or an
error reply in its place); RENEW_BATCH answers the plain renewal, its most common reply, with
the integer 1 (see `RENEWED`). A malformed call (counts that do not divide the keys and arguments)
fails as a whole, before any lease is touched.

In Redis Cluster every key of one script call must be in ONE slot: the caller batches only
leases whose keys share a slot (see pipeline.py); each lock's keys share its `{<lock>}` tag.
"""

from __future__ import annotations

from elector.backend import protocol
from elector.backend.lua import lease
from elector.backend.lua.common import CALLER_LIB, LIB

__all__ = ["ACQUIRE_BATCH", "BATCH_OF", "RELEASE_BATCH", "RENEWED", "RENEW_BATCH", "body_of"]

#: RENEW_BATCH's reply for a renewal with nothing to report: RENEW's {1, '', 0, '', 0, 0, 0}.
RENEWED = 1

#: The Lua helpers ACQUIRE and RENEW are prefixed with (lease.py), before their body.
_CONTENDER_PREFIX = LIB + protocol.META_LIB + CALLER_LIB


def body_of(script: str, *, prefix: str) -> str:
    """The body of a single-lease script: its text after the shared helpers `prefix`.

    Raises ValueError when the script does not start with them (the helpers of lease.py changed
    and this module was not told): an import-time failure, never a silently different rule.
    """
    if not script.startswith(prefix):
        raise ValueError("a lease script does not start with the Lua helpers its batch form expects")
    return script[len(prefix) :]


#: The loop every batch script runs after `one(KEYS, ARGV)` is defined (see the module doc).
_LOOP = """
local per_keys, per_args = tonumber(ARGV[1]), tonumber(ARGV[2])
if not per_keys or not per_args or per_keys < 1 or per_args < 0
    or per_keys ~= math.floor(per_keys) or per_args ~= math.floor(per_args) then
  return redis.error_reply('ERR elector: a batch needs whole counts of keys and arguments per lease')
end
local count = #KEYS / per_keys
if count ~= math.floor(count) or #ARGV ~= 2 + count * per_args then
  return redis.error_reply('ERR elector: the keys and arguments of a batch do not divide into leases')
end
local replies = {}
for i = 0, count - 1 do
  local keys, args = {}, {}
  for j = 1, per_keys do
    keys[j] = KEYS[i * per_keys + j]
  end
  for j = 1, per_args do
    args[j] = ARGV[2 + i * per_args + j]
  end
  local ok, reply = pcall(one, keys, args)
  if not ok then
    -- A redis.call error is a table {err=...} on Redis 7, a string on 6.2; a Lua error a string.
    if type(reply) == 'table' and reply['err'] then
      reply = redis.error_reply(reply['err'])
    else
      reply = redis.error_reply(tostring(reply))
    end
  end
  replies[i + 1] = compact(reply)
end
return replies
"""

#: `compact(reply)` of a batch whose replies go as they are.
_AS_THEY_ARE = "local function compact(reply)\n  return reply\nend\n"

#: `compact(reply)` of RENEW_BATCH: the plain renewal (nothing to report: no handoff, no rival,
#: no identity clash),
#: by far the most common reply, is the integer 1 instead of a six-element array, so the client
#: parses one element per lease instead of seven (most of a batched renewal's client CPU).
_RENEWED_AS_ONE = """local function compact(reply)
  if type(reply) == 'table' and reply[1] == 1 and reply[2] == '' and reply[4] == ''
      and (reply[7] or 0) == 0 then
    return 1
  end
  return reply
end
"""


def _batch(helpers: str, body: str, *, compact: str = _AS_THEY_ARE) -> str:
    return helpers + compact + "local function one(KEYS, ARGV)\n" + body + "\nend\n" + _LOOP


#: ACQUIRE (lease.py) for many locks: per lease the keys and arguments of ACQUIRE (8 or 9 keys, 7
#: or 8 arguments), per lease its reply ({1, token, value} granted, {0, ..} held, {2, ..} quiet period,
#: {3, ..} stand back, {4, ..} unknown protocol, or an error).
ACQUIRE_BATCH = _batch(_CONTENDER_PREFIX, body_of(lease.ACQUIRE, prefix=_CONTENDER_PREFIX))

#: RENEW (lease.py) for many locks: per lease the keys and arguments of RENEW (5 or 6 keys, 4 or 5
#: arguments), per lease its reply ({1, ..} renewed, {0, value, pttl, clash} lost, or an error),
#: except that a renewal with nothing to report ({1, '', 0, '', 0, 0, 0}) is answered 1 (`RENEWED`).
RENEW_BATCH = _batch(
    _CONTENDER_PREFIX, body_of(lease.RENEW, prefix=_CONTENDER_PREFIX), compact=_RENEWED_AS_ONE
)

#: RELEASE (lease.py) for many locks: per lease the keys and arguments of RELEASE (2 keys, 5
#: arguments), per lease 1 released / 0 not ours (or an error). RELEASE has no helpers.
RELEASE_BATCH = _batch("", lease.RELEASE)

#: The batch form of each single-lease script, by the single script's text.
BATCH_OF = {lease.ACQUIRE: ACQUIRE_BATCH, lease.RENEW: RENEW_BATCH, lease.RELEASE: RELEASE_BATCH}
