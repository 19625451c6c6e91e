"""ACQUIRE's check for lost data: has a lease its holder may still believe in been lost?

A promotion (failover, failback), an empty restart or an old snapshot can lose the lease key while
its holder still believes in it; ACQUIRE then starts a quiet period instead of granting (see its
doc in lease.py, and docs/protocol.md for the mixed-fleet rules this check carries).
"""

from __future__ import annotations

#: Lua helpers of ACQUIRE (prepended after protocol.META_LIB; not a script; KEYS as in ACQUIRE).
#:
#: check_data(meta): {run_id=, replid=, last=, lost=}: what the server says of itself (INFO),
#:   the fencing counter's raw value, and whether a lease may have been lost since the last
#:   check (see ACQUIRE's "Quiet period").
#: note_stream(meta): when the meta hash names no replication stream (a lock protocol 1 alone
#:   has used since the hash was lost) and nothing was lost, record the server's replid and
#:   run_id, as a grant would: a later promotion is then seen by its replid.
DATA_LIB = """local function check_data(meta)
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
  local replication = redis.call('INFO', 'replication')
  local replid = string.match(replication, 'master_replid:(%x+)') or ''
  local replid2 = string.match(replication, 'master_replid2:(%x+)') or ''
  local last = redis.call('GET', KEYS[2])
  local recorded = redis.call('GET', KEYS[4])
  local lost = not last or recorded ~= run_id
  if meta and meta.replid then
    if meta.replid ~= replid then
      -- A promotion (failover or failback): this server's data may be behind. Unless protocol
      -- 1 already served the quiet period for this very promotion: the server key holds this
      -- run_id (protocol 1 sets it only when it starts one), protocol 2 recorded another run_id,
      -- and this server was promoted straight out of the recorded stream (master_replid2 is
      -- the replid it had until then). No write of this run_id can have come with the data: the
      -- recorded stream's master wrote its own run_id there with the record and since, so
      -- protocol 1 wrote ours after this promotion. A server key of ours from an earlier
      -- mastership (failover, then failback) is a loss (docs/protocol.md).
      local served = recorded == run_id and meta.run_id and meta.run_id ~= run_id
        and meta.replid == replid2
      if not served then
        lost = true
      end
    end
  elseif not string.match(replid2, '^0+$') then
    -- No stream recorded, and this process has been promoted (a master since its start has no
    -- master_replid2): the server key may be protocol 1's from an earlier mastership of it.
    lost = true
  end
  return {run_id = run_id, replid = replid, last = last, lost = lost}
end
local function note_stream(meta)
  if meta and meta.replid then
    return
  end
  local data = check_data(meta)
  if not data.lost and string.match(data.last, '^%d+$') then
    redis.call('HSET', KEYS[8], 'protocol', PROTOCOL, 'replid', data.replid, 'run_id', data.run_id)
  end
end
"""
