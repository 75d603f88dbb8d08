--[[
  sweep-5.lua: the cell's bounded sweeps, on their own.  Replicas call it
  every few seconds so that a cell whose calls all take the cheap paths
  (steady heartbeats) still expires reservations and forgets silent nodes.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV        none

  Returns {forgotten (nodes), expired (reservations), now_ms}
  Errors: NO_POLICY (no policy)
  Writes: what sweep_expired (includes/common.lua) and forget_sweep
          (includes/nodes.lua) write, and the index entries they touch
]]
-- @include nodes
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local expired = sweep_expired(ctx, now)
local forgotten = forget_sweep(ctx, P, now)
reindex_touched(ctx, P, now)
return { forgotten, expired, fmt(now) }
