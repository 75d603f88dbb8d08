--[[
  peer_list-5.lua: nodes to fetch P2P artifacts from (ListP2pPeers).  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     cluster_id ("" = every cluster)
  ARGV[2]     backend ("" = every backend)
  ARGV[3]     exclude: a node id to leave out ("" = none)
  ARGV[4]     after: without ids, a page lists from after this node id
              ("" = from the first)
  ARGV[5]     page: ... reading at most this many nodes ("" = every node; a
              call without it reads every node too)
  ARGV[6..]   ids: only these nodes (a page of the cluster's members, as
              peer_members-5.lua listed them and the client sorted them; the
              filters still apply)

  Returns {now_ms, next, peer...} in node-id byte order (with ids: in their
          order); peer = {node_id, backend, address}; next = the ARGV[4] of
          the next page, "" when this one is the last (or with ids)
  Errors: NO_POLICY (no policy)
]]
-- @include common
-- @include peers
local cluster = ARGV[1]
local backend = ARGV[2]
local exclude = ARGV[3]
local after = ARGV[4] or ''
local page = tonumber(ARGV[5] or '')

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local ids
local following = ''
if #ARGV > 5 then
  ids = {}
  for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids, following = node_page('', after, page)
end
local out = { fmt(now), following }
for _, id in ipairs(ids) do
  local row = peer_row(id, P, now, cluster, backend, exclude)
  if row then out[#out + 1] = row end
end
return out
