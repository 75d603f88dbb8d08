--[[
  nodes_view-5.lua: read-only pressure view of every node (writes nothing).

  Computed by the same stages as schedule-5.lua with an empty routing request,
  so status, pressure and verdict here are what Schedule sees.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id ("" = every node)
  ARGV[2]     after: a page lists from after this node id ("" = from the first)
  ARGV[3]     page: a page reads at most this many nodes ("" = every node;
              a call without it reads every node too)

  Returns {now_ms, next, node...} in node-id byte order;
          node = {field, value, ...} with the raw record fields, plus
          derived: derived_status, pressure, known, reason, and for each
          configured ceiling that applies "use:<name>" (current + pending)
          and "limit:<name>"; next = the ARGV[2] of the next page, "" when
          this one is the last (the client stitches pages, as ListNodes':
          docs/contract.md)
  Errors: NO_POLICY (no policy)
]]
-- @include stages
local one = ARGV[1] or ''
local after = ARGV[2] or ''
local page = tonumber(ARGV[3] or '')
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local req = { create = false, count = 0, cpu = 0, mem = 0 }
local ids, following = node_page(one, after, page)
local out = { fmt(now), following }
for _, id in ipairs(ids) do
  local n = evaluate(id, P, req, now)
  local row = redis.call('HGETALL', node_key(id))
  row[#row + 1] = 'derived_status'
  row[#row + 1] = n.status
  row[#row + 1] = 'pressure'
  row[#row + 1] = fmt(n.pressure)
  row[#row + 1] = 'known'
  row[#row + 1] = n.known and '1' or '0'
  row[#row + 1] = 'reason'
  row[#row + 1] = n.reason or ''
  for name, _ in pairs(P.limits) do
    local used = ceiling_use(n, name, req)
    if used ~= nil then
      row[#row + 1] = 'use:' .. name
      row[#row + 1] = fmt(used)
      row[#row + 1] = 'limit:' .. name
      row[#row + 1] = fmt(P.limits[name])
    end
  end
  out[#out + 1] = row
end
return out
