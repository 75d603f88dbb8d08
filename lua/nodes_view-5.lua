--[[
  nodes_view-5.lua: read-only pressure view of every node (writes nothing).

  Computed by the same stages as schedule-5.lua with an empty routing request,
  so status, pressure and verdict here are what Schedule sees.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV        none

  Returns {now_ms, node...}; node = {field, value, ...} with the
  raw record fields, plus derived: derived_status, pressure, known, reason,
  and for each configured ceiling that applies "use:<name>" (current +
  pending) and "limit:<name>".
  Errors: NO_POLICY (no policy)
]]
-- @include stages
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local req = { create = false, count = 0, cpu = 0, mem = 0 }
local out = { fmt(now) }
for _, id in ipairs(redis.call('ZRANGE', NODES_KEY, 0, -1)) do
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
