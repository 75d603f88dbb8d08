--[[
  sync_walk-5.lua: one bounded step of a node-list sync pass's removal walk
  (sync_begin-5.lua): from the pass's cursor, in node-id byte order, at most
  ARGV[2] nodes read and WALK_REMOVALS (16) removed, or fewer once those
  removals dropped WALK_WORK (256) bindings, reservations and artifacts; a
  node not on the pass's list (not in its staging set) leaves, like an
  unregister.  Take steps only once every chunk is staged
  (sync_stage-5.lua).  The steps of replicas that joined one pass share its
  cursor.  The step that ends the walk commits the pass: done, and (a
  static list) stats static_set.

  A pass of an empty static list removes the static nodes only: once the
  static set is whole (stats static_set) it reads the static set
  (SRANDMEMBER: each member read leaves it) until it is empty, so a replica
  starting in heartbeat-registration mode reads no node of the fleet;
  before, the nodes.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     token: the pass's (as sync_begin answered it)
  ARGV[2]     step: nodes read per step, at most (1..10000)

  Returns {done "1"|"0", changed (the pass's so far), removed (the pass's so far)}
  Errors: NO_POLICY (no policy); BADARG (ARGV); SUPERSEDED (not the pass
          under way: another began since, or it expired; nothing written)
  Writes: removals (node:<id> static, and as unregister), static,
          sync-pass (cursor, removed; deleted at the commit), sync-stage:<token>,
          stats static_set, sync_done, sync_done_changed, sync_done_removed
]]
-- @include sync_pass
-- @include nodes
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local token = ARGV[1]
local bad = check_token(token)
if bad then return bad end
local step = tonumber(ARGV[2])
if not step or step < 1 or step > 10000 or step % 1 ~= 0 or #ARGV ~= 2 then
  return fail(ERR.BADARG, 'ARGV[2] (nodes per step): want 1..10000')
end
local pass, refused, committed = load_pass(token)
if refused then return refused end
-- (a replica that joined it ended it)
if committed then return { '1', committed.changed, committed.removed } end
local SKEY, STATIC_KEY = stage_key(token), static_key()
local listed = pass[PASS.listed] == '1'
local whole = redis.call('HGET', STATS_KEY, 'static_set') == '1'
local removed, work, ended = 0, 0, false
local function leave(id)
  redis.call('HSET', node_key(id), 'static', '0')
  work = work + remove_node(ctx, id, now)
  redis.call('SREM', STATIC_KEY, id)
  removed = removed + 1
end
if not listed and whole then
  -- the static nodes leave: each member read leaves the set, until none is left
  for _, id in ipairs(redis.call('SRANDMEMBER', STATIC_KEY, fmt(math.min(step, WALK_REMOVALS)))) do
    if work >= WALK_WORK then break end -- (the rest: the next step's)
    if redis.call('HGET', node_key(id), 'static') == '1' then leave(id) end
    redis.call('SREM', STATIC_KEY, id)
  end
  ended = redis.call('SCARD', STATIC_KEY) == 0
else
  local cursor = pass[PASS.cursor] or ''
  local ids = node_page('', cursor, step)
  ended = #ids < step
  for k, id in ipairs(ids) do
    if listed then
      -- (a listed node stays; read once, it leaves the staging set)
      if redis.call('SREM', SKEY, id) == 0 then leave(id) end
    elseif redis.call('HGET', node_key(id), 'static') == '1' then
      leave(id)
    else
      redis.call('SREM', STATIC_KEY, id)
    end
    cursor = id
    if (removed >= WALK_REMOVALS or work >= WALK_WORK) and k < #ids then
      ended = false
      break
    end
  end
  redis.call('HSET', pass_key(), 'cursor', cursor)
end
if removed > 0 then redis.call('HINCRBY', pass_key(), 'removed', fmt(removed)) end
reindex_touched(ctx, P, now)
-- The pass's counts so far (a layout)
-- @layout COUNTS
local COUNTS = { 'changed', 'removed' }
local totals = redis.call('HMGET', pass_key(), unpack(COUNTS))
redis.call('PEXPIRE', pass_key(), PASS_TTL_MS)
if not ended then
  redis.call('PEXPIRE', SKEY, PASS_TTL_MS)
  return { '0', totals[COUNTS.changed], totals[COUNTS.removed] }
end
-- the pass commits: the node list is the pass's list
if pass[PASS.kind] == 'static' and not whole then
  redis.call('HSET', STATS_KEY, 'static_set', '1')
end
redis.call('DEL', SKEY, pass_key())
redis.call('HSET', STATS_KEY, 'sync_done', token, 'sync_done_changed', totals[COUNTS.changed],
  'sync_done_removed', totals[COUNTS.removed])
return { '1', totals[COUNTS.changed], totals[COUNTS.removed] }
