--[[
  observed-5.lua: nodes as the node service shows them (ListNodes,
  ListObservedNodes, GetNode).  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id ("" = every node)
  ARGV[2]     cluster_id filter ("" = any cluster)
  ARGV[3]     unheard: "1" = also nodes never heard from (ListNodes),
              "0" = heartbeated only
  ARGV[4]     form: "full" = the whole record, "brief" = node_id, endpoint and
              static ("1": in the static or discovered list) only
  ARGV[5]     after: a page lists from after this node id ("" = from the first)
  ARGV[6]     page: a page reads at most this many nodes ("" = every node;
              a call without it reads every node too)

  Returns {now_ms, next, node...} in node-id byte order;
          node = {field, value, ...} (the raw record or its brief form) plus
          derived_status (Redis time, docs/contract.md rules); next = the
          ARGV[5] of the next page, "" when this one is the last (the client
          stitches pages: docs/contract.md)
  Errors: NO_POLICY (no policy)
]]
-- @include stages
local one = ARGV[1]
local cluster = ARGV[2]
local with_unseen = ARGV[3] == '1'
local full = ARGV[4] == 'full'
local after = ARGV[5] or ''
local page = tonumber(ARGV[6] or '')

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local ids, following = node_page(one, after, page)
local out = { fmt(now), following }
-- What a row reads of the record besides read_node's fields (a layout:
-- names in the source, positions in the built text)
-- @layout OBSERVED_NODE
local OBSERVED_NODE = { 'cluster_id', 'static' }
for _, id in ipairs(ids) do
  local n = read_node(id)
  local seen = n.last_seen ~= nil
  local f = redis.call('HMGET', node_key(id), unpack(OBSERVED_NODE))
  local c = f[OBSERVED_NODE.cluster_id] or ''
  if (seen or with_unseen) and (cluster == '' or c == cluster) then
    local row
    if full then
      row = redis.call('HGETALL', node_key(id))
    else
      local static = f[OBSERVED_NODE.static] == '1' and '1' or '0'
      row = { 'node_id', id, 'endpoint', n.endpoint, 'static', static }
    end
    row[#row + 1] = 'derived_status'
    row[#row + 1] = derive_status(n, P, now)
    out[#out + 1] = row
  end
end
return out
