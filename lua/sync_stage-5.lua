--[[
  sync_stage-5.lua: one chunk of a node-list sync pass's list
  (sync_begin-5.lua): each listed node is added (or its endpoint and, for
  discovery, lingering updated) and marked static as the list says, and
  goes into the static set and the pass's staging set, which the removal
  walk (sync_walk-5.lua) reads.  A listed node takes placements only once
  it heartbeats, as after the whole pass, so a pass cut short after some
  chunks leaves the list's own additions and nothing else that placement
  reads.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     token: the pass's (as sync_begin answered it)
  ARGV[2..]   nodes: node_id, endpoint, lingering triples, at most STAGE_MAX
              (1000); lingering "1", "0", or "" (a static list: left as it is)

  Returns {changed (nodes of this chunk added or changed)}
  Errors: NO_POLICY (no policy); BADARG (ARGV; a pass of an empty list);
          SUPERSEDED (not the pass under way: another began since, or it
          expired; nothing written)
  Writes: nodes, node:<id> (node_id, endpoint, static, lingering), static,
          sync-stage:<token>, sync-pass changed
]]
-- @include sync_pass
-- @include nodes
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local token = ARGV[1]
local bad = check_token(token)
if bad then return bad end
local n = #ARGV - 1
if n % 3 ~= 0 or n / 3 > STAGE_MAX then
  return fail(ERR.BADARG, 'ARGV[2..] (nodes): want at most ' .. STAGE_MAX .. ' triples')
end
for i = 4, #ARGV, 3 do
  local lingering = ARGV[i]
  if lingering ~= '1' and lingering ~= '0' and lingering ~= '' then
    return fail(ERR.BADARG, 'lingering of ' .. ARGV[i - 2] .. ': want 1, 0 or ""')
  end
end
local pass, refused, committed = load_pass(token)
if refused then return refused end
if committed then return { 0 } end -- (a replica that joined it ended it: the list is in)
if pass[PASS.listed] ~= '1' then
  return fail(ERR.BADARG, 'a pass of an empty list stages nothing')
end
local SKEY = stage_key(token)
-- What it reads of a listed node (a layout)
-- @layout LISTED_NODE
local LISTED_NODE = { 'endpoint', 'static', 'lingering' }
local changed = 0
-- (an unchanged listed node is in the static set once the set is whole)
local whole = redis.call('HGET', STATS_KEY, 'static_set') == '1'
for i = 2, #ARGV, 3 do
  local id, endpoint, lingering = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  redis.call('SADD', SKEY, id)
  local cur = redis.call('HMGET', node_key(id), unpack(LISTED_NODE))
  local moved = lingering ~= '' and (cur[LISTED_NODE.lingering] or '0') ~= lingering
  local known = redis.call('ZSCORE', NODES_KEY, id)
  if cur[LISTED_NODE.endpoint] ~= endpoint or cur[LISTED_NODE.static] ~= '1' or moved
      or not known then
    redis.call('ZADD', NODES_KEY, 0, id)
    if lingering ~= '' then
      redis.call('HSET', node_key(id), 'node_id', id, 'endpoint', endpoint, 'static', '1',
        'lingering', lingering)
    else
      redis.call('HSET', node_key(id), 'node_id', id, 'endpoint', endpoint, 'static', '1')
    end
    -- (the index holds no endpoint nor static: only lingering moves a node
    -- there, or a record the node list did not name)
    if moved or not known then touch(ctx, id) end
    changed = changed + 1
    redis.call('SADD', static_key(), id)
  elseif not whole then
    redis.call('SADD', static_key(), id) -- (the set is made whole by a static pass)
  end
end
redis.call('PEXPIRE', SKEY, PASS_TTL_MS)
redis.call('PEXPIRE', pass_key(), PASS_TTL_MS)
if changed > 0 then redis.call('HINCRBY', pass_key(), 'changed', fmt(changed)) end
reindex_touched(ctx, P, now)
return { changed }
