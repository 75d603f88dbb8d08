--[[
  includes/index_bucket.lua: the placement index's bucket codec (see
  includes/index.lua): the keys of the index, a bucket id from a node's
  numbers and its parse back (kept: an id spells its whole content, so a
  parse never goes stale), and a shape's description.
]]
-- @exports SMALL_BUCKET SMALL_BUCKET_TEXT dim_key bucket_key bucket_of
-- @exports parse_bucket parsed_as dim_score node_of_bucket shape_of
-- @exports counts_before shape_desc SHAPE
-- @include stages

-- Buckets of at most this many nodes are read whole when equals are rotated.
local SMALL_BUCKET, SMALL_BUCKET_TEXT = 64, '64'

local function dim_key(dim, shape) return BASE .. 'idx-' .. dim .. ':' .. shape end
local function bucket_key(bucket) return BASE .. 'idx-bucket:' .. bucket end


-- The bucket id: the ranking counts first, zero-padded to 9 digits each, so a
-- zset's byte order among equal scores is rank order (starting, running,
-- paused), then "C:M:Lc:Lm:acpu:rcpu:amem:rmem:start:pending".
local function bucket_of(n)
  -- all whole numbers (the heartbeat admits no other), as kept text: one
  -- concatenation, no printf (includes/base.lua num_text).  The kept tables
  -- are read here, num_text / pad9 called only for a number not kept yet: a
  -- lookup costs a fraction of a call, and this runs on every index move.
  local T, Z = TEXT.t, PADDED.t
  local start, running, paused = n.starting_reported + n.pend_count, n.running, n.paused
  local c, m, ac, pc, am, pm = n.cpu_cap, n.mem_cap, n.alloc_cpu, n.pend_cpu, n.alloc_mem,
    n.pend_mem
  local lc, lm = ac + n.paused_cpu + pc, am + n.paused_mem + pm
  local sr, pend = n.starting_reported, n.pend_count
  return (Z[start] or pad9(start)) .. (Z[running] or pad9(running)) .. (Z[paused] or pad9(paused))
    .. ':' .. (T[c] or num_text(c)) .. ':' .. (T[m] or num_text(m))
    .. ':' .. (T[lc] or num_text(lc))
    .. ':' .. (T[lm] or num_text(lm)) .. ':' .. (T[ac] or num_text(ac)) .. ':'
    .. (T[pc] or num_text(pc)) .. ':' .. (T[am] or num_text(am)) .. ':' .. (T[pm] or num_text(pm))
    .. ':' .. (T[sr] or num_text(sr)) .. ':' .. (T[pend] or num_text(pend))
end

-- A bucket id's numbers.  The id spells its whole content, so its parse never
-- goes stale: parses are kept (kept_table, includes/base.lua), at most
-- PARSED_MAX.  Nobody may change a parse.
-- 13 captures (a literal: built once, at load)
local BUCKET_RE = '^(%d%d%d%d%d%d%d%d%d)(%d%d%d%d%d%d%d%d%d)(%d%d%d%d%d%d%d%d%d)'
  .. ':([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+)$'
local PARSED_MAX = 1024 -- (4,096 parses measured 3.5 MB of Lua memory)
local PARSED = kept_table(PARSED_MAX)
local function keep_parse(bucket, b)
  b.known = b.cpu_cap > 0 or b.mem_cap > 0
  return keep(PARSED, bucket, b)
end
local function parse_bucket(bucket)
  local b = PARSED.t[bucket]
  if b then return b end
  local s, r, p, c, m, lc, lm, ac, rc, am, rm, start, pend = string.match(bucket, BUCKET_RE)
  -- (nil: not a bucket id, a foreign write; the index heals, see pick_clean)
  if not (s and tonumber(c) and tonumber(m) and tonumber(lc) and tonumber(lm) and tonumber(ac)
      and tonumber(rc) and tonumber(am) and tonumber(rm) and tonumber(start)
      and tonumber(pend)) then
    return nil
  end
  return keep_parse(bucket, { starting = tonumber(s), running = tonumber(r),
    paused = tonumber(p), cpu_cap = tonumber(c), mem_cap = tonumber(m), lc = tonumber(lc),
    lm = tonumber(lm), alloc_cpu = tonumber(ac), pend_cpu = tonumber(rc),
    alloc_mem = tonumber(am), pend_mem = tonumber(rm), starting_reported = tonumber(start),
    pend_count = tonumber(pend), shape = c .. ':' .. m })
end
-- The parse of bucket `bucket` = bucket_of(n), from n itself when not kept
-- (a bucket a move creates is often the next one a pick reads: no string to
-- take apart then).
local function parsed_as(bucket, n)
  local b = PARSED.t[bucket]
  if b then return b end
  return keep_parse(bucket, { starting = n.starting_reported + n.pend_count, running = n.running,
    paused = n.paused, cpu_cap = n.cpu_cap, mem_cap = n.mem_cap,
    lc = n.alloc_cpu + n.paused_cpu + n.pend_cpu, lm = n.alloc_mem + n.paused_mem + n.pend_mem,
    alloc_cpu = n.alloc_cpu, pend_cpu = n.pend_cpu, alloc_mem = n.alloc_mem,
    pend_mem = n.pend_mem, starting_reported = n.starting_reported, pend_count = n.pend_count,
    shape = num_text(n.cpu_cap) .. ':' .. num_text(n.mem_cap) })
end

-- A bucket's score in its shape's stream of dimension `mem` (true: memory):
-- its load there, 0 where the shape's capacity is unknown.
local function dim_score(b, mem)
  if mem then return b.mem_cap > 0 and b.lm or 0 end
  return b.cpu_cap > 0 and b.lc or 0
end

-- A stand-in node with a bucket's inputs (observed ceilings were met at indexing).
-- The fields its callers and the stages add come named (nil) too: a table is
-- made at the size of its constructor, and one that grows is rebuilt.
local function node_of_bucket(bucket)
  local b = parse_bucket(bucket)
  if b == nil then return nil end -- (not a bucket id)
  return {
    bucket = bucket, cpu_cap = b.cpu_cap, mem_cap = b.mem_cap, alloc_cpu = b.alloc_cpu,
    pend_cpu = b.pend_cpu, paused_cpu = b.lc - b.alloc_cpu - b.pend_cpu, alloc_mem = b.alloc_mem,
    pend_mem = b.pend_mem, paused_mem = b.lm - b.alloc_mem - b.pend_mem, running = b.running,
    starting_reported = b.starting_reported, paused = b.paused, pend_count = b.pend_count,
    cpu_percent = 0, mem_used = 0,
    id = nil, idx = nil, endpoint = nil, last_seen = nil, lingering = nil, reported = nil,
    status = nil, stale = nil, settling = nil, known = nil, proj_cpu = nil, proj_mem = nil,
    pressure = nil, starting = nil,
  }
end

-- A shape "C:M" as numbers {C, M} (a SHAPE_CAPS), kept like the parses above.
-- @layout SHAPE_CAPS
local SHAPE_CAPS = { 'cpu', 'mem' }
local CAPS = kept_table(PARSED_MAX)
local function shape_caps(shape)
  local x = CAPS.t[shape]
  if x then return x end
  local c, m = string.match(shape, '^([^:]+):(.+)$')
  x = { tonumber(c), tonumber(m) }
  if not (count_ok(x[SHAPE_CAPS.cpu]) and count_ok(x[SHAPE_CAPS.mem])) then
    return nil -- (not a shape)
  end
  return keep(CAPS, shape, x)
end

-- The shape "C:M" of a bucket id (kept with its parse, when it is).
local function shape_of(bucket)
  local b = PARSED.t[bucket]
  if b then return b.shape end
  return string.match(bucket, '^%d+:([^:]+:[^:]+):')
end

-- Do parsed bucket a's counts (starting, running, paused) rank strictly before b's?
local function counts_before(a, b)
  if a.starting ~= b.starting then return a.starting < b.starting end
  if a.running ~= b.running then return a.running < b.running end
  return a.paused < b.paused
end

-- Per call: a shape's capacities, its two streams' keys and its two pick
-- streams (pick_stream: the CPU one, the memory one, each made when a pick
-- first needs it), made once: a batch decides and moves many times over the
-- same shapes.  A SHAPE, read by name (d[SHAPE.cpu_key]).
-- @layout SHAPE
local SHAPE = { 'cpu_cap', 'mem_cap', 'cpu_key', 'mem_key', 'cpu_stream', 'mem_stream' }
local function shape_desc(ctx, shape)
  local descs = ctx[CTX.shape_desc]
  local d = descs[shape]
  if d then return d end
  local caps = shape_caps(shape)
  if caps == nil then return nil end -- (not a shape: a foreign write)
  -- (the streams' slots in the constructor: a table that grows is rebuilt)
  d = { caps[SHAPE_CAPS.cpu], caps[SHAPE_CAPS.mem], dim_key('cpu', shape), dim_key('mem', shape),
    false, false }
  descs[shape] = d
  return d
end
