--[[
  includes/bindings.lua: sandbox -> node bindings, and node removal.
]]
-- @exports write_binding bury_binding buried_on bound_reservation charged
-- @exports listed_on oldest_unclaimed remove_node forget_sweep
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

-- The node's oldest reservation that no sandbox has claimed yet, or nil.
local function oldest_unclaimed(node_id)
  for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), '0', '-1')) do
    if redis.call('HGET', res_key(rid), 'state') == 'pending' then return rid end
  end
  return nil
end

-- The node no longer holds artifact `digest`; an artifact nobody holds
-- leaves the LRU as ForgetP2pArtifact's would (artifact_forget-7.lua; the
-- fixed keys derived here are the same ones, scheduler/keys.py).
local function drop_holding(node_id, digest)
  local akey = BASE .. 'art:' .. digest
  redis.call('SREM', akey, node_id)
  redis.call('SREM', BASE .. 'node-art:' .. node_id, digest)
  if redis.call('EXISTS', akey) == 0 then
    redis.call('ZREM', BASE .. 'art-lru', digest)
    redis.call('HDEL', BASE .. 'art-names', digest)
  end
end

-- The node leaves its cluster's CPU config round (cpu_config-6.lua) without
-- starting a new one; a round nobody is left in goes.
local CFG_FIELDS = { missing = true, epoch = true, result = true, result_epoch = true }
local function leave_cpucfg(node_id, cluster)
  local key = BASE .. 'cpucfg:' .. cluster
  local cur = redis.call('HGET', key, 'm:' .. node_id)
  if cur == '' then redis.call('HINCRBY', key, 'missing', '-1') end
  redis.call('HDEL', key, 'm:' .. node_id, 'sent:' .. node_id)
  if redis.call('HLEN', key) <= 4 then
    for _, f in ipairs(redis.call('HKEYS', key)) do
      if not CFG_FIELDS[f] then return end
    end
    redis.call('DEL', key)
  end
end

-- The node leaves: its bindings, reservations (cancelled), P2P presence and
-- artifacts go.  A node of the static list keeps a bare record (id,
-- endpoint, lingering; and `last_seen_ms` when it is forgotten rather than
-- unregistered, so it stays UNHEALTHY) so it can come back; any other node
-- is forgotten.
local function remove_node(ctx, node_id, now, last_seen)
  local nkey = node_key(node_id)
  for _, key in ipairs({ node_sbx_key(node_id), node_roster_key(node_id) }) do
    for _, sb in ipairs(redis.call('SMEMBERS', key)) do drop_binding(sb, node_id) end
  end
  redis.call('DEL', node_sbx_key(node_id), node_roster_key(node_id))
  for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), '0', '-1')) do
    end_reservation(ctx, rid, 'cancelled', now)
  end
  redis.call('DEL', node_res_key(node_id))
  local n = redis.call('HMGET', nkey, 'cluster_id', 'static', 'endpoint', 'lingering',
    'cpucfg_cluster')
  if n[1] then redis.call('SREM', BASE .. 'p2p:' .. n[1], node_id) end
  if n[5] then leave_cpucfg(node_id, n[5]) end
  redis.call('ZREM', SEEN_KEY, node_id)
  for _, digest in ipairs(redis.call('SMEMBERS', BASE .. 'node-art:' .. node_id)) do
    drop_holding(node_id, digest)
  end
  unindex(ctx, node_id)
  redis.call('DEL', nkey)
  if n[2] == '1' then
    redis.call('HSET', nkey, 'node_id', node_id, 'endpoint', n[3], 'static', '1',
      'lingering', n[4] or '0', last_seen and 'forgotten_ms' or 'unregistered_ms', fmt(now))
    if last_seen then redis.call('HSET', nkey, 'last_seen_ms', fmt(last_seen)) end
  else
    redis.call('ZREM', NODES_KEY, node_id)
  end
end

---------------------------------------------------------------------------
-- Forgetting nodes that went silent
---------------------------------------------------------------------------
-- <base>seen scores every node that heartbeats by a recent full heartbeat.
-- Steady heartbeats (heartbeat_steady-5.lua) do not move it, and a full one
-- only when it lags (seen_lags, includes/base.lua), so a score may lag: the
-- record's last_seen_ms is the truth, read before anything goes.
-- A node silent for node_forget_after is removed as by an unregister; a big
-- one over several calls, FORGET_WORK members at a time.  Before its first
-- member goes, it leaves the index and its roster digest is cleared, so no
-- delta or steady heartbeat can build on a half-removed roster (they RESYNC).
local FORGET_NODES_TEXT = '4' -- silent nodes looked at per call
local FORGET_WORK = 1024 -- bindings (unlisted, then listed), artifacts, reservations dropped per call

-- Drop up to `budget` of the node's members; returns how many went.
local function shed(ctx, node_id, now, budget)
  local spent = 0
  for _, sb in ipairs(redis.call('SRANDMEMBER', node_sbx_key(node_id), budget)) do
    drop_binding(sb, node_id)
    spent = spent + 1
  end
  if spent < budget then
    for _, sb in ipairs(redis.call('SRANDMEMBER', node_roster_key(node_id), budget - spent)) do
      drop_binding(sb, node_id)
      spent = spent + 1
    end
  end
  if spent < budget then
    local arts = BASE .. 'node-art:' .. node_id
    for _, digest in ipairs(redis.call('SRANDMEMBER', arts, budget - spent)) do
      drop_holding(node_id, digest)
      spent = spent + 1
    end
  end
  if spent < budget then
    for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), '0', num_text(budget - spent - 1))) do
      end_reservation(ctx, rid, 'cancelled', now)
      redis.call('ZREM', node_res_key(node_id), rid)
      spent = spent + 1
    end
  end
  return spent
end

-- Forget nodes silent for P.node_forget_after_ms (0: never).  Returns the
-- number of nodes removed in this call.
local function forget_sweep(ctx, P, now)
  if P.node_forget_after_ms <= 0 then return 0 end
  -- only stale nodes go, whatever the setting
  local cutoff = now - math.max(P.node_forget_after_ms, P.report_ttl_ms)
  local due = redis.call('ZRANGEBYSCORE', SEEN_KEY, '-inf', '(' .. fmt(cutoff), 'LIMIT', '0',
    FORGET_NODES_TEXT)
  local budget, removed = FORGET_WORK, 0
  for _, node_id in ipairs(due) do
    if budget <= 0 then break end
    local nkey = node_key(node_id)
    local v = redis.call('HMGET', nkey, 'last_seen_ms', 'forgetting')
    local seen = tonumber(v[1])
    if not seen then
      redis.call('ZREM', SEEN_KEY, node_id)
    elseif seen >= cutoff then
      redis.call('ZADD', SEEN_KEY, fmt(seen), node_id) -- steady heartbeats kept it alive
    else
      if not v[2] then
        unindex(ctx, node_id)
        redis.call('HSET', nkey, 'forgetting', fmt(now), 'idx', '', 'roster_digest', '')
      end
      local spent = shed(ctx, node_id, now, budget)
      budget = budget - spent
      if budget > 0 then
        remove_node(ctx, node_id, now, seen)
        redis.call('HINCRBY', STATS_KEY, 'forgotten_total', '1')
        removed = removed + 1
        budget = budget - 1
      end
    end
  end
  return removed
end
