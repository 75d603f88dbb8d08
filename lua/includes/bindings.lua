--[[
  includes/bindings.lua: sandbox -> node bindings (a node's removal and the
  forgetting of silent nodes: includes/nodes.lua).
]]
-- @exports write_binding drop_binding bury_binding buried_on
-- @exports bound_reservation charged listed_on
-- @include index
---------------------------------------------------------------------------
-- Bindings
---------------------------------------------------------------------------

-- Bindings.  A binding recorded by an assignment or event (listed "0")
-- expires at its expires_ms field.  A binding listed by its node's roster
-- (listed "1") lives as long as the roster keeps listing it: every heartbeat
-- refreshes it, so it expires binding_ttl after the node's last heartbeat.
-- Heartbeats therefore only touch bindings whose roster membership changed
-- (node-roster:<node> holds the last roster).  Key TTLs only collect garbage.
-- A node's bindings are found through two sets: node-roster:<node> holds the
-- listed ones, node-sbx:<node> the others (assignments and events its roster
-- does not list yet), so a sandbox is a member of one set, not two.
-- node-sbx may also hold a sandbox whose binding expired (heartbeats sample
-- it and drop those); whatever removes a node's bindings reads both sets.

-- Write (or refresh) sandbox -> node.  `rid` nil keeps the reservation
-- already charged to the sandbox on this node (a sandbox is charged at most
-- once).  Taking a sandbox from another node removes it from that node's sets.
-- `prev`: the binding's BIND_READ fields if the caller just read them
-- (bound_reservation reads the same).
-- A binding written unlisted joins node-sbx (unless it is this node's
-- unlisted one, a member already); one written listed leaves it, unless it
-- was this node's listed one, never a member (the caller adds a listed one
-- to the roster set).  `sbx`: a list to put sb in for the caller to take out
-- of node-sbx in one call (listed writes only; nil: taken out here).
-- A sandbox that leaves a node's last roster other than by the node's own
-- heartbeat (another node took it, the node reported it deleted) clears the
-- record's roster digest: no delta heartbeat can then build on that roster
-- (includes/heartbeat.lua checks the digest), and the next goes in full.
-- `removed`: what SREM of the roster answered.
local function roster_changed(node_id, removed)
  if removed == 1 then redis.call('HSET', node_key(node_id), 'roster_digest', '') end
end

-- What write_binding and bound_reservation read of a binding (a layout:
-- prev[BIND_READ.node_id], ...).
-- @layout BIND_READ
local BIND_READ = { 'node_id', 'reservation_id', 'deleted', 'listed' }

local function write_binding(ctx, sb, node_id, endpoint, listed, rid, now, P, prev, sbx)
  local bkey = bind_key(sb)
  prev = prev or redis.call('HMGET', bkey, unpack(BIND_READ))
  if prev[BIND_READ.node_id] and prev[BIND_READ.node_id] ~= node_id then
    redis.call('SREM', node_sbx_key(prev[BIND_READ.node_id]), sb)
    roster_changed(prev[BIND_READ.node_id], redis.call('SREM', node_roster_key(prev[BIND_READ.node_id]), sb))
  end
  if rid == nil and prev[BIND_READ.node_id] == node_id then rid = prev[BIND_READ.reservation_id] end
  local expires = instant_text(ctx, now + P.binding_ttl_ms)
  if prev[BIND_READ.node_id] == node_id and prev[BIND_READ.deleted] == '0' then
    -- (this node's live binding: its ids and deleted "0" are written already)
    redis.call('HSET', bkey, 'endpoint', endpoint, 'listed', listed, 'reservation_id', rid or '',
      'expires_ms', expires)
  else
    redis.call('HSET', bkey, 'sandbox_id', sb, 'node_id', node_id, 'endpoint', endpoint,
      'listed', listed, 'reservation_id', rid or '', 'expires_ms', expires, 'deleted', '0')
  end
  if listed == '1' then
    -- (a binding made just now has no expiry to lift)
    if prev[BIND_READ.node_id] then redis.call('PERSIST', bkey) end
  else
    redis.call('PEXPIRE', bkey, num_text(P.binding_ttl_ms))
  end
  -- (this node's live binding: unlisted, a member of node-sbx; listed, not)
  local live = prev[BIND_READ.node_id] == node_id and prev[BIND_READ.deleted] == '0'
  if listed == '1' then
    -- (no live binding: an assignment whose binding expired may be a member)
    if not (live and prev[BIND_READ.listed] == '1') then
      if sbx then sbx[#sbx + 1] = sb else redis.call('SREM', node_sbx_key(node_id), sb) end
    end
  elseif not (live and prev[BIND_READ.listed] ~= '1') then
    redis.call('SADD', node_sbx_key(node_id), sb)
  end
end

-- `owned`: whether the binding names node_id, if the caller read it in this
-- call (nil: read it here).  Returns 1 when sb left the node's roster set.
local function drop_binding(sb, node_id, owned)
  local bkey = bind_key(sb)
  if owned == nil then owned = redis.call('HGET', bkey, 'node_id') == node_id end
  if owned then redis.call('DEL', bkey) end
  redis.call('SREM', node_sbx_key(node_id), sb)
  return redis.call('SREM', node_roster_key(node_id), sb)
end

-- The node reported the sandbox deleted: the binding goes, and a tombstone
-- remembers the deletion (and the reservation already charged to the
-- sandbox, if any) for binding_ttl, so that an assignment arriving after it
-- cannot charge a reservation no roster would ever release, nor charge the
-- sandbox twice.  A live binding of another node stays: that node holds the
-- sandbox now (it moved; the deletion is of this node's copy, or late), and
-- only its own roster or events end its binding.
local function bury_binding(ctx, sb, node_id, now, P)
  local bkey = bind_key(sb)
  local b = redis.call('HMGET', bkey, 'node_id', 'reservation_id', 'deleted')
  roster_changed(node_id, drop_binding(sb, node_id, b[1] == node_id))
  if b[1] and b[1] ~= node_id and b[3] ~= '1' then return end
  local charged_rid = ''
  if b[1] == node_id then charged_rid = b[2] or '' end
  redis.call('HSET', bkey, 'sandbox_id', sb, 'node_id', node_id, 'deleted', '1',
    'reservation_id', charged_rid, 'expires_ms', instant_text(ctx, now + P.binding_ttl_ms))
  redis.call('PEXPIRE', bkey, num_text(P.binding_ttl_ms))
end

-- Did `node_id` report `sb` deleted within binding_ttl?
local function buried_on(sb, node_id, now)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'deleted', 'expires_ms')
  return b[1] == node_id and b[2] == '1' and (tonumber(b[3]) or 0) > now
end

-- A live reservation of `node_id` attached to binding `sb`, or nil; then what
-- was read, for the caller's next step: the binding's fields write_binding
-- takes as `prev` and the reservation's RES_READ fields (for end_reservation).
local function bound_reservation(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), unpack(BIND_READ))
  local rid = b[BIND_READ.reservation_id]
  if b[BIND_READ.node_id] ~= node_id or not rid or rid == '' then return nil, b end
  local r = redis.call('HMGET', res_key(rid), unpack(RES_READ))
  if LIVE[r[RES_READ.state]] and r[RES_READ.node_id] == node_id then return rid, b, r end
  return nil, b
end

-- Has a reservation (live or ended) already been charged to sandbox `sb` on
-- this node?  Then no other reservation may be charged to it.
local function charged(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'reservation_id')
  return b[1] == node_id and b[2] and b[2] ~= ''
end

-- Is `sb` bound to `node_id` and listed by its last roster, so that the
-- node's numbers include it?  However long ago that roster came: a binding
-- that lookups no longer answer (its node silent past binding_ttl) is still
-- in the numbers the node last sent, and a reservation charged to it now
-- would count the sandbox twice.
local function listed_on(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'listed', 'deleted')
  return b[1] == node_id and b[2] == '1' and b[3] ~= '1'
end

