--[[
  peer_list-5.lua: nodes to fetch P2P artifacts from (ListP2pPeers).  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     cluster_id ("" = every cluster)
  ARGV[2]     backend ("" = every backend)
  ARGV[3]     exclude: a node id to leave out ("" = none)

  Returns {now_ms, peer...} in node-id byte order; peer = {node_id, backend, address}
  Errors: NO_POLICY (no policy)
]]
-- @include common
-- @include peers
local cluster = ARGV[1]
local backend = ARGV[2]
local exclude = ARGV[3]

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local ids
if cluster ~= '' then
  ids = sorted_bytes(redis.call('SMEMBERS', BASE .. 'p2p:' .. cluster))
else
  ids = redis.call('ZRANGE', NODES_KEY, 0, -1)
end
local out = { fmt(now) }
for _, id in ipairs(ids) do
  local row = peer_row(id, P, now, cluster, backend, exclude)
  if row then out[#out + 1] = row end
end
return out
