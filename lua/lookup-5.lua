--[[
  lookup-5.lua: the node bound to a sandbox (LookupNode).  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     sandbox_id

  Returns {node_id, endpoint, expires_ms, reservation_id, listed, now_ms}
  Errors: NOT_FOUND sandbox assignment not found (missing or expired)
]]
-- @include common
local sb = ARGV[1]
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local b = redis.call('HMGET', bind_key(sb), 'node_id', 'endpoint', 'expires_ms', 'reservation_id',
  'listed', 'deleted')
local now = now_ms(P)
local expires = binding_expires({ b[1], b[5], b[3] }, P)
if not b[1] or b[6] == '1' or expires <= now then
  return fail(ERR.NOT_FOUND, 'sandbox assignment not found')
end
return { b[1], b[2] or '', fmt(expires), b[4] or '', b[5] or '0', fmt(now) }
