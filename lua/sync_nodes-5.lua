--[[
  sync_nodes-5.lua: make the cell's static node list equal the given one.

  Listed nodes are added (or their endpoint updated) and marked static; with
  a non-empty list every other node leaves (like an unregister); with an
  empty list, nodes that were static leave and heartbeat registration rules.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1..]   node_id, endpoint pairs

  Returns {nodes added or changed, nodes removed, now_ms}
  Errors: NO_POLICY (no policy)
  Writes: nodes, node:<id> (node_id, endpoint, static), and removals
]]
-- @include nodes
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local wanted = {}
local changed, removed = 0, 0
for i = 1, #ARGV, 2 do
  local id, endpoint = ARGV[i], ARGV[i + 1]
  wanted[id] = true
  local cur = redis.call('HMGET', node_key(id), 'endpoint', 'static')
  if cur[1] ~= endpoint or cur[2] ~= '1' or not redis.call('ZSCORE', NODES_KEY, id) then
    redis.call('ZADD', NODES_KEY, 0, id)
    redis.call('HSET', node_key(id), 'node_id', id, 'endpoint', endpoint, 'static', '1')
    touch(ctx, id)
    changed = changed + 1
  end
end
for _, id in ipairs(redis.call('ZRANGE', NODES_KEY, 0, -1)) do
  if not wanted[id] then
    local static = redis.call('HGET', node_key(id), 'static') == '1'
    if #ARGV > 0 or static then
      redis.call('HSET', node_key(id), 'static', '0')
      remove_node(ctx, id, now)
      removed = removed + 1
    end
  end
end
reindex_touched(ctx, P, now)
return { changed, removed, fmt(now) }
