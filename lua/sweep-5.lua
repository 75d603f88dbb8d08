--[[
  sweep-5.lua: the cell's bounded sweeps, on their own.  Replicas call it
  every few seconds so that a cell whose calls all take the cheap paths
  (steady heartbeats) still expires reservations, forgets silent nodes and
  takes stale nodes out of the placement index.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV        none

  Returns {forgotten (nodes), expired (reservations), now_ms}
  Errors: NO_POLICY (no policy)
  Writes: what sweep_expired (includes/common.lua) and forget_sweep
          (includes/nodes.lua) write, and the index entries they touch;
          up to 64 stale nodes' index entries (sweep_stale,
          includes/index_moves.lua)
]]
-- @include nodes
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local expired = sweep_expired(ctx, now)
local forgotten = forget_sweep(ctx, P, now)
reindex_touched(ctx, P, now)
-- (nodes whose heartbeat went stale leave the placement index here too, a
-- bounded batch a call, so a cell that places seldom keeps up with a rack
-- gone dark; placements sweep the same way, includes/schedule.lua)
if P.index_format == INDEX_FORMAT then sweep_stale(ctx, P, now) end
return { forgotten, expired, fmt(now) }
