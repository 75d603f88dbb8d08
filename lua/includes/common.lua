--[[
  includes/common.lua: policy, reservations and their sweep, shared by every
  script that decides or writes state (the loader emits includes once per
  script, dependencies first).
]]
-- @exports repack_policy load_policy touch RES_READ
-- @exports end_reservation sweep_expired recount_pending
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
    -- (a policy stored before it existed: the default of scheduler/domain/policy.py)
    unassigned_reservation_ttl_ms = tonumber(raw.unassigned_reservation_ttl_ms) or 90000,
    overcommit_cpu = tonumber(raw.overcommit_cpu) or 1.0,
    overcommit_memory = tonumber(raw.overcommit_memory) or 1.0,
    default_cpu = tonumber(raw.default_cpu) or 0,
    default_memory_bytes = tonumber(raw.default_memory_bytes) or 0,
    static_nodes = raw.static_nodes == '1',
    time_offset_ms = tonumber(raw.time_offset_ms) or 0,
    frozen_now_ms = tonumber(raw.frozen_now_ms),
    index_format = raw.index_format, -- of the placement index (includes/index.lua)
    -- the index rebuild under way, its epoch (includes/index_moves.lua), or nil
    index_rebuild = raw.index_rebuild,
    -- bounds; absent = the default
    max_roster_ids = tonumber(raw.max_roster_ids) or BOUNDS_DEFAULTS.max_roster_ids,
    node_forget_after_ms = tonumber(raw.node_forget_after_ms)
      or BOUNDS_DEFAULTS.node_forget_after_ms,
    reservation_tombstone_ttl_ms = tonumber(raw.reservation_tombstone_ttl_ms)
      or BOUNDS_DEFAULTS.reservation_tombstone_ttl_ms,
    artifact_key_max_bytes = tonumber(raw.artifact_key_max_bytes)
      or BOUNDS_DEFAULTS.artifact_key_max_bytes,
    -- locality-aware placement (includes/locality.lua); weight 0 = off, and
    -- then its other settings are not read (below)
    locality_weight = tonumber(raw.locality_weight) or LOCALITY_DEFAULTS.locality_weight,
    -- Nodes last heard from at or before this instant are not placed on until
    -- they heartbeat again (for one report TTL): Redis may have lost placements
    -- made just before (a failover, a restart without data); see settle-5.lua.
    settle_ms = tonumber(raw.settle_ms),
    limits = {},
  }
  if P.locality_weight > 0 then
    local D = LOCALITY_DEFAULTS
    P.locality_max_pressure_gap = tonumber(raw.locality_max_pressure_gap)
      or D.locality_max_pressure_gap
    P.locality_pending_decay = tonumber(raw.locality_pending_decay) or D.locality_pending_decay
    P.locality_headroom_share = tonumber(raw.locality_headroom_share)
      or D.locality_headroom_share
    P.locality_affinity_ttl_ms = tonumber(raw.locality_affinity_ttl_ms)
      or D.locality_affinity_ttl_ms
    P.locality_affinity_max_nodes = tonumber(raw.locality_affinity_max_nodes)
      or D.locality_affinity_max_nodes
  end
  -- (a number the policy holds is never read as unset or 0 when it is not
  -- one: the call is refused naming it, before its first write; a replica
  -- with --overwrite-policy, or `schedctl policy set`, writes it anew)
  for _, name in ipairs(POLICY_TTLS) do -- (includes/constants)
    local v = P[name]
    if not (v and v > 0 and v < 1e16) then
      error({ err = ERR.CORRUPT .. ' '
        .. corrupt_text(POLICY_KEY, name, raw[name] or false, 'a number > 0') })
    end
  end
  P.active = {} -- the configured ceilings, in LIMIT_NAMES order: {name, limit}
  for _, name in ipairs(LIMIT_NAMES) do
    local v = tonumber(raw[name])
    if raw[name] and not (v and v >= 0 and v < 1e16) then
      error({ err = ERR.CORRUPT .. ' '
        .. corrupt_text(POLICY_KEY, name, raw[name], 'a number >= 0') })
    end
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
  return count - 1, cpu - number_of(r[RES_READ.cpu]), mem - number_of(r[RES_READ.memory_bytes]),
    acked
end


-- A reservation's cpu or memory as a number, or nil when the record's text
-- is not a whole number >= 0 (corrupt state).
local function res_number(text)
  local x = number_of(text)
  if count_ok(x) then return x end
  return nil
end

-- A node's pending count, cpu, memory and acked count counted again from
-- its live reservations (node-res and their records): what a corrupt
-- pending field of its record is replaced by (they are derived).  A member
-- whose record lost its state (overwritten) still holds its place until it
-- ends (end_reservation); one whose cpu or memory is not a number is an
-- error naming it, never a 0.
local function recount_pending(node_id)
  local count, cpu, mem, acked = 0, 0, 0, 0
  for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), '0', '-1')) do
    local rkey = res_key(rid)
    local r = redis.call('HMGET', rkey, unpack(RES_READ))
    local state = r[RES_READ.state]
    if (state or r[RES_READ.node_id]) and not ENDED[state]
        and (r[RES_READ.node_id] or node_id) == node_id then
      local c, m = res_number(r[RES_READ.cpu]), res_number(r[RES_READ.memory_bytes])
      if c == nil then
        error({ err = ERR.CORRUPT .. ' '
          .. corrupt_text(rkey, 'cpu', r[RES_READ.cpu], 'an integer >= 0') })
      end
      if m == nil then
        error({ err = ERR.CORRUPT .. ' '
          .. corrupt_text(rkey, 'memory_bytes', r[RES_READ.memory_bytes], 'an integer >= 0') })
      end
      count, cpu, mem = count + 1, cpu + c, mem + m
      if state == 'acked' then acked = acked + 1 end
    end
  end
  return count, cpu, mem, acked
end

-- What ending a reservation reads of its node's pending numbers (a layout)
-- @layout PENDING_READ
local PENDING_READ = { 'pending_count', 'pending_cpu', 'pending_memory_bytes', 'acked_count' }

-- End a live reservation exactly once; outcome is released|cancelled|expired.
-- `r`: its RES_READ fields if the caller read them in this call and nothing
-- wrote the reservation since.  Returns true when this call ended it.
-- A reservation whose record is corrupt (its state overwritten, its cpu or
-- memory not a number) but which its node still holds (node-res) is ended
-- all the same, once: its node's pending numbers are then counted again
-- from the reservations left (recount_pending), never less a number it does
-- not have.
local function end_reservation(ctx, rid, outcome, now, r)
  local rkey = res_key(rid)
  r = r or redis.call('HMGET', rkey, unpack(RES_READ))
  local state, node_id = r[RES_READ.state], r[RES_READ.node_id]
  local sound = LIVE[state] and node_id and res_number(r[RES_READ.cpu])
    and res_number(r[RES_READ.memory_bytes])
  if not sound and (ENDED[state] or not (state or node_id)) then
    redis.call('ZREM', EXPIRY_KEY, rid)
    return false
  end
  -- the node's pending load, less this reservation (no pending_count: the
  -- record is gone, or is a static node's bare record)
  local held = ctx[CTX.held]
  if not sound and not (node_id and redis.call('ZSCORE', node_res_key(node_id), rid)) then
    -- (no node holds it that it names: ended, its node unknown; `schedctl
    -- doctor --repair` counts that node's pending numbers again)
    redis.log(redis.LOG_WARNING, 'ending ' .. rkey
      .. ', whose record is corrupt and names no node holding it')
    node_id = nil
  elseif not sound then
    redis.log(redis.LOG_WARNING, 'ending ' .. rkey .. ', whose record is corrupt: '
      .. node_key(node_id) .. ' pending numbers counted again')
    redis.call('ZREM', node_res_key(node_id), rid)
    if held and held.id == node_id then
      if held.pending then
        held.pend_count, held.pend_cpu, held.pend_mem, held.acked = recount_pending(node_id)
        held.dirty = true
        touch(ctx, node_id)
      end
    elseif redis.call('HGET', node_key(node_id), 'pending_count') then
      local count, cpu, mem, acked = recount_pending(node_id)
      redis.call('HSET', node_key(node_id), 'pending_count', num_text(count), 'pending_cpu',
        num_text(cpu), 'pending_memory_bytes', num_text(mem), 'acked_count', num_text(acked))
      touch(ctx, node_id)
    end
  elseif held and held.id == node_id then
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
    local n = redis.call('HMGET', nkey, unpack(PENDING_READ))
    if n[PENDING_READ.pending_count] then
      local count, cpu, mem, acked = number_of(n[PENDING_READ.pending_count]),
        number_of(n[PENDING_READ.pending_cpu]), number_of(n[PENDING_READ.pending_memory_bytes]),
        number_of(n[PENDING_READ.acked_count] or '0')
      if count_ok(count) and count_ok(cpu) and count_ok(mem) and count_ok(acked) then
        count, cpu, mem, acked = less_reservation(r, count, cpu, mem, acked)
      else
        -- (a corrupt pending number: counted again, without this one)
        redis.call('ZREM', node_res_key(node_id), rid)
        count, cpu, mem, acked = recount_pending(node_id)
      end
      local hset = { 'pending_count', num_text(count), 'pending_cpu', num_text(cpu),
        'pending_memory_bytes', num_text(mem) }
      if r[RES_READ.state] == 'acked'
        or not count_ok(number_of(n[PENDING_READ.acked_count] or '0')) then
        hset[#hset + 1] = 'acked_count'
        hset[#hset + 1] = num_text(acked)
      end
      redis.call('HSET', nkey, unpack(hset))
      touch(ctx, node_id)
    end
  end
  if node_id then redis.call('ZREM', node_res_key(node_id), rid) end
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

-- Expire what is due, oldest first, bounded work per call.
local function sweep_expired(ctx, now)
  local due = redis.call('ZRANGEBYSCORE', EXPIRY_KEY, '-inf', instant_text(ctx, now), 'LIMIT', '0',
    num_text(SWEEP_BATCH))
  for _, rid in ipairs(due) do end_reservation(ctx, rid, 'expired', now) end
  return #due
end

