--[[
  set_lingering-5.lua: mark a node lingering (no new placements) or active.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id
  ARGV[2]     lingering: "1" lingering, "0" active

  Returns {previous value "1"/"0"}
  Errors: UNKNOWN_NODE node is not in scheduler node list
  Writes: node:<id> lingering, and its index entry
]]
-- @include index
local node_id = ARGV[1]
if not redis.call('ZSCORE', NODES_KEY, node_id) then
  return fail(ERR.UNKNOWN_NODE, 'node is not in scheduler node list')
end
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local prev = redis.call('HGET', node_key(node_id), 'lingering') or '0'
redis.call('HSET', node_key(node_id), 'lingering', ARGV[2] == '1' and '1' or '0')
reindex(ctx, node_id, P, now_ms(P))
return { prev }
