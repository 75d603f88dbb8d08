--[[
  includes/index.lua: the least-loaded index, so a decision looks at few nodes.

  Nodes whose every decision input is identical are interchangeable: same
  shape (cpu, memory capacity), same allocated / paused / pending load, same
  running / starting / paused / pending counts.  Such nodes form a bucket:

    <base>idx-bucket:<bucket>  zset  node ids, all scored 0 (byte order = rotation order)
    <base>idx-cpu:<C>:<M>      zset  bucket ids of shape C:M scored by CPU load Lc
    <base>idx-mem:<C>:<M>      zset  the same buckets scored by memory load Lm
    <base>idx-shapes           set   shapes that have (or lately had) buckets
    <base>idx-seen             zset  indexed node -> last heartbeat (ms), for the stale sweep

  The bucket id spells its inputs, ranking counts first:
  "SSSSSSSSSRRRRRRRRRPPPPPPPPP:C:M:Lc:Lm:acpu:rcpu:amem:rmem:start:pending"
  (starting incl. pending, running, paused, 9 digits each; Lc and Lm are
  allocated + paused + pending).  So a bucket is evaluated by the same
  stages as a node without reading any node, its pressure is screened from
  C:M:Lc:Lm alone, and among buckets of equal load a zset's byte order is
  rank order.  Only nodes that are schedulable whatever the request (status
  READY or CONNECTING, an endpoint, observed-utilisation ceilings met) are
  indexed; the node record's `idx` field names its bucket, and the policy's
  index_format names the layout (a Schedule reads no other layout).

  The scan (pick_indexed) walks all shapes at once, least lower bound first,
  while a bucket could still match the best found.  Per shape it follows the
  dimension where the request weighs more: (L + requested) / capacity is
  exactly that dimension's projected share, and pressure is never below it,
  so a stream ends when that bound passes the best pressure, or when at the
  best pressure a bucket's counts rank after the best's.  Any doubt (stale
  nodes left after a bounded sweep, nothing eligible, a chosen node whose
  record is not in the buckets it was chosen among) falls back to the full
  scan, which is the truth.
]]
-- @exports bucket_of node_of_bucket move_index index_entry reindex unindex
-- @exports reindex_touched sweep_stale rebuild_index INDEX_FORMAT
-- @exports upgrade_index pick_indexed
-- @include stages

-- (The index as this call read and moved it is the call's: ctx.shapes,
-- ctx.firsts, ctx.sizes, ctx.members, ctx.picks, ctx.shape_desc, declared in
-- includes/ctx.lua.  Within one call, a batch of Schedules decides several
-- times: an index move of this call updates what it changes, so a read there
-- is always what Redis holds.  Members and picks are kept only by a batch of
-- Schedules, the one kind of call that decides again.)
-- Buckets of at most this many nodes are read whole when equals are rotated.
local SMALL_BUCKET, SMALL_BUCKET_TEXT = 64, '64'
local STALE_BATCH = 128 -- stale nodes taken out of the index per call, at most
local SCAN_BATCH = 32 -- largest batch; a stream opens with four buckets and doubles

local function dim_key(dim, shape) return BASE .. 'idx-' .. dim .. ':' .. shape end
-- The shapes with buckets, read once a call (kept up to date by this call's moves).
local function shapes(ctx)
  local read = ctx.shapes
  if not read then
    local set = {}
    read = redis.call('SMEMBERS', IDX_SHAPES)
    for _, shape in ipairs(read) do set[shape] = true end
    ctx.shapes, ctx.shape_set = read, set
  end
  return read
end
local function shape_added(ctx, shape)
  redis.call('SADD', IDX_SHAPES, shape)
  local read = ctx.shapes
  if read and not ctx.shape_set[shape] then
    read[#read + 1], ctx.shape_set[shape] = shape, true
  end
end
local function shape_gone(ctx, shape)
  redis.call('SREM', IDX_SHAPES, shape)
  ctx.shapes, ctx.shape_set = false, false
end
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
  local c, m, ac, pc, am, pm = n.cpu_cap, n.mem_cap, n.alloc_cpu, n.pend_cpu, n.alloc_mem, n.pend_mem
  local lc, lm = ac + n.paused_cpu + pc, am + n.paused_mem + pm
  local sr, pend = n.starting_reported, n.pend_count
  return (Z[start] or pad9(start)) .. (Z[running] or pad9(running)) .. (Z[paused] or pad9(paused))
    .. ':' .. (T[c] or num_text(c)) .. ':' .. (T[m] or num_text(m)) .. ':' .. (T[lc] or num_text(lc))
    .. ':' .. (T[lm] or num_text(lm)) .. ':' .. (T[ac] or num_text(ac)) .. ':'
    .. (T[pc] or num_text(pc)) .. ':' .. (T[am] or num_text(am)) .. ':' .. (T[pm] or num_text(pm))
    .. ':' .. (T[sr] or num_text(sr)) .. ':' .. (T[pend] or num_text(pend))
end

-- A bucket id's numbers.  The id spells its whole content, so its parse never
-- goes stale: parses are kept (kept_table, includes/base.lua), at most
-- PARSED_MAX.  Nobody may change a parse.
-- 13 captures (a literal: built once, at load)
local BUCKET_RE = '^(%d%d%d%d%d%d%d%d%d)(%d%d%d%d%d%d%d%d%d)(%d%d%d%d%d%d%d%d%d):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+)$'
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

-- A shape "C:M" as numbers {C, M}, kept like the parses above.
local CAPS = kept_table(PARSED_MAX)
local function shape_caps(shape)
  local x = CAPS.t[shape]
  if x then return x end
  local c, m = string.match(shape, '^([^:]+):(.+)$')
  x = { tonumber(c), tonumber(m) }
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

local ZERO = { create = false, count = 0, cpu = 0, mem = 0 }


-- The k-th (0-based) of the byte-ordered merge of byte-ordered lists.
local function kth_merged(lists, k)
  local pos = {}
  for i = 1, #lists do pos[i] = 1 end
  while true do
    local best = nil
    for i = 1, #lists do
      local x = lists[i][pos[i]]
      if x and (best == nil or bytes_lt(x, lists[best][pos[best]])) then best = i end
    end
    if k == 0 then return lists[best][pos[best]] end
    pos[best], k = pos[best] + 1, k - 1
  end
end

-- Schedulable whatever the request?  (status stage + observed-utilisation ceilings)
local function indexable(n, P)
  if check_status(n) then return false end
  for name, _ in pairs(OBSERVED_CEILINGS) do
    local limit = P.limits[name]
    if limit then
      local used = ceiling_use(n, name, ZERO)
      if used ~= nil and not ceiling_holds(n, name, limit, used) then return false end
    end
  end
  return true
end

-- Take `x` out of `list` (in place); true when it was there.
local function list_remove(list, x)
  for i = 1, #list do
    if list[i] == x then
      table.remove(list, i)
      return true
    end
  end
  return false
end

-- A stream's first members (`firsts`: ctx.firsts; `more`: ctx.firsts_more)
-- after this call removed `bucket` from its zset:
-- the same list without it (nil, to be read again, when none is left; when
-- it was further on, the first ones stay).  (Changed in place: a list is
-- this call's own, and no pick is under way.)
local function firsts_removed(firsts, key, bucket)
  local list = firsts[key]
  if list and list_remove(list, bucket) and #list == 0 then firsts[key] = nil end
end

-- ... after this call added `bucket` at `score` to the zset of dimension `mem`
-- (true: memory): it joins the list where the zset orders it (by score, then
-- byte order), or it comes after every listed member.  (So a list is empty
-- only when its zset is.)
local function firsts_added(firsts, more, key, bucket, score, mem)
  local list = firsts[key]
  if list == nil then return end
  for i = 1, #list do
    local m = list[i]
    local s = dim_score(parse_bucket(m), mem)
    if score < s or (score == s and bytes_lt(bucket, m)) then
      table.insert(list, i, bucket)
      return
    end
  end
  -- (a list that held the whole zset still does with it; any other stays
  -- exactly the first members, and the zset holds more)
  if more[key] then return end
  list[#list + 1] = bucket
end

-- Per call: a shape's capacities, its two streams' keys and its two pick
-- streams (pick_stream: the CPU one, the memory one, each made when a pick
-- first needs it), made once: a batch decides and moves many times over the
-- same shapes.
local function shape_desc(ctx, shape)
  local descs = ctx.shape_desc
  local d = descs[shape]
  if d then return d end
  local caps = shape_caps(shape)
  -- (the streams' slots in the constructor: a table that grows is rebuilt)
  d = { caps[1], caps[2], dim_key('cpu', shape), dim_key('mem', shape), false, false }
  descs[shape] = d
  return d
end

-- Shape description d's pick stream of dimension `mem` (true: memory), made.
local function new_stream(d, mem)
  -- (a table costs about 0.5 us to make here; every field in the
  -- constructor: a table that grows is rebuilt)
  local st = { cap = mem and d[2] or d[1], add = 0, mem = mem, key = mem and d[4] or d[3],
    rank = 0, size = 4, batch = false, pos = 1, full = false, lb = false }
  if mem then d[6] = st else d[5] = st end
  return st
end

-- A bucket's known members (`members`: ctx.members) after this call removed `node_id` from
-- its zset, or added it: in place, in byte order; a list that would pass
-- SMALL_BUCKET is dropped (read again if a pick needs it).
local function members_removed(members, bucket, node_id)
  local list = members[bucket]
  if list then list_remove(list, node_id) end
end
local function members_added(members, bucket, node_id)
  local list = members[bucket]
  if list == nil then return end
  if #list >= SMALL_BUCKET then
    members[bucket] = nil
    return
  end
  local at = #list + 1
  for i = 1, #list do
    if bytes_lt(node_id, list[i]) then
      at = i
      break
    end
  end
  table.insert(list, at, node_id)
end

local function idx_remove(ctx, node_id, bucket)
  local bk = bucket_key(bucket)
  local sizes = ctx.sizes
  local left = sizes[bucket]
  if redis.call('ZREM', bk, node_id) == 1 then
    if left then left = left - 1 end
    members_removed(ctx.members, bucket, node_id)
  end
  if left == nil then left = redis.call('ZCARD', bk) end
  sizes[bucket] = left
  if left == 0 then
    local d = shape_desc(ctx, shape_of(bucket))
    local kc, km = d[3], d[4]
    redis.call('ZREM', kc, bucket)
    redis.call('ZREM', km, bucket)
    local firsts = ctx.firsts
    firsts_removed(firsts, kc, bucket)
    firsts_removed(firsts, km, bucket)
    -- a shape left empty stays in idx-shapes until a pick finds it so
  end
end

-- `from`: the bucket the node leaves ('' = none).  Within one shape the shape
-- is listed already (a pick drops only shapes it finds empty, and the node's
-- old bucket kept this one from being empty), so it is not added again.
local function idx_add(ctx, node_id, bucket, n, from)
  local bk = bucket_key(bucket)
  local sizes = ctx.sizes
  local size = sizes[bucket]
  local added = redis.call('ZADD', bk, '0', node_id) == 1
  if added and size then size = size + 1 end
  -- scored by load (an integer: exact)
  local b = parsed_as(bucket, n)
  local lc, lm = dim_score(b, false), dim_score(b, true)
  local shape = b.shape
  local d = shape_desc(ctx, shape)
  local kc, km = d[3], d[4]
  local new
  if size ~= nil then
    new = size == 1
    if new then redis.call('ZADD', kc, num_text(lc), bucket) end
  else
    -- a bucket is listed in its shape's streams exactly while it holds a
    -- node, so listing it tells whether it was empty (no ZCARD)
    new = redis.call('ZADD', kc, 'NX', num_text(lc), bucket) == 1
    if new then size = 1 end
  end
  sizes[bucket] = size
  if new then
    if ctx.batch then ctx.members[bucket] = { node_id } end
    redis.call('ZADD', km, num_text(lm), bucket)
    local firsts, more = ctx.firsts, ctx.firsts_more
    firsts_added(firsts, more, kc, bucket, lc, false)
    firsts_added(firsts, more, km, bucket, lm, true)
    if from == '' or shape_of(from) ~= shape then shape_added(ctx, shape) end
  elseif added then
    members_added(ctx.members, bucket, node_id)
  end
end

-- Move node `n` (a read_node table) from bucket n.idx to bucket `want`
-- ("" = out of the index).  The caller stores `want` in the record's idx.
-- `placing`: the move of a placement, n's load grown by it (this call's
-- picks stay right, pick_indexed); any other move forgets them.
local function move_index(ctx, n, want, placing)
  if want == n.idx then return end
  if not placing then ctx.picks = false end
  if n.idx ~= '' then idx_remove(ctx, n.id, n.idx) end
  if want ~= '' then idx_add(ctx, n.id, want, n, n.idx) end
  n.idx = want
end

-- Move node `n` (a read_node table, as its record now is) to the bucket its
-- numbers and status imply ("" = out of the index).  True when n.idx
-- changed; the caller stores it in the record.
local function index_entry(ctx, n, P, now)
  read_status(n, P, now)
  local want = ''
  if indexable(n, P) then want = bucket_of(n) end
  if want == n.idx then return false end
  move_index(ctx, n, want)
  return true
end

-- Bring one node's index entry up to date with its record.
local function reindex(ctx, node_id, P, now, registered)
  if not registered and not redis.call('ZSCORE', NODES_KEY, node_id) then return end
  local n = read_node(node_id)
  if index_entry(ctx, n, P, now) then redis.call('HSET', node_key(node_id), 'idx', n.idx) end
  if n.idx ~= '' and n.last_seen then
    redis.call('ZADD', IDX_SEEN, fmt(n.last_seen), node_id)
  else
    redis.call('ZREM', IDX_SEEN, node_id)
  end
end

local function unindex(ctx, node_id)
  local cur = redis.call('HGET', node_key(node_id), 'idx')
  if cur and cur ~= '' then
    ctx.picks = false
    idx_remove(ctx, node_id, cur)
  end
  redis.call('ZREM', IDX_SEEN, node_id)
end

local function reindex_touched(ctx, P, now)
  local touched = ctx.touched
  if next(touched) == nil then return end
  for node_id, how in pairs(touched) do reindex(ctx, node_id, P, now, how == 'registered') end
  ctx.touched = {}
end

-- Take nodes whose heartbeat went stale, or that must heartbeat again
-- (settling), out of the index.  True when none is left behind (the index
-- then holds no stale or settling node).
local function sweep_stale(ctx, P, now)
  local before = now - P.report_ttl_ms
  if P.settle_ms and now < P.settle_ms + P.report_ttl_ms and P.settle_ms + 1 > before then
    before = P.settle_ms + 1
  end
  local cutoff = '(' .. fmt(before)
  local stale = redis.call('ZRANGEBYSCORE', IDX_SEEN, '-inf', cutoff, 'LIMIT', '0',
    fmt(STALE_BATCH))
  for _, node_id in ipairs(stale) do reindex(ctx, node_id, P, now) end
  return #stale < STALE_BATCH
end

-- Rebuild every entry (after a policy change: observed ceilings, report TTL).
local function rebuild_index(ctx, P, now)
  for _, node_id in ipairs(redis.call('ZRANGE', NODES_KEY, '0', '-1')) do reindex(ctx, node_id, P, now) end
end

-- The layout of the index keys and bucket ids; the policy hash records the
-- one its index was built with (index_format), and a Schedule uses the index
-- only when that is this one.  2: counts-first bucket ids, loads as scores.
local INDEX_FORMAT = '2'

-- Drop every index key and entry, whatever layout wrote them, then build
-- this layout (sync_policy, when the stored index_format is not this one).
local function upgrade_index(ctx, P, now)
  ctx.shapes, ctx.shape_set, ctx.firsts, ctx.firsts_more = false, false, {}, {}
  ctx.sizes, ctx.members, ctx.picks = {}, {}, false
  for _, shape in ipairs(redis.call('SMEMBERS', IDX_SHAPES)) do
    redis.call('DEL', dim_key('cpu', shape), dim_key('mem', shape))
  end
  for _, node_id in ipairs(redis.call('ZRANGE', NODES_KEY, '0', '-1')) do
    local cur = redis.call('HGET', node_key(node_id), 'idx')
    if cur and cur ~= '' then
      redis.call('DEL', bucket_key(cur))
      redis.call('HSET', node_key(node_id), 'idx', '')
    end
  end
  redis.call('DEL', IDX_SHAPES, IDX_SEEN)
  rebuild_index(ctx, P, now)
  redis.call('HSET', POLICY_KEY, 'index_format', INDEX_FORMAT)
end

-- The pick: pick_indexed and its helpers.  (The helpers and their state are
-- locals of a block, out of scope after it: Lua allows a function 200 local
-- variables, and the library's main chunk holds all of the includes'.)
local pick_indexed
do
-- One pick's state, shared by the helpers below (module-level so that a pick
-- makes no closures): the policy, the request, the best bucket so far (a
-- ranking table) and the buckets of its rank.  A pick runs to its end before
-- another starts (a script is never re-entered).
local PK_P, PK_req, PK_best, PK_equals
-- (and the call's ctx with the index tables a pick reads per shape, taken
-- from it once per pick: ctx.shape_desc, ctx.firsts, ctx.firsts_more)
local PK_ctx, PK_descs, PK_firsts, PK_more
-- (one stand-in table for the projected load, refilled per bucket; one list
-- of streams, refilled per pick: tables that grow are rebuilt as they grow)
local PK_load, PK_streams = {}, {}

-- The stages on one bucket, reading only what each needs: the pressure and
-- capacity from its first numbers, the rest only when ceilings are set.
local function pick_consider(bucket)
  local b = parse_bucket(bucket)
  local req, best, load = PK_req, PK_best, PK_load
  -- the projected load alone, judged by the same stages as a whole node
  load.cpu_cap, load.mem_cap = b.cpu_cap, b.mem_cap
  load.proj_cpu, load.proj_mem = b.lc + req.cpu, b.lm + req.mem
  local p = pressure_of(load)
  if best and p > best.pressure then return end
  if check_capacity(load, PK_P, req) then return end
  if #PK_P.active > 0 then
    local full = node_of_bucket(bucket)
    project(full, req)
    if check_ceilings(full, PK_P, req) then return end
  end
  local n = { bucket = bucket, parsed = b, pressure = p, known = b.known,
    starting = b.starting, running = b.running, paused = b.paused }
  if best == nil or ranks_before(n, best) then
    PK_best, PK_equals = n, { bucket }
  elseif not ranks_before(best, n) then
    PK_equals[#PK_equals + 1] = bucket
  end
end

-- A stream's lower bound at `bucket` (see pick_indexed).
local function pick_lb(st, bucket)
  if st.cap <= 0 then return 0 end
  local b = parse_bucket(bucket)
  if st.mem then return (b.lm + st.add) / st.cap end
  return (b.lc + st.add) / st.cap
end

-- A stream's next batch of members, twice the last one's size (at most
-- SCAN_BATCH).  (No WITHSCORES: the load is in the member, and a score reply
-- costs Redis a %.17g print and Lua a strtod.)
local function pick_fetch(st)
  local batch = redis.call('ZRANGE', st.key, num_text(st.rank), num_text(st.rank + st.size - 1))
  st.batch, st.pos, st.rank, st.full = batch, 1, st.rank + st.size, #batch == st.size
  st.size = 2 * st.size
  if st.size > SCAN_BATCH then st.size = SCAN_BATCH end
  st.lb = false
  if batch[1] then st.lb = pick_lb(st, batch[1]) end
end

-- The shape's stream for this pick (d[5] or d[6], refilled by every pick of
-- the call), along the dimension where the request weighs more, opened at
-- its first OPEN_SIZE members: read once a call, and kept up to date by its
-- moves (ctx.firsts).
local OPEN_SIZE, OPEN_LAST_TEXT = 4, '3'
local function pick_stream(shape)
  local d = PK_descs[shape] or shape_desc(PK_ctx, shape)
  local c, m, req = d[1], d[2], PK_req
  local mem = m > 0 and (c <= 0 or req.mem / m > req.cpu / c)
  local st, add = d[5], req.cpu
  if mem then st, add = d[6], req.mem end
  if not st then st = new_stream(d, mem) end
  local key = st.key
  local batch = PK_firsts[key]
  if batch == nil then
    batch = redis.call('ZRANGE', key, '0', OPEN_LAST_TEXT)
    PK_firsts[key], PK_more[key] = batch, #batch == OPEN_SIZE
  end
  st.add, st.batch, st.pos, st.rank, st.full, st.size = add, batch, 1, #batch, PK_more[key],
    2 * OPEN_SIZE
  local first = batch[1]
  if first then st.lb = pick_lb(st, first) else st.lb = false end
  return st
end

local function pick_run(streams)
  while true do
    local st, lb = nil, nil -- (lb: st.lb, read once)
    for i = 1, #streams do
      local x = streams[i]
      local xlb = x.lb
      if xlb and (lb == nil or xlb < lb) then st, lb = x, xlb end
    end
    local best = PK_best
    if st == nil or (best and lb > best.pressure) then return end
    local bucket = st.batch[st.pos]
    if bucket == nil then
      pick_fetch(st) -- the batch ran out; st.lb was the last one's, a floor
    elseif best and lb == best.pressure and counts_before(best.parsed, parse_bucket(bucket)) then
      st.lb = false -- ranks after the best, and so does the rest of the stream
    else
      pick_consider(bucket)
      st.pos = st.pos + 1
      if st.batch[st.pos] then
        st.lb = pick_lb(st, st.batch[st.pos])
      elseif not st.full then
        st.lb = false
      end
    end
  end
end

-- The buckets of the best rank for `req` (nil when the full scan must decide).
--
-- One stream per shape, along the dimension where the request weighs more:
-- a bucket's load L in that dimension gives (L + requested) / capacity, which
-- is exactly that dimension's projected share, so the bucket's pressure is
-- never below it (lb).  Streams are walked least lb first; a stream ends when
-- its lb passes the best pressure found, or when at the best pressure its
-- counts rank after the best's (the rest of that stream does too, being in
-- byte order).  Unknown-capacity buckets are scored 0 and only walked when no
-- known bucket is eligible.
local function pick_walk(ctx, P, req)
  PK_P, PK_req, PK_best, PK_equals = P, req, nil, nil
  PK_ctx, PK_descs, PK_firsts, PK_more = ctx, ctx.shape_desc, ctx.firsts, ctx.firsts_more
  local streams, k, unknown = PK_streams, 0, false
  local empty = nil
  for _, shape in ipairs(shapes(ctx)) do
    if shape == '0:0' then
      unknown = true
    else
      local st = pick_stream(shape)
      if st.lb then
        k = k + 1
        streams[k] = st
      else
        empty = empty or {}
        empty[#empty + 1] = shape
      end
    end
  end
  for i = #streams, k + 1, -1 do streams[i] = nil end -- (the last pick's)
  if empty then
    for _, shape in ipairs(empty) do shape_gone(ctx, shape) end
  end
  pick_run(streams)
  if PK_best == nil and unknown then
    local st = pick_stream('0:0')
    if st.lb then pick_run({ st }) else shape_gone(ctx, '0:0') end
  end
  local equals = PK_equals
  PK_best, PK_equals = nil, nil
  PK_ctx, PK_descs, PK_firsts, PK_more = nil, nil, nil, nil
  return equals
end

-- One node of the buckets `equals`, turn `rr_next` of the rotation among
-- all their nodes in node-id byte order (nil: they hold none).  Small
-- buckets are read whole (or known, ctx.members) and merged here; a large one
-- goes through a union in Redis.
local function pick_rotate(ctx, equals, rr_next)
  local lists, total, large = nil, 0, false
  local known, sizes = ctx.members, ctx.sizes
  for i, bucket in ipairs(equals) do
    local members = known[bucket]
    if members == nil then
      members = redis.call('ZRANGE', bucket_key(bucket), '0', SMALL_BUCKET_TEXT)
      if #members > SMALL_BUCKET then
        large = true
        break
      end
      if ctx.batch then known[bucket] = members end
    end
    sizes[bucket] = #members
    -- one bucket (the common case): its own byte order, no merge and no tables
    if #equals == 1 then
      if #members == 0 then return nil end
      return members[((rr_next - 1) % #members) + 1]
    end
    lists = lists or {}
    lists[i], total = members, total + #members
  end
  if not large then
    if total == 0 then return nil end
    return kth_merged(lists, (rr_next - 1) % total)
  end
  total = 0
  for _, bucket in ipairs(equals) do
    sizes[bucket] = redis.call('ZCARD', bucket_key(bucket))
    total = total + sizes[bucket]
  end
  if total == 0 then return nil end
  local k = (rr_next - 1) % total
  local keys = {}
  for i, bucket in ipairs(equals) do keys[i] = bucket_key(bucket) end
  -- in chunks (unpack's limit): each later chunk unions into what is there
  for i = 1, #keys, UNPACK_CHUNK do
    local last = math.min(i + UNPACK_CHUNK - 1, #keys)
    if i == 1 then
      redis.call('ZUNIONSTORE', IDX_TMP, last, unpack(keys, 1, last))
    else
      redis.call('ZUNIONSTORE', IDX_TMP, last - i + 2, IDX_TMP, unpack(keys, i, last))
    end
  end
  local picked = redis.call('ZRANGE', IDX_TMP, fmt(k), fmt(k))[1]
  redis.call('DEL', IDX_TMP)
  return picked
end

-- Least-loaded choice through the index: the chosen node id and the list of
-- buckets it was chosen among (equal rank), or nil when the full scan must
-- decide.
--
-- A creation of a size this call already placed reuses what that pick found
-- while the index changed only by placements' moves since (ctx.picks): such a
-- move takes its node to a bucket of more load and one more starting, which
-- ranks strictly after the one it left for every request and is eligible
-- for none that the one it left was not, so no bucket came to rank before
-- or with the best found, and the best ones left are those buckets' nodes
-- still in them.  When none is left, the walk decides again.
function pick_indexed(ctx, P, req, rr_next)
  local memo = req.create and ctx.picks and ctx.picks[req.cpu]
  local equals = memo and memo[req.mem]
  if equals then
    local picked = pick_rotate(ctx, equals, rr_next)
    if picked then return picked, equals end
  end
  equals = pick_walk(ctx, P, req)
  if equals == nil then return nil end
  if req.create and ctx.batch then
    ctx.picks = ctx.picks or {}
    memo = ctx.picks[req.cpu] or {}
    ctx.picks[req.cpu], memo[req.mem] = memo, equals
  end
  return pick_rotate(ctx, equals, rr_next), equals
end
end -- (the pick)
