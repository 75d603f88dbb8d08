--[[
  settle-5.lua: Redis may have lost placements made just before now (a
  Sentinel failover took a replica that had not received them, or the data
  was lost).  Every node not heard from since must heartbeat again before a
  placement goes to it: its next heartbeat carries what it really runs and
  starts, the lost placements included once the gateways forwarded them.
  For one report TTL; after it, nodes not heard from are stale anyway.
  "Since" is by ingestion: a heartbeat ingested after the mark is stamped
  after it even within the same millisecond (heard_ms, includes/base.lua).

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  ARGV        none

  Returns now_ms, the cell's now (the new settle_ms)
  Errors: NO_POLICY (no policy)
  Writes: policy settle_ms (the index sheds settling nodes through its
          bounded stale sweep, includes/index.lua)
]]
-- @include common
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
if not P.settle_ms or now > P.settle_ms then
  redis.call('HSET', POLICY_KEY, 'settle_ms', fmt(now))
  repack_policy()
end
return fmt(now)
