--[[
  events-5.lua: a node reports sandbox lifecycle events (ReportSandboxEvent).

  CREATE / FORK: the sandbox exists on the node.  Its reservation (the one its
    binding names, or else, if none was ever charged to it, the node's oldest
    unclaimed one) is marked acked, and the node's next heartbeat releases it
    (at once if a roster already listed the sandbox).  The binding is written.
  DELETE: the binding goes (a tombstone stays for binding_ttl).  For a node in roster mode a reservation still
    attached is released (the sandbox will never show in its roster).  In
    counter mode it is not: the creation already moved create_successes, and
    the next heartbeat releases one reservation for it, exactly once.
  PAUSE / RESUME: refresh the binding only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id
  ARGV[2..]   events, two values each: sandbox_id, type (CREATE|DELETE|PAUSE|RESUME|FORK)

  Returns {reservations acked, reservations released, now_ms}
  Errors: UNKNOWN_NODE, BADARG type ..., NO_POLICY (no policy)
  Writes: res:<id> (state acked), node:<node> acked_count, bind:*, node-sbx:<node>
]]
-- @include bindings
local node_id = ARGV[1]

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
if not redis.call('ZSCORE', NODES_KEY, node_id) then
  return fail(ERR.UNKNOWN_NODE, 'node is not in scheduler node list')
end
for i = 2, #ARGV, 2 do
  if not EVENT_TYPES[ARGV[i + 1]] then return fail(ERR.BADARG, 'event_type ' .. tostring(ARGV[i + 1]) .. ' is not known') end
end
local now = now_ms(P)
sweep_expired(ctx, now)
local node = redis.call('HMGET', node_key(node_id), 'endpoint', 'roster_mode')
local endpoint = node[1] or ''
local roster_mode = node[2] == '1'
local acked, released = 0, 0
for i = 2, #ARGV, 2 do
  local sb, kind = ARGV[i], ARGV[i + 1]
  if kind == 'DELETE' then
    local rid = bound_reservation(sb, node_id)
    if rid and roster_mode and end_reservation(ctx, rid, 'released', now) then
      released = released + 1
    end
    bury_binding(ctx, sb, node_id, now, P)
  else
    local creation = kind == 'CREATE' or kind == 'FORK'
    local rid = bound_reservation(sb, node_id)
    if not rid and creation and not charged(sb, node_id) then
      rid = oldest_unclaimed(node_id)
      if rid then redis.call('HSET', res_key(rid), 'sandbox_id', sb, 'assigned_ms', fmt(now)) end
    end
    local listed = listed_on(sb, node_id)
    if rid and creation and listed then
      -- a roster already listed it: the node's numbers include it now
      if end_reservation(ctx, rid, 'released', now) then released = released + 1 end
    elseif rid and creation and redis.call('HGET', res_key(rid), 'state') ~= 'acked' then
      redis.call('HSET', res_key(rid), 'state', 'acked', 'acked_ms', fmt(now))
      redis.call('HINCRBY', node_key(node_id), 'acked_count', '1')
      acked = acked + 1
    end
    write_binding(ctx, sb, node_id, endpoint, listed and '1' or '0', rid, now, P)
  end
end
reindex_touched(ctx, P, now)
return { acked, released, fmt(now) }
