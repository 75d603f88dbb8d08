--[[
  includes/bindings.lua: sandbox -> node bindings (a node's removal and the
  forgetting of silent nodes: includes/nodes.lua).
]]
-- @exports write_binding drop_binding bury_binding buried_on
-- @exports bound_reservation end_charge listed_on listed_elsewhere HOLDER_READ
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

-- What write_binding, bury_binding and bound_reservation read of a binding
-- (a layout: prev[BIND_READ.node_id], ...); what buried_on and listed_on
-- read of one; what end_charge reads of the node a charge was on.
-- @layout BIND_READ
local BIND_READ = { 'node_id', 'reservation_id', 'deleted', 'listed' }
-- @layout BURIED_READ
local BURIED_READ = { 'node_id', 'deleted', 'expires_ms' }
-- @layout LISTED_READ
local LISTED_READ = { 'node_id', 'listed', 'deleted' }
-- (what listed_elsewhere reads, and answers for its caller's next step)
-- @layout HOLDER_READ
local HOLDER_READ = { 'node_id', 'listed', 'deleted', 'expires_ms', 'reservation_id' }
-- @layout CHARGED_NODE
local CHARGED_NODE = { 'roster_mode', 'counted_successes' }

-- End the live reservation `rid` charged to a sandbox that `node_id`'s
-- numbers now include (its roster lists it) or that it reported deleted:
-- released, once.  The charge may be another node's (it followed its sandbox
-- here: write_binding); when that node counts by its counter, its baseline
-- moves on by one (deletes_uncounted, as a DELETE's: includes/heartbeat.lua),
-- so the rise that covers the creation there, if it happened there, releases
-- nothing more.  `r`: its RES_READ fields if just read.  True when it ended it.
local function end_charge(ctx, rid, node_id, now, r)
  local of = r and r[RES_READ.node_id] or redis.call('HGET', res_key(rid), 'node_id')
  if not end_reservation(ctx, rid, 'released', now, r) then return false end
  if of and of ~= node_id then
    local f = redis.call('HMGET', node_key(of), unpack(CHARGED_NODE))
    if f[CHARGED_NODE.roster_mode] ~= '1' and f[CHARGED_NODE.counted_successes] then
      redis.call('HINCRBY', node_key(of), 'deletes_uncounted', '1')
    end
  end
  return true
end

-- Taking a live binding from another node (a move: includes/heartbeat.lua,
-- assign-5.lua and events-5.lua decide when one may; only a roster takes a
-- listed one) keeps the sandbox's one charge: with `rid` nil the binding
-- keeps the reservation id charged to it there.  A roster's take (`listed`
-- "1") ends that reservation if still live (this node's numbers include the
-- sandbox now: end_charge); an event's or assignment's leaves it live, to
-- follow the sandbox until a roster lists it or a DELETE ends it.  Returns
-- true when it ended one.
local function write_binding(ctx, sb, node_id, endpoint, listed, rid, now, P, prev, sbx)
  local bkey = bind_key(sb)
  prev = prev or redis.call('HMGET', bkey, unpack(BIND_READ))
  local from = prev[BIND_READ.node_id]
  local ended = false
  if from and from ~= node_id then
    redis.call('SREM', node_sbx_key(from), sb)
    roster_changed(from, redis.call('SREM', node_roster_key(from), sb))
    local was = prev[BIND_READ.reservation_id] or ''
    if prev[BIND_READ.deleted] ~= '1' and was ~= '' then
      if listed == '1' then ended = end_charge(ctx, was, node_id, now) end
      if rid == nil then rid = was end
    end
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
  return ended
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
-- The tombstone keeps `listed` "1" when the node's last roster listed the
-- sandbox: that node's numbers include it (counted there), which an
-- assignment on another node must not count again (assign-5.lua).
local function bury_binding(ctx, sb, node_id, now, P)
  local bkey = bind_key(sb)
  local b = redis.call('HMGET', bkey, unpack(BIND_READ))
  roster_changed(node_id, drop_binding(sb, node_id, b[BIND_READ.node_id] == node_id))
  if b[BIND_READ.node_id] and b[BIND_READ.node_id] ~= node_id and b[BIND_READ.deleted] ~= '1' then
    return
  end
  local charged_rid, listed = '', '0'
  if b[BIND_READ.node_id] == node_id then
    charged_rid = b[BIND_READ.reservation_id] or ''
    listed = b[BIND_READ.listed] == '1' and '1' or '0'
  end
  redis.call('HSET', bkey, 'sandbox_id', sb, 'node_id', node_id, 'deleted', '1', 'listed', listed,
    'reservation_id', charged_rid, 'expires_ms', instant_text(ctx, now + P.binding_ttl_ms))
  redis.call('PEXPIRE', bkey, num_text(P.binding_ttl_ms))
end

-- Did `node_id` report `sb` deleted within binding_ttl?
local function buried_on(sb, node_id, now)
  local b = redis.call('HMGET', bind_key(sb), unpack(BURIED_READ))
  return b[BURIED_READ.node_id] == node_id and b[BURIED_READ.deleted] == '1'
    and (tonumber(b[BURIED_READ.expires_ms]) or 0) > now
end

-- The live reservation charged to `sb` while it is bound to `node_id`
-- (this node's, or another node's that followed the sandbox here:
-- write_binding), or nil; then what was read, for the caller's next step:
-- the binding's fields write_binding takes as `prev` and the reservation's
-- RES_READ fields (for end_reservation / end_charge).
local function bound_reservation(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), unpack(BIND_READ))
  local rid = b[BIND_READ.reservation_id]
  if b[BIND_READ.node_id] ~= node_id or not rid or rid == '' then return nil, b end
  local r = redis.call('HMGET', res_key(rid), unpack(RES_READ))
  if LIVE[r[RES_READ.state]] and r[RES_READ.node_id] then return rid, b, r end
  return nil, b
end

-- Is `sb` bound to `node_id` and listed by its last roster, so that the
-- node's numbers include it?  However long ago that roster came: a binding
-- that lookups no longer answer (its node silent past binding_ttl) is still
-- in the numbers the node last sent, and a reservation charged to it now
-- would count the sandbox twice.
local function listed_on(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), unpack(LISTED_READ))
  return b[LISTED_READ.node_id] == node_id and b[LISTED_READ.listed] == '1'
    and b[LISTED_READ.deleted] ~= '1'
end

-- Another node's listed binding: is `sb` bound to a node other than
-- `node_id` whose last roster listed it, so that that node's numbers include
-- it?  Then no other node's event or assignment takes the sandbox, counts it
-- or charges a reservation to it (docs/design.md, the moves row).  Live, or
-- a tombstone of that node that kept `listed` (bury_binding), until it
-- expires at `now`: its DELETE may be a late one of an instance replaced
-- before the last (events-5.lua applies it) while the sandbox still runs
-- there.  The lister's id or false, then the binding's HOLDER_READ fields.
-- (Not the two-heartbeat rule's question, includes/heartbeat.lua
-- absent_here: there any live binding of another node, listed or not,
-- carries the charge away, and a tombstone is an absence.)
local function listed_elsewhere(sb, node_id, now)
  local b = redis.call('HMGET', bind_key(sb), unpack(HOLDER_READ))
  local by = b[HOLDER_READ.node_id]
  if by and by ~= node_id and b[HOLDER_READ.listed] == '1' and (b[HOLDER_READ.deleted] ~= '1'
      or (tonumber(b[HOLDER_READ.expires_ms]) or 0) > now) then
    return by, b
  end
  return false, b
end

