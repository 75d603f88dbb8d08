--[[
  includes/nodes.lua: a node leaves the cell (remove_node: unregistered, or
  not on the static list any more) and nodes silent for node_forget_after are
  forgotten (forget_sweep), with everything they hold: bindings, reservations,
  P2P presence, artifacts, CPU config membership, the index entry.
]]
-- @exports remove_node forget_sweep
-- @include bindings
-- @include art_keys
-- @include cpu_config
---------------------------------------------------------------------------
-- Removing a node
---------------------------------------------------------------------------
-- The node no longer holds artifact `digest`; an artifact nobody holds
-- leaves the LRU as ForgetP2pArtifact's would (artifact_forget-7.lua; the
-- fixed keys derived here are the same ones, scheduler/store/keys.py).
local function drop_holding(node_id, digest)
  local akey = BASE .. 'art:' .. digest
  redis.call('SREM', akey, node_id)
  redis.call('SREM', BASE .. 'node-art:' .. node_id, digest)
  if redis.call('EXISTS', akey) == 0 then
    redis.call('ZREM', BASE .. 'art-lru', digest)
    redis.call('HDEL', BASE .. 'art-names', digest)
    art_key_drop(digest)
  end
end

-- What removing a node reads of it (a layout)
-- @layout REMOVE_READ
local REMOVE_READ = { 'cluster_id', 'static', 'endpoint', 'lingering', 'cpucfg_cluster' }

-- The node leaves: its bindings, reservations (cancelled), P2P presence and
-- artifacts go.  A node of the static list keeps a bare record (id,
-- endpoint, lingering; and `last_seen_ms` when it is forgotten rather than
-- unregistered, so it stays UNHEALTHY) so it can come back; any other node
-- is forgotten.  Returns the bindings, reservations and artifacts it
-- dropped (a caller that removes several bounds its work by them).
local function remove_node(ctx, node_id, now, last_seen)
  local nkey = node_key(node_id)
  local work = 0
  for _, key in ipairs({ node_sbx_key(node_id), node_roster_key(node_id) }) do
    local members = redis.call('SMEMBERS', key)
    for _, sb in ipairs(members) do drop_binding(sb, node_id) end
    work = work + #members
  end
  redis.call('DEL', node_sbx_key(node_id), node_roster_key(node_id))
  local rids = redis.call('ZRANGE', node_res_key(node_id), '0', '-1')
  for _, rid in ipairs(rids) do end_reservation(ctx, rid, 'cancelled', now) end
  work = work + #rids
  redis.call('DEL', node_res_key(node_id), BASE .. 'node-loc:' .. node_id)
  local n = redis.call('HMGET', nkey, unpack(REMOVE_READ))
  if n[REMOVE_READ.cluster_id] then
    redis.call('SREM', BASE .. 'p2p:' .. n[REMOVE_READ.cluster_id], node_id)
  end
  if n[REMOVE_READ.cpucfg_cluster] then cfg_depart(node_id, n[REMOVE_READ.cpucfg_cluster]) end
  redis.call('ZREM', SEEN_KEY, node_id)
  local held = redis.call('SMEMBERS', BASE .. 'node-art:' .. node_id)
  for _, digest in ipairs(held) do drop_holding(node_id, digest) end
  work = work + #held
  unindex(ctx, node_id)
  redis.call('DEL', nkey)
  if n[REMOVE_READ.static] == '1' then
    redis.call('HSET', nkey, 'node_id', node_id, 'endpoint', n[REMOVE_READ.endpoint],
      'static', '1', 'lingering', n[REMOVE_READ.lingering] or '0',
      last_seen and 'forgotten_ms' or 'unregistered_ms', fmt(now))
    if last_seen then redis.call('HSET', nkey, 'last_seen_ms', fmt(last_seen)) end
  else
    redis.call('ZREM', NODES_KEY, node_id)
  end
  return work
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
-- bindings (unlisted, then listed), artifacts, reservations dropped per call
local FORGET_WORK = 1024

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
    local ids = redis.call('ZRANGE', node_res_key(node_id), '0', num_text(budget - spent - 1))
    for _, rid in ipairs(ids) do
      end_reservation(ctx, rid, 'cancelled', now)
      redis.call('ZREM', node_res_key(node_id), rid)
      spent = spent + 1
    end
  end
  return spent
end

-- What the forget sweep reads of a node (a layout)
-- @layout FORGET_READ
local FORGET_READ = { 'last_seen_ms', 'forgetting' }

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
    local v = redis.call('HMGET', nkey, unpack(FORGET_READ))
    local seen = tonumber(v[FORGET_READ.last_seen_ms])
    if not seen then
      redis.call('ZREM', SEEN_KEY, node_id)
    elseif seen >= cutoff then
      redis.call('ZADD', SEEN_KEY, fmt(seen), node_id) -- steady heartbeats kept it alive
    else
      if not v[FORGET_READ.forgetting] then
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
