--[[
  sync_discovered-5.lua: make the cell's node list equal the one a replica
  discovered (Kubernetes EndpointSlices and pod selectors), unless a replica
  already wrote a view at least as fresh in every stream.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1..3]  positions: the writer's watch positions, each a resourceVersion (a decimal
              etcd revision) up to which it has applied one stream: the
              EndpointSlices, the ignore_pod_selector pods, the
              no_schedule_pod_selector pods
  ARGV[4..]   nodes: node_id, endpoint, lingering ("1" / "0") triples

  A write is applied only when none of its positions is below the one the last
  applied write stored (stats fields discovery_rv_1..3): its view then holds
  every change an applied view held, so a node it leaves out is gone and not
  yet unknown to it.  A write behind in any stream changes nothing ("stale").
  Applied: listed nodes are added (or their endpoint and lingering updated)
  and marked static; every other node leaves (like an unregister).

  Returns {outcome "applied" or "stale", changed (nodes added or changed),
           removed (nodes), positions...} (positions: the stored 1, 2, 3)
  Errors: NO_POLICY (no policy); BADARG a position that is not a whole number
  Writes: nodes, node:<id> (node_id, endpoint, static, lingering), static,
          removals,
          stats discovery_rv_1..3
]]
-- @include nodes
-- The positions of discovery stored in stats, in ARGV's order (a layout)
-- @layout DISCOVERY_RV
local DISCOVERY_RV = { 'discovery_rv_1', 'discovery_rv_2', 'discovery_rv_3' }
-- What it reads of a listed node (a layout)
-- @layout DISCOVERED_NODE
local DISCOVERED_NODE = { 'endpoint', 'static', 'lingering' }
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
-- (whole numbers as canonical digit strings: compared exactly, past 2^53 too)
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local stored = redis.call('HMGET', STATS_KEY, unpack(DISCOVERY_RV))
local stale = false
for i = 1, 3 do
  local p = ARGV[i]
  if #p < 1 or #p > 20 or string.find(p, '%D') or (#p > 1 and string.sub(p, 1, 1) == '0') then
    return fail(ERR.BADARG, 'position ' .. i .. ' must be a whole number (a resourceVersion)')
  end
  -- (stored[i]: ARGV[i]'s field, DISCOVERY_RV in ARGV's order)
  if stored[i] and below(p, stored[i]) then stale = true end
end
if stale then
  return { 'stale', 0, 0, stored[DISCOVERY_RV.discovery_rv_1] or '',
    stored[DISCOVERY_RV.discovery_rv_2] or '', stored[DISCOVERY_RV.discovery_rv_3] or '' }
end
redis.call('HSET', STATS_KEY, 'discovery_rv_1', ARGV[1], 'discovery_rv_2', ARGV[2],
  'discovery_rv_3', ARGV[3])
local wanted = {}
local changed, removed = 0, 0
for i = 4, #ARGV, 3 do
  local id, endpoint, lingering = ARGV[i], ARGV[i + 1], ARGV[i + 2] == '1' and '1' or '0'
  wanted[id] = true
  local cur = redis.call('HMGET', node_key(id), unpack(DISCOVERED_NODE))
  if cur[DISCOVERED_NODE.endpoint] ~= endpoint or cur[DISCOVERED_NODE.static] ~= '1'
      or (cur[DISCOVERED_NODE.lingering] or '0') ~= lingering
      or not redis.call('ZSCORE', NODES_KEY, id) then
    redis.call('ZADD', NODES_KEY, 0, id)
    redis.call('HSET', node_key(id), 'node_id', id, 'endpoint', endpoint, 'static', '1',
      'lingering', lingering)
    redis.call('SADD', BASE .. 'static', id) -- (the static set, sync_nodes-5.lua)
    touch(ctx, id)
    changed = changed + 1
  end
end
for _, id in ipairs(redis.call('ZRANGE', NODES_KEY, 0, -1)) do
  if not wanted[id] then
    redis.call('HSET', node_key(id), 'static', '0')
    redis.call('SREM', BASE .. 'static', id)
    remove_node(ctx, id, now)
    removed = removed + 1
  end
end
reindex_touched(ctx, P, now)
return { 'applied', changed, removed, ARGV[1], ARGV[2], ARGV[3] }
