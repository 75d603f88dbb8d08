--[[
  unregister-5.lua: a node leaves (UnregisterNode).  Idempotent.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id
  ARGV[2]     service_instance_id (must match the node's current one)

  Returns {removed: 1 if a node was removed else 0, now_ms}
  Errors: PRECONDITION service instance mismatch, NO_POLICY (no policy)
  Writes: see remove_node in includes/nodes.lua; and the bounded sweeps
          (expired reservations, forget_sweep)
]]
-- @include nodes
local node_id = ARGV[1]
local sid = ARGV[2]
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
if not redis.call('ZSCORE', NODES_KEY, node_id) then return { 0, fmt(now) } end
local current = redis.call('HGET', node_key(node_id), 'service_instance_id')
if current and current ~= '' and current ~= sid then
  return fail(ERR.PRECONDITION, 'service instance mismatch')
end
remove_node(ctx, node_id, now)
sweep_expired(ctx, now)
forget_sweep(ctx, P, now)
reindex_touched(ctx, P, now)
return { 1, fmt(now) }
