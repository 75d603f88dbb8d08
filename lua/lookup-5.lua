--[[
  lookup-5.lua: the node bound to a sandbox (LookupNode).  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     sandbox_id

  Returns {node_id, endpoint, expires_ms, reservation_id, listed, now_ms}
  Errors: NOT_FOUND sandbox assignment not found (missing or expired),
          CORRUPT a binding whose node_id is missing or expires_ms is no number
]]
-- @include common
-- What it reads of the binding; what binding_expires reads of it (layouts)
-- @layout LOOKUP_BIND
local LOOKUP_BIND = { 'node_id', 'endpoint', 'expires_ms', 'reservation_id', 'listed', 'deleted' }
-- @layout EXPIRY_OF
local EXPIRY_OF = { 'node_id', 'listed', 'expires_ms' }
-- When does binding b (EXPIRY_OF's fields) expire?
local function binding_expires(b, P)
  local expires = tonumber(b[EXPIRY_OF.expires_ms]) or 0
  if b[EXPIRY_OF.listed] == '1' and b[EXPIRY_OF.node_id] then
    local seen = tonumber(redis.call('HGET', node_key(b[EXPIRY_OF.node_id]), 'last_seen_ms'))
    if seen and seen + P.binding_ttl_ms > expires then expires = seen + P.binding_ttl_ms end
  end
  return expires
end
local sb = ARGV[1]
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local b = redis.call('HMGET', bind_key(sb), unpack(LOOKUP_BIND))
local now = now_ms(P)
-- (a binding whose node or expiry is not one, corrupt state, is refused
-- naming it: never routed to nobody, never taken to expire at 0)
if (b[LOOKUP_BIND.endpoint] or b[LOOKUP_BIND.expires_ms]) and not b[LOOKUP_BIND.node_id] then
  return fail(ERR.CORRUPT, corrupt_text(bind_key(sb), 'node_id', false))
end
if b[LOOKUP_BIND.expires_ms] and not count_ok(tonumber(b[LOOKUP_BIND.expires_ms])) then
  return fail(ERR.CORRUPT,
    corrupt_text(bind_key(sb), 'expires_ms', b[LOOKUP_BIND.expires_ms], 'an integer >= 0'))
end
local expires = binding_expires(
  { b[LOOKUP_BIND.node_id], b[LOOKUP_BIND.listed], b[LOOKUP_BIND.expires_ms] }, P)
if not b[LOOKUP_BIND.node_id] or b[LOOKUP_BIND.deleted] == '1' or expires <= now then
  return fail(ERR.NOT_FOUND, 'sandbox assignment not found')
end
return { b[LOOKUP_BIND.node_id], b[LOOKUP_BIND.endpoint] or '', fmt(expires),
  b[LOOKUP_BIND.reservation_id] or '', b[LOOKUP_BIND.listed] or '0', fmt(now) }
