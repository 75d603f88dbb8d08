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
-- What a row reads of a record (layouts): the brief form's fields, and
-- those the status is derived from; the full form reads the whole record
-- (HGETALL) and takes the same ones from it.  (Not read_node: a row needs
-- none of the numbers, and reading them cost ListNodes about 20 us a node.)
-- @layout BRIEF_READ
local BRIEF_READ = { 'endpoint', 'static', 'cluster_id', 'last_seen_ms', 'lingering', 'status' }
local FROM_RECORD = { cluster_id = true, last_seen_ms = true, lingering = true, status = true }
for _, id in ipairs(ids) do
  local row, c, status, seen
  if full then
    row = redis.call('HGETALL', node_key(id))
    local got = {}
    for i = 1, #row, 2 do
      if FROM_RECORD[row[i]] then got[row[i]] = row[i + 1] end
    end
    c = got.cluster_id or ''
    status, seen = status_of(got.last_seen_ms, got.lingering, got.status, P, now)
  else
    local v = redis.call('HMGET', node_key(id), unpack(BRIEF_READ))
    c = v[BRIEF_READ.cluster_id] or ''
    status, seen = status_of(v[BRIEF_READ.last_seen_ms], v[BRIEF_READ.lingering],
      v[BRIEF_READ.status], P, now)
    row = { 'node_id', id, 'endpoint', v[BRIEF_READ.endpoint] or '', 'static',
      v[BRIEF_READ.static] == '1' and '1' or '0' }
  end
  if (seen or with_unseen) and (cluster == '' or c == cluster) then
    row[#row + 1] = 'derived_status'
    row[#row + 1] = status
    out[#out + 1] = row
  end
end
return out
