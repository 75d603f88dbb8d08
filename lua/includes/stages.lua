--[[
  includes/stages.lua: a node's state as decisions read it, and the decision
  stages (project, status, ceilings, capacity, rank) with the names the
  reference model (scheduler/testing/model.py) uses.
]]
-- @exports NODE_FIELDS NODE_NUMBERS read_node derive_status read_status
-- @exports pressure_of project check_status ceiling_use ceiling_holds
-- @exports check_ceilings check_capacity evaluate ranks_before bytes_lt
-- @exports summarize_reasons status_of
-- @include common
---------------------------------------------------------------------------
-- Node state and the decision stages (same names as scheduler/testing/model.py)
---------------------------------------------------------------------------
-- @layout NODE_FIELDS
local NODE_FIELDS = {
  'endpoint', 'lingering', 'last_seen_ms', 'status', 'cpu_count', 'memory_total_bytes',
  'allocated_cpu', 'allocated_memory_bytes', 'paused_allocated_cpu',
  'paused_allocated_memory_bytes', 'sandbox_count', 'sandbox_starting_count',
  'paused_sandbox_count', 'cpu_percent', 'memory_used_bytes', 'pending_count', 'pending_cpu',
  'pending_memory_bytes', 'idx', 'admission',
}

-- The numbers of NODE_FIELDS that decisions read, checked by node_from:
-- each a CHECK, {position, node_from key, field, derived (recounted), sent by
-- every full heartbeat (so a heard node lacking it is corrupt)}.
-- @layout CHECK
local CHECK = { 'at', 'key', 'field', 'derived', 'required' }
local CHECKED = {
  { NODE_FIELDS.cpu_count, 'cpu_cap', 'cpu_count', false, true },
  { NODE_FIELDS.memory_total_bytes, 'mem_cap', 'memory_total_bytes', false, true },
  { NODE_FIELDS.allocated_cpu, 'alloc_cpu', 'allocated_cpu', false, true },
  { NODE_FIELDS.allocated_memory_bytes, 'alloc_mem', 'allocated_memory_bytes', false, true },
  { NODE_FIELDS.paused_allocated_cpu, 'paused_cpu', 'paused_allocated_cpu', false, true },
  { NODE_FIELDS.paused_allocated_memory_bytes, 'paused_mem', 'paused_allocated_memory_bytes',
    false, true },
  { NODE_FIELDS.sandbox_count, 'running', 'sandbox_count', false, true },
  { NODE_FIELDS.sandbox_starting_count, 'starting_reported', 'sandbox_starting_count', false,
    true },
  { NODE_FIELDS.paused_sandbox_count, 'paused', 'paused_sandbox_count', false, true },
  { NODE_FIELDS.cpu_percent, 'cpu_percent', 'cpu_percent', false, true },
  { NODE_FIELDS.memory_used_bytes, 'mem_used', 'memory_used_bytes', false, true },
  { NODE_FIELDS.pending_count, 'pend_count', 'pending_count', true, false },
  { NODE_FIELDS.pending_cpu, 'pend_cpu', 'pending_cpu', true, false },
  { NODE_FIELDS.pending_memory_bytes, 'pend_mem', 'pending_memory_bytes', true, false },
}

-- A node from its NODE_FIELDS values `v`, each read by name (a layout: the
-- positions are resolved when the library is built, scheduler/store/lua_modules.py).
-- A number a decision reads is never taken for 0 when it is not one
-- (corrupt state: an old version's or an operator's write): it is checked
-- below, and a node that fails is marked `corrupt` (check_status excludes
-- it, counted as "corrupt record", until its next full heartbeat rewrites
-- the record) or, for its pending numbers, `recount` (read_node counts them
-- again from its reservations: they are derived).
local function node_from(id, v)
  local n = {
    id = id,
    endpoint = v[NODE_FIELDS.endpoint] or '',
    lingering = v[NODE_FIELDS.lingering] == '1',
    last_seen = tonumber(v[NODE_FIELDS.last_seen_ms]),
    reported = v[NODE_FIELDS.status] or '',
    cpu_cap = number_of(v[NODE_FIELDS.cpu_count]) or 0,
    mem_cap = number_of(v[NODE_FIELDS.memory_total_bytes]) or 0,
    alloc_cpu = number_of(v[NODE_FIELDS.allocated_cpu]) or 0,
    alloc_mem = number_of(v[NODE_FIELDS.allocated_memory_bytes]) or 0,
    paused_cpu = number_of(v[NODE_FIELDS.paused_allocated_cpu]) or 0,
    paused_mem = number_of(v[NODE_FIELDS.paused_allocated_memory_bytes]) or 0,
    running = number_of(v[NODE_FIELDS.sandbox_count]) or 0,
    starting_reported = number_of(v[NODE_FIELDS.sandbox_starting_count]) or 0,
    paused = number_of(v[NODE_FIELDS.paused_sandbox_count]) or 0,
    cpu_percent = tonumber(v[NODE_FIELDS.cpu_percent]) or 0,
    mem_used = tonumber(v[NODE_FIELDS.memory_used_bytes]) or 0,
    pend_count = number_of(v[NODE_FIELDS.pending_count]) or 0,
    pend_cpu = number_of(v[NODE_FIELDS.pending_cpu]) or 0,
    pend_mem = number_of(v[NODE_FIELDS.pending_memory_bytes]) or 0,
    idx = v[NODE_FIELDS.idx] or '',
    corrupt = false, recount = false,
    admission = v[NODE_FIELDS.admission] or '',
  }
  -- (the checks: one pass over the numbers as read; `or 0` above stands in
  -- only where the check below passes, or marks the node)
  local heard = v[NODE_FIELDS.last_seen_ms]
  if heard and not count_ok(n.last_seen) then
    n.corrupt = corrupt_text(node_key(id), 'last_seen_ms', heard, 'an integer >= 0')
    n.last_seen = nil
  end
  for i = 1, #CHECKED do
    local c = CHECKED[i]
    local text = v[c[CHECK.at]]
    if text then
      if not count_ok(n[c[CHECK.key]]) or (n[c[CHECK.key]] == 0 and text ~= '0') then
        n[c[CHECK.key]] = 0 -- (what explain shows of a node it excludes: no NaN, no 1e300)
        if c[CHECK.derived] then
          n.recount = true
        elseif not n.corrupt then
          n.corrupt = corrupt_text(node_key(id), c[CHECK.field], text, 'an integer >= 0')
        end
      end
    elseif heard and not c[CHECK.derived] and c[CHECK.required] and not n.corrupt then
      n.corrupt = corrupt_text(node_key(id), c[CHECK.field], false)
    end
  end
  if heard and not v[NODE_FIELDS.pending_count] then n.recount = true end
  -- an index entry that is no bucket id: out of the index (reindexed, and
  -- the record written anew with its pending numbers, recount)
  if n.idx ~= '' and not string.find(n.idx, '^%d+:') then n.idx, n.recount = '', true end
  return n
end

-- The snapshot's numbers among NODE_FIELDS: record field -> node_from key.
local NODE_NUMBERS = {
  cpu_count = 'cpu_cap', memory_total_bytes = 'mem_cap', allocated_cpu = 'alloc_cpu',
  allocated_memory_bytes = 'alloc_mem', paused_allocated_cpu = 'paused_cpu',
  paused_allocated_memory_bytes = 'paused_mem', sandbox_count = 'running',
  sandbox_starting_count = 'starting_reported', paused_sandbox_count = 'paused',
  cpu_percent = 'cpu_percent', memory_used_bytes = 'mem_used',
}

local function read_node(id)
  local n = node_from(id, redis.call('HMGET', node_key(id), unpack(NODE_FIELDS)))
  if n.recount then
    n.pend_count, n.pend_cpu, n.pend_mem = recount_pending(id)
  end
  return n
end

-- Status derived at read time, first match wins (docs/contract.md).
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

-- The derived status from three fields of a record (last_seen_ms,
-- lingering, status, as read), taken as read_node takes them (a
-- last_seen_ms that is no count is none): what a read that needs a node's
-- status and not its numbers reads instead of the whole record.  Also
-- whether the node was ever heard from.
local function status_of(seen_text, lingering, reported, P, now)
  local seen = tonumber(seen_text)
  if seen ~= nil and not count_ok(seen) then seen = nil end
  local n = { last_seen = seen, lingering = lingering == '1', reported = reported or '' }
  return derive_status(n, P, now), seen ~= nil
end

-- A node's status (and whether its heartbeat went stale) at instant `now`.
-- Settling: the cell was told Redis may have lost placements (settle_ms) and
-- the node has not heartbeated since, so its numbers may lack them.
local function read_status(n, P, now)
  n.status = derive_status(n, P, now)
  n.stale = n.last_seen ~= nil and now - n.last_seen > P.report_ttl_ms
  n.settling = P.settle_ms ~= nil and now < P.settle_ms + P.report_ttl_ms
    and (n.last_seen == nil or n.last_seen <= P.settle_ms)
end

-- Stage "project": projected load and pressure with the request placed.
-- Pressure of a projected load: the larger share over the known capacities.
local function pressure_of(n)
  local p = 0
  if n.cpu_cap > 0 then p = n.proj_cpu / n.cpu_cap end
  if n.mem_cap > 0 then
    local pm = n.proj_mem / n.mem_cap
    if pm > p then p = pm end
  end
  return p
end

local function project(n, req)
  n.known = n.cpu_cap > 0 or n.mem_cap > 0
  n.proj_cpu = n.alloc_cpu + n.paused_cpu + n.pend_cpu + req.cpu
  n.proj_mem = n.alloc_mem + n.paused_mem + n.pend_mem + req.mem
  n.pressure = pressure_of(n)
  n.starting = n.starting_reported + n.pend_count
end

-- Stage "status": schedulable at all?
local function check_status(n)
  if n.corrupt then return 'corrupt record' end
  if n.status == 'LINGERING' then return 'lingering' end
  if n.status == 'UNHEALTHY' then
    if n.stale then return 'stale heartbeat' end
    return 'unhealthy'
  end
  if n.status ~= 'READY' and n.status ~= 'CONNECTING' then return 'not ready' end
  -- (the node said it takes no new sandboxes: snapshot accepting_sandboxes false)
  local admission = n.admission
  if admission and admission ~= '' then
    return 'not accepting: ' .. (ADMISSION_TEXT[admission] or 'unspecified')
  end
  if n.settling then return 'awaiting heartbeat' end
  if n.endpoint == '' then return 'no endpoint' end
  return nil
end

-- Used amount (current + pending + this request) per ceiling; nil when the
-- ceiling cannot apply (capacity unknown).  Percent ceilings are compared as
-- used * 100 <= limit * capacity to stay in exact integer arithmetic.
-- A sandbox count's current is what the node runs plus what it is still
-- starting: a roster lists a sandbox while it is being created (and releases
-- its reservation), and a Redis that lost the reservations still has the
-- node's own numbers from its next heartbeat.
-- One formula per ceiling of scheduler/domain/catalog.py CEILINGS: what the ceiling
-- compares with its limit for node n after request req, or nil where it does
-- not apply (tests/test_catalog.py holds the names to the catalog's).
local CEILING_USE = {
  max_sandbox_count = function(n, req)
    return n.running + n.starting_reported + n.pend_count + req.count
  end,
  max_sandbox_starting_count = function(n, req)
    return n.starting_reported + n.pend_count + req.count
  end,
  max_sandbox_count_including_paused = function(n, req)
    return n.running + n.starting_reported + n.paused + n.pend_count + req.count
  end,
  max_allocated_cpu_including_paused = function(n, req)
    return n.alloc_cpu + n.paused_cpu + n.pend_cpu + req.cpu
  end,
  max_allocated_memory_bytes_including_paused = function(n, req)
    return n.alloc_mem + n.paused_mem + n.pend_mem + req.mem
  end,
  max_cpu_allocated_percent = function(n, req)
    if n.cpu_cap <= 0 then return nil end
    return n.alloc_cpu + n.pend_cpu + req.cpu
  end,
  max_memory_allocated_percent = function(n, req)
    if n.mem_cap <= 0 then return nil end
    return n.alloc_mem + n.pend_mem + req.mem
  end,
  max_cpu_used_percent = function(n) return n.cpu_percent end,
  max_memory_used_percent = function(n)
    if n.mem_cap <= 0 then return nil end
    return n.mem_used
  end,
}

local function ceiling_use(n, name, req)
  local use = CEILING_USE[name]
  if use == nil then return nil end
  return use(n, req)
end

local function ceiling_holds(n, name, limit, used)
  local capacity = CEILING_CAPACITY[name]
  if capacity == 'cpu' then return used * 100 <= limit * n.cpu_cap end
  if capacity == 'memory' then return used * 100 <= limit * n.mem_cap end
  return used <= limit
end

-- Stage "ceilings": every configured limit must hold after the placement.
local function check_ceilings(n, P, req)
  for i = 1, #P.active do
    local name, limit = P.active[i][1], P.active[i][2]
    local used = ceiling_use(n, name, req)
    if used ~= nil and not ceiling_holds(n, name, limit, used) then
      return 'at ' .. name .. ' (' .. fmt(limit) .. ')'
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
  read_status(n, P, now)
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
-- Eight bytes a read (a byte past a string's end reads as -1: a prefix
-- comes first).
local function bytes_lt(a, b)
  if a == b then return false end
  local byte = string.byte
  for i = 1, math.max(#a, #b), 8 do
    local a1, a2, a3, a4, a5, a6, a7, a8 = byte(a, i, i + 7)
    local b1, b2, b3, b4, b5, b6, b7, b8 = byte(b, i, i + 7)
    if a1 ~= b1 then return (a1 or -1) < (b1 or -1) end
    if a2 ~= b2 then return (a2 or -1) < (b2 or -1) end
    if a3 ~= b3 then return (a3 or -1) < (b3 or -1) end
    if a4 ~= b4 then return (a4 or -1) < (b4 or -1) end
    if a5 ~= b5 then return (a5 or -1) < (b5 or -1) end
    if a6 ~= b6 then return (a6 or -1) < (b6 or -1) end
    if a7 ~= b7 then return (a7 or -1) < (b7 or -1) end
    if a8 ~= b8 then return (a8 or -1) < (b8 or -1) end
  end
  return false
end

-- "no nodes available" with the reasons counted: most frequent first, then by
-- name.  `counts` holds the reasons of the first REFUSAL_COUNTED nodes by id
-- (of `total`); when there are more, the message says how many it counted.
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
  if total > REFUSAL_COUNTED then
    msg = msg .. ', the first ' .. REFUSAL_COUNTED .. ' by id counted'
  end
  if #parts > 0 then msg = msg .. ': ' .. table.concat(parts, ', ') end
  return msg
end

