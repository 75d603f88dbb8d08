--[[
  sync_nodes-5.lua: make the cell's static node list equal the given one.

  Listed nodes are added (or their endpoint updated) and marked static; with
  a non-empty list every other node leaves (like an unregister); with an
  empty list, nodes that were static leave and heartbeat registration rules.

  The static nodes are also kept as a set (<base>static; stats static_set
  once a sync made it whole), so an empty list (a replica starting in
  heartbeat-registration mode, or restoring a cell) reads only the static
  nodes, none in that mode, not the fleet.  A non-empty list still reads
  every node once (every other node leaves); the list itself is at most
  MAX_STATIC_NODES.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1..]   nodes: node_id, endpoint pairs

  Returns {changed (nodes added or changed), removed (nodes), now_ms}
  Errors: NO_POLICY (no policy)
  Writes: nodes, node:<id> (node_id, endpoint, static), static, stats
          static_set, and removals
]]
-- @include nodes
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local STATIC_KEY = BASE .. 'static'
local whole = redis.call('HGET', STATS_KEY, 'static_set') == '1'
-- What it reads of a listed node (a layout)
-- @layout SYNC_NODE
local SYNC_NODE = { 'endpoint', 'static' }
local wanted = {}
local changed, removed = 0, 0
for i = 1, #ARGV, 2 do
  local id, endpoint = ARGV[i], ARGV[i + 1]
  wanted[id] = true
  local cur = redis.call('HMGET', node_key(id), unpack(SYNC_NODE))
  if cur[SYNC_NODE.endpoint] ~= endpoint or cur[SYNC_NODE.static] ~= '1'
      or not redis.call('ZSCORE', NODES_KEY, id) then
    redis.call('ZADD', NODES_KEY, 0, id)
    redis.call('HSET', node_key(id), 'node_id', id, 'endpoint', endpoint, 'static', '1')
    touch(ctx, id)
    changed = changed + 1
  end
end
local others
if #ARGV > 0 or not whole then
  others = redis.call('ZRANGE', NODES_KEY, 0, -1)
else
  others = redis.call('SMEMBERS', STATIC_KEY)
end
for _, id in ipairs(others) do
  if not wanted[id] then
    local static = redis.call('HGET', node_key(id), 'static') == '1'
    if #ARGV > 0 or static then
      redis.call('HSET', node_key(id), 'static', '0')
      remove_node(ctx, id, now)
      removed = removed + 1
    end
    redis.call('SREM', STATIC_KEY, id)
  end
end
-- the static nodes are now exactly the listed ones (one SADD each: no
-- unpack() of a long list)
for i = 1, #ARGV, 2 do redis.call('SADD', STATIC_KEY, ARGV[i]) end
if not whole then redis.call('HSET', STATS_KEY, 'static_set', '1') end
reindex_touched(ctx, P, now)
return { changed, removed, fmt(now) }
