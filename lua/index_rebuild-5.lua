--[[
  index_rebuild-5.lua: one bounded step of the placement index's rebuild
  (includes/index_moves.lua): at most ARGV[2] nodes reindexed, in node-id
  byte order from the stored cursor, under the policy as it now is.  A
  policy change, or a pick that found the index inconsistent, starts a
  rebuild; every replica's monitor takes steps until it ends, and each
  placement one small step.  With no rebuild under way a step takes nodes
  whose heartbeat went stale out of the index instead, STALE_BATCH (64) at
  most (includes/index_moves.lua sweep_stale), and is done when none is
  left: a rack gone dark leaves the index at the monitors' pace, not at
  one sweep every few seconds (least_loaded Schedules on a large fleet are
  refused BEHIND while the picks meet only stale nodes).

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     mode: "step": a step of the rebuild under way (none: nothing),
              or of the drop of an index of another layout (index_format
              "dropping", includes/index_moves.lua UPGRADE) and then the
              rebuild it starts;
              "start": start a new rebuild (the pass starts over), then a step;
              "fresh": the caller dropped every index key and every node's idx
              (schedctl doctor --repair): the index is of this layout and
              empty, so start a rebuild, then a step
  ARGV[2]     step: nodes reindexed per step, at most (1..10000)

  Returns {done, reindexed (nodes this step walked), epoch, cursor}: done 1 when
  the index is whole (no rebuild under way after this step, and no stale
  node listed; a step of a drop is never the last); epoch the
  rebuild's ("" when none ever ran), cursor the last node id it reindexed
  ("" at the start or end of a pass)
  Errors: NO_POLICY (no policy), BADARG (ARGV), PRECONDITION ("start" when the
          index is another layout's: sync_policy upgrades it)
  Writes: index entries (idx-*, node:<id> idx and pending numbers counted
          again; a drop deletes them), idx-rebuild (epoch, cursor, done_ms;
          a drop's drop_cursor, drop_shapes), the policy's
          index_rebuild and packed copy at the start and the end of a pass;
          with none under way, up to 64 stale nodes' index entries
]]
-- @include index
local mode = ARGV[1]
if mode ~= 'step' and mode ~= 'start' and mode ~= 'fresh' then
  return fail(ERR.BADARG, 'ARGV[1] (mode): want step, start or fresh')
end
local budget = tonumber(ARGV[2])
if not budget or budget < 1 or budget > 10000 or budget % 1 ~= 0 then
  return fail(ERR.BADARG, 'ARGV[2] (nodes per step): want 1..10000')
end
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
if mode == 'fresh' then
  redis.call('HDEL', BASE .. 'idx-rebuild', unpack(DROP_STATE)) -- (a drop under way: done)
  redis.call('HSET', POLICY_KEY, 'index_format', INDEX_FORMAT)
  REBUILD.start()
  P = load_policy(ctx)
elseif mode == 'start' then
  if P.index_format ~= INDEX_FORMAT then
    return fail(ERR.PRECONDITION, 'the placement index is of another layout (index_format '
      .. (P.index_format or 'absent') .. '): it is built anew in steps a replica\'s '
      .. 'sync_policy starts')
  end
  REBUILD.start()
  P = load_policy(ctx)
end
local now = now_ms(P)
local done, moved = true, 0
if P.index_format == UPGRADE.DROPPING then
  -- (an index of another layout being dropped: a step of the drop; the
  -- rebuild it then starts is the next step's, so that a step that trims
  -- the old streams does not reindex a whole budget besides: 5.2 ms at
  -- 100,000 nodes when it did)
  moved = select(2, UPGRADE.step(ctx, budget))
  done = false
elseif P.index_format == INDEX_FORMAT and P.index_rebuild then
  done, moved = REBUILD.step(ctx, P, now, budget)
elseif P.index_format == INDEX_FORMAT then
  done, moved = sweep_stale(ctx, P, now)
end
local st = redis.call('HMGET', BASE .. 'idx-rebuild', unpack(REBUILD_STATE))
return { done and 1 or 0, moved, st[REBUILD_STATE.epoch] or '',
  st[REBUILD_STATE.cursor] or '' }
