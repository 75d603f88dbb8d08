--[[
  reservations-5.lua: read reservations.  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id ("" = every node)
  ARGV[2]     reservation_id ("" = all live ones; else that one, ended ones included)
  ARGV[3]     after: with neither id, a page lists the live reservations of
              the nodes after this node id ("" = from the first)
  ARGV[4]     page: ... of at most this many nodes ("" = every node; a call
              without it reads every node too)

  Returns {next, reservation...}, each node's oldest first, the nodes in
          node-id byte order; reservation = {field, value, ...} (the
          record); next = the ARGV[3] of the next page, "" when this one is
          the last (the client stitches pages: docs/contract.md)
]]
-- @include common
local node_id = ARGV[1]
local one = ARGV[2]
local after = ARGV[3] or ''
local page = tonumber(ARGV[4] or '')
local out = { '' }
if one ~= '' then
  local rec = redis.call('HGETALL', res_key(one))
  if #rec > 0 then out[2] = rec end
  return out
end
local ids
if node_id ~= '' then
  ids = redis.call('ZRANGE', node_res_key(node_id), 0, -1)
else
  local nodes, following = node_page('', after, page)
  out[1] = following
  ids = {}
  for _, nid in ipairs(nodes) do
    for _, rid in ipairs(redis.call('ZRANGE', node_res_key(nid), 0, -1)) do ids[#ids + 1] = rid end
  end
end
for _, rid in ipairs(ids) do
  local rec = redis.call('HGETALL', res_key(rid))
  if #rec > 0 then out[#out + 1] = rec end
end
return out
