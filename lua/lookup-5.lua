--[[
  lookup-5.lua: the node bound to a sandbox (LookupNode).  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     sandbox_id

  Returns {node_id, endpoint, expires_ms, reservation_id, listed, now_ms}
  Errors: NOT_FOUND sandbox assignment not found (missing or expired),
          CORRUPT a binding whose node_id is missing or expires_ms is no number
]]
-- @include common
-- When does binding {node_id, listed, expires_ms} expire?
local function binding_expires(b, P)
  local expires = tonumber(b[3]) or 0
  if b[2] == '1' and b[1] then
    local seen = tonumber(redis.call('HGET', node_key(b[1]), 'last_seen_ms'))
    if seen and seen + P.binding_ttl_ms > expires then expires = seen + P.binding_ttl_ms end
  end
  return expires
end
local sb = ARGV[1]
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local b = redis.call('HMGET', bind_key(sb), 'node_id', 'endpoint', 'expires_ms', 'reservation_id',
  'listed', 'deleted')
local now = now_ms(P)
-- (a binding whose node or expiry is not one, corrupt state, is refused
-- naming it: never routed to nobody, never taken to expire at 0)
if (b[2] or b[3]) and not b[1] then
  return fail(ERR.CORRUPT, corrupt_text(bind_key(sb), 'node_id', false))
end
if b[3] and not count_ok(tonumber(b[3])) then
  return fail(ERR.CORRUPT, corrupt_text(bind_key(sb), 'expires_ms', b[3], 'an integer >= 0'))
end
local expires = binding_expires({ b[1], b[5], b[3] }, P)
if not b[1] or b[6] == '1' or expires <= now then
  return fail(ERR.NOT_FOUND, 'sandbox assignment not found')
end
return { b[1], b[2] or '', fmt(expires), b[4] or '', b[5] or '0', fmt(now) }
