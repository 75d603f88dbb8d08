--[[
  heartbeat_steady-5.lua: a heartbeat in which nothing changed.

  The common case of a healthy fleet, kept cheap: a replica whose last write
  for this node is still the record's (same service instance, incarnation
  and generation), and whose new heartbeat carries the same snapshot and
  roster, only moves the node's clock.  This is exactly what heartbeat-5.lua
  would do with such a heartbeat when no reservation is due to expire and the
  node is in the placement index; otherwise this answers RESYNC and writes
  nothing, and the replica sends the heartbeat in full.  One heartbeat in
  four (by generation) also reads the record's numbers and answers RESYNC
  when one is not a number (corrupt state: the full heartbeat rewrites it).

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id
  ARGV[2]     service_instance_id
  ARGV[3]     base: "<incarnation>:<generation>" the replica last wrote
  ARGV[4]     reported_at (reported_at_unix_ms): "" = unchanged, "0" = stamp
              with Redis time

  Returns {generation, roster_mode 1/0, now_ms, incarnation} or {kind "RESYNC"};
          a heartbeat older than the newest its instance sent writes nothing
          and answers incarnation "" (the replica's next one goes in full)
  Errors: NO_POLICY (no policy)
  Writes: node:<id> last_seen_ms, generation (reported_at_unix_ms), and
          idx-seen when its score lags (includes/base.lua seen_lags)
]]
-- @include heartbeat_steady
local P = load_clock()
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
return steady_one(ctx, ARGV, P)
