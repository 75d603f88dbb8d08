--[[
  includes/bindings.lua: sandbox -> node bindings, and node removal.
]]
-- @include index
---------------------------------------------------------------------------
-- Bindings and node removal
---------------------------------------------------------------------------

-- Bindings.  A binding recorded by an assignment or event (listed "0")
-- expires at its expires_ms field.  A binding listed by its node's roster
-- (listed "1") lives as long as the roster keeps listing it: every heartbeat
-- refreshes it, so it expires binding_ttl after the node's last heartbeat.
-- Heartbeats therefore only touch bindings whose roster membership changed
-- (node-roster:<node> holds the last roster).  Key TTLs only collect garbage.

-- Write (or refresh) sandbox -> node.  `rid` nil keeps the reservation
-- already charged to the sandbox on this node (a sandbox is charged at most
-- once).  Taking a sandbox from another node removes it from that node's sets.
-- `prev`: the binding's {node_id, reservation_id} if the caller just read them.
local function write_binding(sb, node_id, endpoint, listed, rid, now, P, prev)
  local bkey = bind_key(sb)
  prev = prev or redis.call('HMGET', bkey, 'node_id', 'reservation_id')
  if prev[1] and prev[1] ~= node_id then
    redis.call('SREM', node_sbx_key(prev[1]), sb)
    redis.call('SREM', node_roster_key(prev[1]), sb)
  end
  if rid == nil and prev[1] == node_id then rid = prev[2] end
  redis.call('HSET', bkey, 'sandbox_id', sb, 'node_id', node_id, 'endpoint', endpoint,
    'listed', listed, 'reservation_id', rid or '', 'expires_ms', fmt(now + P.binding_ttl_ms),
    'deleted', '0')
  if listed == '1' then
    -- (a binding made just now has no expiry to lift)
    if prev[1] then redis.call('PERSIST', bkey) end
  else
    redis.call('PEXPIRE', bkey, P.binding_ttl_ms)
  end
  redis.call('SADD', node_sbx_key(node_id), sb)
end

-- `owned`: whether the binding names node_id, if the caller read it in this
-- call (nil: read it here).
local function drop_binding(sb, node_id, owned)
  local bkey = bind_key(sb)
  if owned == nil then owned = redis.call('HGET', bkey, 'node_id') == node_id end
  if owned then redis.call('DEL', bkey) end
  redis.call('SREM', node_sbx_key(node_id), sb)
  redis.call('SREM', node_roster_key(node_id), sb)
end

-- The node reported the sandbox deleted: the binding goes, and a tombstone
-- remembers the deletion (and the reservation already charged to the
-- sandbox, if any) for binding_ttl, so that an assignment arriving after it
-- cannot charge a reservation no roster would ever release, nor charge the
-- sandbox twice.
local function bury_binding(sb, node_id, now, P)
  local bkey = bind_key(sb)
  local b = redis.call('HMGET', bkey, 'node_id', 'reservation_id')
  local charged_rid = ''
  if b[1] == node_id then charged_rid = b[2] or '' end
  drop_binding(sb, node_id, b[1] == node_id)
  redis.call('HSET', bkey, 'sandbox_id', sb, 'node_id', node_id, 'deleted', '1',
    'reservation_id', charged_rid, 'expires_ms', fmt(now + P.binding_ttl_ms))
  redis.call('PEXPIRE', bkey, P.binding_ttl_ms)
end

-- Did `node_id` report `sb` deleted within binding_ttl?
local function buried_on(sb, node_id, now)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'deleted', 'expires_ms')
  return b[1] == node_id and b[2] == '1' and (tonumber(b[3]) or 0) > now
end

-- A live reservation of `node_id` attached to binding `sb`, or nil; then what
-- was read, for the caller's next step: the binding's {node_id,
-- reservation_id} (for write_binding) and the reservation's RES_READ fields
-- (for end_reservation).
local function bound_reservation(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'reservation_id')
  if b[1] ~= node_id or not b[2] or b[2] == '' then return nil, b end
  local r = redis.call('HMGET', res_key(b[2]), unpack(RES_READ))
  if LIVE[r[1]] and r[2] == node_id then return b[2], b, r end
  return nil, b
end

-- Has a reservation (live or ended) already been charged to sandbox `sb` on
-- this node?  Then no other reservation may be charged to it.
local function charged(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'reservation_id')
  return b[1] == node_id and b[2] and b[2] ~= ''
end

-- Is `sb` bound to `node_id` and listed by one of its rosters (unexpired)?
local function listed_on(sb, node_id, now, P)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'listed', 'expires_ms')
  return b[1] == node_id and b[2] == '1' and binding_expires(b, P) > now
end

-- The node's oldest reservation that no sandbox has claimed yet, or nil.
local function oldest_unclaimed(node_id)
  for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), 0, -1)) do
    if redis.call('HGET', res_key(rid), 'state') == 'pending' then return rid end
  end
  return nil
end

-- The node leaves: its bindings, reservations (cancelled), P2P presence and
-- artifacts go.  A node of the static list keeps a bare record (id,
-- endpoint, lingering) so it can come back; any other node is forgotten.
local function remove_node(node_id, now)
  local nkey = node_key(node_id)
  for _, sb in ipairs(redis.call('SMEMBERS', node_sbx_key(node_id))) do
    drop_binding(sb, node_id)
  end
  redis.call('DEL', node_sbx_key(node_id), node_roster_key(node_id))
  for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), 0, -1)) do
    end_reservation(rid, 'cancelled', now)
  end
  redis.call('DEL', node_res_key(node_id))
  local n = redis.call('HMGET', nkey, 'cluster_id', 'static', 'endpoint', 'lingering')
  if n[1] then redis.call('SREM', BASE .. 'p2p:' .. n[1], node_id) end
  local arts = BASE .. 'node-art:' .. node_id
  for _, digest in ipairs(redis.call('SMEMBERS', arts)) do
    redis.call('SREM', BASE .. 'art:' .. digest, node_id)
  end
  redis.call('DEL', arts)
  unindex(node_id)
  redis.call('DEL', nkey)
  if n[2] == '1' then
    redis.call('HSET', nkey, 'node_id', node_id, 'endpoint', n[3], 'static', '1',
      'lingering', n[4] or '0', 'unregistered_ms', fmt(now))
  else
    redis.call('ZREM', NODES_KEY, node_id)
  end
end
