--[[
  includes/common.lua: shared by every script; the loader inlines it where a
  script says `-- @include common`.

  Key convention (scheduler/keys.py has the full layout):
    KEYS[1] base    "<prefix>:{<cell>}:"  typed keys are derived from it
    KEYS[2] policy  hash
    KEYS[3] nodes   zset of node ids, all scored 0 so ZRANGE is byte order by id
    KEYS[4] stats   hash of counters
    KEYS[5] expiry  zset reservation id -> expiry ms
  Error replies are "<CODE> <message>", codes from scheduler/errors.py.
]]
local BASE = KEYS[1]
local POLICY_KEY = KEYS[2]
local NODES_KEY = KEYS[3]
local STATS_KEY = KEYS[4]
local EXPIRY_KEY = KEYS[5]

local TOMBSTONE_MS = 3600000 -- ended reservations stay readable for an hour
local SWEEP_BATCH = 64 -- expired reservations released per script call, at most

local function node_key(id) return BASE .. 'node:' .. id end
local function node_res_key(id) return BASE .. 'node-res:' .. id end
local function node_sbx_key(id) return BASE .. 'node-sbx:' .. id end
local function res_key(id) return BASE .. 'res:' .. id end
local function bind_key(id) return BASE .. 'bind:' .. id end

local function fail(code, message)
  return redis.error_reply(code .. ' ' .. message)
end

-- A number as a string that round-trips exactly (tostring keeps 14 digits only).
local function fmt(x)
  if x == math.floor(x) and math.abs(x) < 1e15 then
    return string.format('%d', x)
  end
  return string.format('%.17g', x)
end

-- The cell's shared policy; nil when no replica has written one yet.
local LIMIT_NAMES = {
  'max_sandbox_count', 'max_sandbox_starting_count', 'max_sandbox_count_including_paused',
  'max_cpu_allocated_percent', 'max_memory_allocated_percent',
  'max_allocated_cpu_including_paused', 'max_allocated_memory_bytes_including_paused',
  'max_cpu_used_percent', 'max_memory_used_percent',
}

local function load_policy()
  local flat = redis.call('HGETALL', POLICY_KEY)
  if #flat == 0 then return nil end
  local raw = {}
  for i = 1, #flat, 2 do raw[flat[i]] = flat[i + 1] end
  local P = {
    strategy = raw.strategy or 'least_loaded',
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
    limits = {},
  }
  for _, name in ipairs(LIMIT_NAMES) do
    local v = tonumber(raw[name])
    if v and v > 0 then P.limits[name] = v end
  end
  return P
end

local NO_POLICY = 'cell policy is not initialised: start a replica or run `schedctl policy set`'

-- Redis server time in ms, plus the cell's drill offset (0 outside drills and
-- tests), or the drill's frozen instant when one is set.
local function now_ms(P)
  if P.frozen_now_ms then return P.frozen_now_ms end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + P.time_offset_ms
end

---------------------------------------------------------------------------
-- Reservations
---------------------------------------------------------------------------
local LIVE = { pending = true, assigned = true, acked = true }

-- End a live reservation exactly once; outcome is released|cancelled|expired.
-- Returns true when this call ended it.
local function end_reservation(rid, outcome, now)
  local rkey = res_key(rid)
  local r = redis.call('HMGET', rkey, 'state', 'node_id', 'cpu', 'memory_bytes')
  if not LIVE[r[1]] then
    redis.call('ZREM', EXPIRY_KEY, rid)
    return false
  end
  local node_id = r[2]
  local nkey = node_key(node_id)
  if redis.call('EXISTS', nkey) == 1 then
    redis.call('HINCRBY', nkey, 'pending_count', -1)
    redis.call('HINCRBY', nkey, 'pending_cpu', fmt(-tonumber(r[3])))
    redis.call('HINCRBY', nkey, 'pending_memory_bytes', fmt(-tonumber(r[4])))
    if r[1] == 'acked' then redis.call('HINCRBY', nkey, 'acked_count', -1) end
  end
  redis.call('ZREM', node_res_key(node_id), rid)
  redis.call('ZREM', EXPIRY_KEY, rid)
  redis.call('HSET', rkey, 'state', outcome, 'ended_ms', now)
  redis.call('PEXPIRE', rkey, TOMBSTONE_MS)
  redis.call('HINCRBY', STATS_KEY, outcome .. '_total', 1)
  return true
end

-- Expire what is due, oldest first, bounded work per call.
local function sweep_expired(now)
  local due = redis.call('ZRANGEBYSCORE', EXPIRY_KEY, '-inf', now, 'LIMIT', 0, SWEEP_BATCH)
  for _, rid in ipairs(due) do end_reservation(rid, 'expired', now) end
  return #due
end

---------------------------------------------------------------------------
-- Node state and the decision stages (same names as scheduler/model.py)
---------------------------------------------------------------------------
local NODE_FIELDS = {
  'endpoint', 'lingering', 'last_seen_ms', 'status', 'cpu_count', 'memory_total_bytes',
  'allocated_cpu', 'allocated_memory_bytes', 'paused_allocated_cpu',
  'paused_allocated_memory_bytes', 'sandbox_count', 'sandbox_starting_count',
  'paused_sandbox_count', 'cpu_percent', 'memory_used_bytes', 'pending_count', 'pending_cpu',
  'pending_memory_bytes',
}

local function read_node(id)
  local v = redis.call('HMGET', node_key(id), unpack(NODE_FIELDS))
  return {
    id = id,
    endpoint = v[1] or '',
    lingering = v[2] == '1',
    last_seen = tonumber(v[3]),
    reported = v[4] or '',
    cpu_cap = tonumber(v[5]) or 0,
    mem_cap = tonumber(v[6]) or 0,
    alloc_cpu = tonumber(v[7]) or 0,
    alloc_mem = tonumber(v[8]) or 0,
    paused_cpu = tonumber(v[9]) or 0,
    paused_mem = tonumber(v[10]) or 0,
    running = tonumber(v[11]) or 0,
    starting_reported = tonumber(v[12]) or 0,
    paused = tonumber(v[13]) or 0,
    cpu_percent = tonumber(v[14]) or 0,
    mem_used = tonumber(v[15]) or 0,
    pend_count = tonumber(v[16]) or 0,
    pend_cpu = tonumber(v[17]) or 0,
    pend_mem = tonumber(v[18]) or 0,
  }
end

-- Status derived at read time, first match wins (CONTRACT.md).
local function derive_status(n, P, now)
  if n.last_seen == nil then
    if n.lingering then return 'LINGERING' end
    return 'CONNECTING'
  end
  if now - n.last_seen > P.report_ttl_ms then return 'UNHEALTHY' end
  if n.lingering or n.reported == 'LINGERING' then return 'LINGERING' end
  if n.reported == '' or n.reported == 'UNSPECIFIED' then return 'CONNECTING' end
  return n.reported
end

-- Stage "project": projected load and pressure with the request placed.
local function project(n, req)
  n.known = n.cpu_cap > 0 or n.mem_cap > 0
  n.proj_cpu = n.alloc_cpu + n.paused_cpu + n.pend_cpu + req.cpu
  n.proj_mem = n.alloc_mem + n.paused_mem + n.pend_mem + req.mem
  local p = 0
  if n.cpu_cap > 0 then p = n.proj_cpu / n.cpu_cap end
  if n.mem_cap > 0 then
    local pm = n.proj_mem / n.mem_cap
    if pm > p then p = pm end
  end
  n.pressure = p
  n.starting = n.starting_reported + n.pend_count
end

-- Stage "status": schedulable at all?
local function check_status(n)
  if n.status == 'LINGERING' then return 'lingering' end
  if n.status == 'UNHEALTHY' then
    if n.stale then return 'stale heartbeat' end
    return 'unhealthy'
  end
  if n.status ~= 'READY' and n.status ~= 'CONNECTING' then return 'not ready' end
  if n.endpoint == '' then return 'no endpoint' end
  return nil
end

-- Used amount (current + pending + this request) per ceiling; nil when the
-- ceiling cannot apply (capacity unknown).  Percent ceilings are compared as
-- used * 100 <= limit * capacity to stay in exact integer arithmetic.
local function ceiling_use(n, name, req)
  if name == 'max_sandbox_count' then return n.running + n.pend_count + req.count end
  if name == 'max_sandbox_starting_count' then
    return n.starting_reported + n.pend_count + req.count
  end
  if name == 'max_sandbox_count_including_paused' then
    return n.running + n.paused + n.pend_count + req.count
  end
  if name == 'max_allocated_cpu_including_paused' then
    return n.alloc_cpu + n.paused_cpu + n.pend_cpu + req.cpu
  end
  if name == 'max_allocated_memory_bytes_including_paused' then
    return n.alloc_mem + n.paused_mem + n.pend_mem + req.mem
  end
  if name == 'max_cpu_allocated_percent' then
    if n.cpu_cap <= 0 then return nil end
    return n.alloc_cpu + n.pend_cpu + req.cpu
  end
  if name == 'max_memory_allocated_percent' then
    if n.mem_cap <= 0 then return nil end
    return n.alloc_mem + n.pend_mem + req.mem
  end
  if name == 'max_cpu_used_percent' then return n.cpu_percent end
  if name == 'max_memory_used_percent' then
    if n.mem_cap <= 0 then return nil end
    return n.mem_used
  end
  return nil
end

local function ceiling_holds(n, name, limit, used)
  if name == 'max_cpu_allocated_percent' then return used * 100 <= limit * n.cpu_cap end
  if name == 'max_memory_allocated_percent' then return used * 100 <= limit * n.mem_cap end
  if name == 'max_memory_used_percent' then return used * 100 <= limit * n.mem_cap end
  return used <= limit
end

-- Stage "ceilings": every configured limit must hold after the placement.
local function check_ceilings(n, P, req)
  for _, name in ipairs(LIMIT_NAMES) do
    local limit = P.limits[name]
    if limit then
      local used = ceiling_use(n, name, req)
      if used ~= nil and not ceiling_holds(n, name, limit, used) then
        return 'at ' .. name .. ' (' .. fmt(limit) .. ')'
      end
    end
  end
  return nil
end

-- Stage "capacity": projected <= capacity * overcommit per known dimension.
local function check_capacity(n, P, req)
  if not req.create then return nil end
  if n.cpu_cap > 0 and n.proj_cpu > n.cpu_cap * P.overcommit_cpu then return 'insufficient cpu' end
  if n.mem_cap > 0 and n.proj_mem > n.mem_cap * P.overcommit_memory then
    return 'insufficient memory'
  end
  return nil
end

-- All stages for one node; returns the node table with .status and .reason
-- (nil reason = eligible).
local function evaluate(id, P, req, now)
  local n = read_node(id)
  n.status = derive_status(n, P, now)
  n.stale = n.last_seen ~= nil and now - n.last_seen > P.report_ttl_ms
  project(n, req)
  n.reason = check_status(n) or check_ceilings(n, P, req) or check_capacity(n, P, req)
  return n
end

-- Ranking for least_loaded: true when a ranks strictly before b.  Equal nodes
-- (false both ways) are rotated by the cell's round-robin counter.
local function ranks_before(a, b)
  if a.known ~= b.known then return a.known end
  if a.pressure ~= b.pressure then return a.pressure < b.pressure end
  if a.starting ~= b.starting then return a.starting < b.starting end
  if a.running ~= b.running then return a.running < b.running end
  if a.paused ~= b.paused then return a.paused < b.paused end
  return false
end

-- Byte-wise a < b.  Lua's own string `<` follows the server's collation
-- locale, which must not decide anything here.
local function bytes_lt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- "no nodes available" with the reasons counted: most frequent first, then by name.
local function summarize_reasons(counts, total)
  local names = {}
  for name, _ in pairs(counts) do names[#names + 1] = name end
  table.sort(names, function(a, b)
    if counts[a] ~= counts[b] then return counts[a] > counts[b] end
    return bytes_lt(a, b)
  end)
  local parts = {}
  for _, name in ipairs(names) do parts[#parts + 1] = counts[name] .. ' ' .. name end
  local msg = 'no nodes available: 0/' .. total .. ' nodes available'
  if #parts > 0 then msg = msg .. ': ' .. table.concat(parts, ', ') end
  return msg
end

---------------------------------------------------------------------------
-- Bindings and node removal
---------------------------------------------------------------------------

-- Write (or refresh) sandbox -> node.  `listed` is "1" once a roster of that
-- node has listed the sandbox; the expiry field is authoritative (Redis time),
-- the key TTL only collects garbage.  `rid` nil keeps the reservation already
-- charged to the sandbox on this node (a sandbox is charged at most once).
local function write_binding(sb, node_id, endpoint, listed, rid, now, P)
  local bkey = bind_key(sb)
  local prev = redis.call('HMGET', bkey, 'node_id', 'reservation_id')
  if prev[1] and prev[1] ~= node_id then redis.call('SREM', node_sbx_key(prev[1]), sb) end
  if rid == nil and prev[1] == node_id then rid = prev[2] end
  redis.call('HSET', bkey, 'sandbox_id', sb, 'node_id', node_id, 'endpoint', endpoint,
    'listed', listed, 'reservation_id', rid or '', 'expires_ms', fmt(now + P.binding_ttl_ms))
  redis.call('PEXPIRE', bkey, P.binding_ttl_ms)
  redis.call('SADD', node_sbx_key(node_id), sb)
end

local function drop_binding(sb, node_id)
  local bkey = bind_key(sb)
  if redis.call('HGET', bkey, 'node_id') == node_id then redis.call('DEL', bkey) end
  redis.call('SREM', node_sbx_key(node_id), sb)
end

-- A live reservation of `node_id` attached to binding `sb`, or nil.
local function bound_reservation(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'reservation_id')
  if b[1] ~= node_id or not b[2] or b[2] == '' then return nil end
  local r = redis.call('HMGET', res_key(b[2]), 'state', 'node_id')
  if LIVE[r[1]] and r[2] == node_id then return b[2] end
  return nil
end

-- Has a reservation (live or ended) already been charged to sandbox `sb` on
-- this node?  Then no other reservation may be charged to it.
local function charged(sb, node_id)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'reservation_id')
  return b[1] == node_id and b[2] and b[2] ~= ''
end

-- Is `sb` bound to `node_id` and listed by one of its rosters (unexpired)?
local function listed_on(sb, node_id, now)
  local b = redis.call('HMGET', bind_key(sb), 'node_id', 'listed', 'expires_ms')
  return b[1] == node_id and b[2] == '1' and (tonumber(b[3]) or 0) > now
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
  redis.call('DEL', node_sbx_key(node_id))
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
  redis.call('DEL', nkey)
  if n[2] == '1' then
    redis.call('HSET', nkey, 'node_id', node_id, 'endpoint', n[3], 'static', '1',
      'lingering', n[4] or '0', 'unregistered_ms', fmt(now))
  else
    redis.call('ZREM', NODES_KEY, node_id)
  end
end
