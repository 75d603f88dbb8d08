--[[
  includes/index_pick.lua: the placement index's pick (see
  includes/index.lua): pick_indexed, the buckets of the best rank for a
  request and one node of them in rotation; nil when the full scan must
  decide.
]]
-- @exports pick_indexed
-- @include index_moves

local SCAN_BATCH = 32 -- largest batch; a stream opens with four buckets and doubles

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

-- Shape description d's pick stream of dimension `mem` (true: memory), made.
local function new_stream(d, mem)
  -- (a table costs about 0.5 us to make here; every field in the
  -- constructor: a table that grows is rebuilt)
  local st = { cap = mem and d[SHAPE.mem_cap] or d[SHAPE.cpu_cap], add = 0, mem = mem,
    key = mem and d[SHAPE.mem_key] or d[SHAPE.cpu_key],
    rank = 0, size = 4, batch = false, pos = 1, full = false, lb = false }
  if mem then d[SHAPE.mem_stream] = st else d[SHAPE.cpu_stream] = st end
  return st
end

local pick_indexed
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
-- A creation fits no bucket of a stream from where the stream's lower bound
-- (the projected share in its dimension) passes that dimension's overcommit
-- (check_capacity refuses it, and every later bucket's load is no less):
-- the bounds, per pick, with a margin far above rounding so that only
-- buckets it refuses are skipped (math.huge for a route: nothing to fit);
-- pick_fetch ends a stream whose next batch starts past them.
local PK_over_cpu, PK_over_mem = 0, 0

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

-- Members of zset `key` (a stream's batch, read) that are no bucket id (a
-- foreign write) are taken out of it, and of `batch`; true when there were.
-- (A parse is kept, so this costs a lookup per member.)
local function pick_clean(key, batch)
  local bad = false
  for i = #batch, 1, -1 do
    local bucket = batch[i]
    if not parse_bucket(bucket) then
      redis.log(redis.LOG_WARNING, key .. ' member ' .. bucket .. ' is no bucket id: removed')
      redis.call('ZREM', key, bucket)
      table.remove(batch, i)
      bad = true
    end
  end
  return bad
end

-- A stream's next batch of members, twice the last one's size (at most
-- SCAN_BATCH).  (No WITHSCORES: the load is in the member, and a score reply
-- costs Redis a %.17g print and Lua a strtod.)
local function pick_fetch(st)
  local batch = redis.call('ZRANGE', st.key, num_text(st.rank), num_text(st.rank + st.size - 1))
  local full, read = #batch == st.size, #batch
  if pick_clean(st.key, batch) then st.rank = st.rank - (read - #batch) end
  st.batch, st.pos, st.rank, st.full = batch, 1, st.rank + st.size, full
  st.size = 2 * st.size
  if st.size > SCAN_BATCH then st.size = SCAN_BATCH end
  st.lb = false
  if batch[1] then st.lb = pick_lb(st, batch[1]) end
  -- (checked per batch, off the walk's own loop: past the edge, a stream
  -- walks at most the rest of one batch)
  if st.lb and st.lb > (st.mem and PK_over_mem or PK_over_cpu) then st.lb = false end
end

-- The shape's stream for this pick (d[SHAPE.cpu_stream] or
-- d[SHAPE.mem_stream], refilled by every pick of the call), along the
-- dimension where the request weighs more, opened at its first OPEN_SIZE
-- members: read once a call, and kept up to date by its moves
-- (ctx.firsts).
local OPEN_SIZE, OPEN_LAST_TEXT = 4, '3'
local function pick_stream(shape)
  local d = PK_descs[shape] or shape_desc(PK_ctx, shape)
  if d == nil then return nil end -- (not a shape: pick_walk drops it)
  local c, m, req = d[SHAPE.cpu_cap], d[SHAPE.mem_cap], PK_req
  local mem = m > 0 and (c <= 0 or req.mem / m > req.cpu / c)
  local st, add = d[SHAPE.cpu_stream], req.cpu
  if mem then st, add = d[SHAPE.mem_stream], req.mem end
  if not st then st = new_stream(d, mem) end
  local key = st.key
  local batch = PK_firsts[key]
  if batch == nil then
    batch = redis.call('ZRANGE', key, '0', OPEN_LAST_TEXT)
    local more = #batch == OPEN_SIZE
    if pick_clean(key, batch) and more then
      -- (read again: the first members are what the zset now holds)
      batch = redis.call('ZRANGE', key, '0', OPEN_LAST_TEXT)
      more = #batch == OPEN_SIZE
      pick_clean(key, batch)
    end
    PK_firsts[key], PK_more[key] = batch, more
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
  PK_over_cpu, PK_over_mem = math.huge, math.huge
  if req.create then
    PK_over_cpu, PK_over_mem = P.overcommit_cpu * (1 + 1e-9), P.overcommit_memory * (1 + 1e-9)
  end
  PK_ctx, PK_descs = ctx, ctx[CTX.shape_desc]
  PK_firsts, PK_more = ctx[CTX.firsts], ctx[CTX.firsts_more]
  local streams, k, unknown = PK_streams, 0, false
  local empty = nil
  for _, shape in ipairs(shapes(ctx)) do
    if shape == '0:0' then
      unknown = true
    else
      local st = pick_stream(shape)
      if st and st.lb then
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

-- The k-th (0-based) node id in byte order of the union of disjoint
-- buckets (zsets of ids, all scored 0): list i is keys[i]'s members from
-- index starts[i] on, counts[i] of them.  No union is built, so the cost
-- follows the log of the sizes, not their sum: the largest list is bisected
-- by index (ZRANGE i i), a member's rank in the union being its own index
-- plus how many of the others' members sort before it (ZLEXCOUNT); when
-- none of its members is the k-th, that one lies among the others between
-- two neighbours of it, and the search goes on there without it.  With one
-- list, one call; with two, about 2 * log2(n) + 1.
local function kth_union(keys, starts, counts, k)
  while #keys > 0 do
    local big = 1
    for i = 2, #keys do
      if counts[i] > counts[big] then big = i end
    end
    local key, start = keys[big], starts[big]
    if #keys == 1 then
      local at = fmt(start + k)
      return redis.call('ZRANGE', key, at, at)[1]
    end
    -- lo's rank is below k, hi's above it (-1 and counts[big]: the ends)
    local lo, hi, lo_rank = -1, counts[big], -1
    local lo_below, hi_below = {}, {}
    for i = 1, #keys do lo_below[i], hi_below[i] = 0, counts[i] end
    while hi - lo > 1 do
      local mid = math.floor((lo + hi) / 2)
      local at = fmt(start + mid)
      local x = redis.call('ZRANGE', key, at, at)[1]
      local rank, below, before = mid, {}, '(' .. x
      for i = 1, #keys do
        if i ~= big then
          below[i] = redis.call('ZLEXCOUNT', keys[i], '-', before) - starts[i]
          rank = rank + below[i]
        end
      end
      if rank == k then return x end
      if rank < k then
        lo, lo_rank, lo_below = mid, rank, below
      else
        hi, hi_below = mid, below
      end
    end
    -- among the others, after the big list's lo-th member and before its hi-th
    k = k - (lo_rank + 1)
    local nkeys, nstarts, ncounts = {}, {}, {}
    for i = 1, #keys do
      if i ~= big and hi_below[i] > lo_below[i] then
        local j = #nkeys + 1
        nkeys[j], nstarts[j] = keys[i], starts[i] + lo_below[i]
        ncounts[j] = hi_below[i] - lo_below[i]
      end
    end
    keys, starts, counts = nkeys, nstarts, ncounts
  end
  return nil
end

-- One node of the buckets `equals`, turn `rr_next` of the rotation among
-- all their nodes in node-id byte order (nil: they hold none).  Small
-- buckets are read whole (or known, ctx.members) and merged here; with a
-- large one, one bucket answers by rank and several by kth_union: the same
-- few calls at 100,000 nodes as at 1,000.
local function pick_rotate(ctx, equals, rr_next)
  local lists, total, large = nil, 0, false
  local known, sizes = ctx[CTX.members], ctx[CTX.sizes]
  for i, bucket in ipairs(equals) do
    local members = known[bucket]
    if members == nil then
      local size = sizes[bucket]
      if size and size > SMALL_BUCKET then
        large = true
        break
      end
      members = redis.call('ZRANGE', bucket_key(bucket), '0', SMALL_BUCKET_TEXT)
      if #members > SMALL_BUCKET then
        large = true
        break
      end
      if ctx[CTX.batch] then known[bucket] = members end
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
  local keys, starts, counts = {}, {}, {}
  total = 0
  for i, bucket in ipairs(equals) do
    local key, size = bucket_key(bucket), sizes[bucket]
    if size == nil then
      size = redis.call('ZCARD', key)
      sizes[bucket] = size
    end
    keys[i], starts[i], counts[i], total = key, 0, size, total + size
  end
  if total == 0 then return nil end
  return kth_union(keys, starts, counts, (rr_next - 1) % total)
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
  local memo = req.create and ctx[CTX.picks] and ctx[CTX.picks][req.cpu]
  local equals = memo and memo[req.mem]
  if equals then
    local picked = pick_rotate(ctx, equals, rr_next)
    if picked then return picked, equals end
  end
  equals = pick_walk(ctx, P, req)
  if equals == nil then return nil end
  if req.create and ctx[CTX.batch] then
    ctx[CTX.picks] = ctx[CTX.picks] or {}
    memo = ctx[CTX.picks][req.cpu] or {}
    ctx[CTX.picks][req.cpu], memo[req.mem] = memo, equals
  end
  return pick_rotate(ctx, equals, rr_next), equals
end
