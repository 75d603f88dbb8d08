--[[
  includes/common.lua: policy, reservations and their sweep, shared by every
  script that decides or writes state (the loader emits includes once per
  script, dependencies first).
]]
-- @exports repack_policy load_policy binding_expires touch RES_READ
-- @exports end_reservation flush_counts sweep_expired
-- @include base

-- (the policy's packed copy: raw_policy, includes/base.lua)
local function repack_policy()
  local flat = redis.call('HGETALL', POLICY_KEY)
  local raw = {}
  for i = 1, #flat, 2 do raw[flat[i]] = flat[i + 1] end
  local v = {}
  for i, name in ipairs(PACKED) do v[i] = raw[name] or '' end
  redis.call('HSET', POLICY_KEY, 'packed', table.concat(v, '\t'))
end

-- Typed policies by packed string, kept (kept_table, includes/base.lua): the
-- string is the key, so a changed policy is a new entry and nothing can go
-- stale; the table is bounded for servers with many cells.
local POLICIES = kept_table(64)
-- The cell's shared policy, typed and read-only (it may be shared with other
-- calls); nil when no replica has written one yet.  Kept as ctx.P: what the
-- call's decisions share, and what end_reservation keeps tombstones by.
local function load_policy(ctx)
  local packed = redis.call('HGET', POLICY_KEY, 'packed')
  local kept = packed and POLICIES.t[packed]
  if kept then
    ctx[CTX.P] = kept
    return kept
  end
  local raw = raw_policy(packed)
  if raw == nil then return nil end
  local P = {
    strategy = raw.strategy or DEFAULT_STRATEGY,
    report_ttl_ms = tonumber(raw.report_ttl_ms),
    binding_ttl_ms = tonumber(raw.binding_ttl_ms),
    reservation_ttl_ms = tonumber(raw.reservation_ttl_ms),
    overcommit_cpu = tonumber(raw.overcommit_cpu) or 1.0,
    overcommit_memory = tonumber(raw.overcommit_memory) or 1.0,
    default_cpu = tonumber(raw.default_cpu) or 0,
    default_memory_bytes = tonumber(raw.default_memory_bytes) or 0,
    static_nodes = raw.static_nodes == '1',
    time_offset_ms = tonumber(raw.time_offset_ms) or 0,
    frozen_now_ms = tonumber(raw.frozen_now_ms),
    index_format = raw.index_format, -- of the placement index (includes/index.lua)
    -- bounds; absent = the default
    max_roster_ids = tonumber(raw.max_roster_ids) or BOUNDS_DEFAULTS.max_roster_ids,
    node_forget_after_ms = tonumber(raw.node_forget_after_ms)
      or BOUNDS_DEFAULTS.node_forget_after_ms,
    reservation_tombstone_ttl_ms = tonumber(raw.reservation_tombstone_ttl_ms)
      or BOUNDS_DEFAULTS.reservation_tombstone_ttl_ms,
    artifact_key_max_bytes = tonumber(raw.artifact_key_max_bytes)
      or BOUNDS_DEFAULTS.artifact_key_max_bytes,
    -- locality-aware placement (includes/locality.lua); weight 0 = off
    locality_weight = tonumber(raw.locality_weight) or LOCALITY_DEFAULTS.locality_weight,
    locality_max_pressure_gap = tonumber(raw.locality_max_pressure_gap)
      or LOCALITY_DEFAULTS.locality_max_pressure_gap,
    locality_affinity_ttl_ms = tonumber(raw.locality_affinity_ttl_ms)
      or LOCALITY_DEFAULTS.locality_affinity_ttl_ms,
    locality_affinity_max_nodes = tonumber(raw.locality_affinity_max_nodes)
      or LOCALITY_DEFAULTS.locality_affinity_max_nodes,
    -- Nodes last heard from at or before this instant are not placed on until
    -- they heartbeat again (for one report TTL): Redis may have lost placements
    -- made just before (a failover, a restart without data); see settle-5.lua.
    settle_ms = tonumber(raw.settle_ms),
    limits = {},
  }
  P.active = {} -- the configured ceilings, in LIMIT_NAMES order: {name, limit}
  for _, name in ipairs(LIMIT_NAMES) do
    local v = tonumber(raw[name])
    if v and v > 0 then
      P.limits[name] = v
      P.active[#P.active + 1] = { name, v }
    end
  end
  if packed then
    keep(POLICIES, packed, P)
  end
  ctx[CTX.P] = P
  return P
end


-- When does binding {node_id, listed, expires_ms} expire?
local function binding_expires(b, P)
  local expires = tonumber(b[3]) or 0
  if b[2] == '1' and b[1] then
    local seen = tonumber(redis.call('HGET', node_key(b[1]), 'last_seen_ms'))
    if seen and seen + P.binding_ttl_ms > expires then expires = seen + P.binding_ttl_ms end
  end
  return expires
end

---------------------------------------------------------------------------
-- Reservations
---------------------------------------------------------------------------
-- Node `node_id`'s load changed in this call (ctx.touched; reindex_touched,
-- includes/index, brings its index entry up to date before the script
-- returns).  `registered`: the caller knows the node is in the cell (reindex
-- then skips checking it).
local function touch(ctx, node_id, registered)
  local touched = ctx[CTX.touched]
  if registered then touched[node_id] = 'registered' elseif not touched[node_id] then
    touched[node_id] = true
  end
end

-- What ending a reservation reads of it (r[RES_READ.state], ...: a layout).
-- @layout RES_READ
local RES_READ = { 'state', 'node_id', 'cpu', 'memory_bytes', 'locality' }

-- (ctx.held: a node record this call holds in hand, a read_node table plus
-- `acked`, its acked_count, to write once at its end: ending one of its
-- reservations changes the held numbers, and sets `dirty`, not Redis.  Only
-- a heartbeat holds one, from its read of the record to its write.)

-- A node's pending count, cpu, memory and acked count less reservation `r`
-- (its RES_READ fields).
local function less_reservation(r, count, cpu, mem, acked)
  if r[RES_READ.state] == 'acked' then acked = acked - 1 end
  return count - 1, cpu - number_of(r[RES_READ.cpu]), mem - number_of(r[RES_READ.memory_bytes]), acked
end

local NO_COUNTS = {}

-- End a live reservation exactly once; outcome is released|cancelled|expired.
-- `r`: its RES_READ fields if the caller read them in this call and nothing
-- wrote the reservation since.  Returns true when this call ended it.
local function end_reservation(ctx, rid, outcome, now, r)
  local rkey = res_key(rid)
  r = r or redis.call('HMGET', rkey, unpack(RES_READ))
  if not LIVE[r[RES_READ.state]] then
    redis.call('ZREM', EXPIRY_KEY, rid)
    return false
  end
  local node_id = r[RES_READ.node_id]
  -- the node's pending load, less this reservation (no pending_count: the
  -- record is gone, or is a static node's bare record)
  local held = ctx[CTX.held]
  if held and held.id == node_id then
    -- (the holder writes the record; held.pending: it has a pending_count)
    if held.pending then
      held.pend_count, held.pend_cpu, held.pend_mem, held.acked = less_reservation(r,
        held.pend_count, held.pend_cpu, held.pend_mem, held.acked)
      held.dirty = true
      touch(ctx, node_id)
    end
  else
    -- (in one read and one write)
    local nkey = node_key(node_id)
    local n = redis.call('HMGET', nkey, 'pending_count', 'pending_cpu', 'pending_memory_bytes',
      'acked_count')
    if n[1] then
      local count, cpu, mem, acked = less_reservation(r, number_of(n[1]), number_of(n[2]) or 0,
        number_of(n[3]) or 0, number_of(n[4]) or 0)
      local hset = { 'pending_count', num_text(count), 'pending_cpu', num_text(cpu),
        'pending_memory_bytes', num_text(mem) }
      if r[RES_READ.state] == 'acked' then hset[7], hset[8] = 'acked_count', num_text(acked) end
      redis.call('HSET', nkey, unpack(hset))
      touch(ctx, node_id)
    end
  end
  redis.call('ZREM', node_res_key(node_id), rid)
  redis.call('ZREM', EXPIRY_KEY, rid)
  -- (a locality placement: one start of its template fewer pending on the
  -- node, includes/locality.lua)
  local group = r[RES_READ.locality]
  if group then
    local lkey = BASE .. 'node-loc:' .. node_id
    if redis.call('HINCRBY', lkey, group, '-1') <= 0 then redis.call('HDEL', lkey, group) end
  end
  redis.call('HSET', rkey, 'state', outcome, 'ended_ms', instant_text(ctx, now))
  local P, counts = ctx[CTX.P], ctx[CTX.counts]
  redis.call('PEXPIRE', rkey, num_text(P and P.reservation_tombstone_ttl_ms
    or BOUNDS_DEFAULTS.reservation_tombstone_ttl_ms))
  if counts then -- (a batch: counted once, at its end, by flush_counts)
    counts[outcome] = (counts[outcome] or 0) + 1
  else
    redis.call('HINCRBY', STATS_KEY, outcome .. '_total', '1')
  end
  return true
end

-- Write the counts a batch kept (ctx.counts) to stats.
local function flush_counts(ctx)
  for outcome, k in pairs(ctx[CTX.counts] or NO_COUNTS) do
    redis.call('HINCRBY', STATS_KEY, outcome .. '_total', fmt(k))
  end
end

-- Expire what is due, oldest first, bounded work per call.
local function sweep_expired(ctx, now)
  local due = redis.call('ZRANGEBYSCORE', EXPIRY_KEY, '-inf', instant_text(ctx, now), 'LIMIT', '0',
    num_text(SWEEP_BATCH))
  for _, rid in ipairs(due) do end_reservation(ctx, rid, 'expired', now) end
  return #due
end

