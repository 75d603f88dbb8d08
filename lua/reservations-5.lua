--[[
  reservations-5.lua: read reservations.  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id ("" = every node)
  ARGV[2]     reservation_id ("" = all live ones; else that one, ended ones included)

  Returns {reservation...}, oldest first; reservation = {field, value, ...}
          (the record)
]]
-- @include common
local node_id = ARGV[1]
local one = ARGV[2]
local out = {}
if one ~= '' then
  local rec = redis.call('HGETALL', res_key(one))
  if #rec > 0 then out[1] = rec end
  return out
end
local ids
if node_id ~= '' then
  ids = redis.call('ZRANGE', node_res_key(node_id), 0, -1)
else
  ids = {}
  for _, nid in ipairs(redis.call('ZRANGE', NODES_KEY, 0, -1)) do
    for _, rid in ipairs(redis.call('ZRANGE', node_res_key(nid), 0, -1)) do ids[#ids + 1] = rid end
  end
end
for _, rid in ipairs(ids) do
  local rec = redis.call('HGETALL', res_key(rid))
  if #rec > 0 then out[#out + 1] = rec end
end
return out
