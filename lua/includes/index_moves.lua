--[[
  includes/index_moves.lua: the placement index's upkeep (see
  includes/index.lua): a node moved from bucket to bucket as its numbers
  change, in or out of the index as its status does, stale nodes swept out,
  the whole index rebuilt or upgraded.
]]
-- @exports shapes shape_gone move_index index_entry reindex unindex
-- @exports reindex_touched sweep_stale sweep_stale_bucket stale_before PLACEMENT_STALE_BATCH
-- @exports INDEX_FORMAT UPGRADE idx_remove
-- @exports REBUILD REBUILD_STATE DROP_STATE
-- @include index_bucket

-- (The index as this call read and moved it is the call's: ctx.shapes,
-- ctx.firsts, ctx.sizes, ctx.members, ctx.picks, ctx.shape_desc, declared in
-- includes/ctx.lua.  Within one call, a batch of Schedules decides several
-- times: an index move of this call updates what it changes, so a read there
-- is always what Redis holds.  Members and picks are kept only by a batch of
-- Schedules, the one kind of call that decides again.)
local STALE_BATCH = 64 -- stale nodes taken out of the index per call, at most
-- ...by a placement call (the replicas' monitors take steps of STALE_BATCH
-- back to back while any is left: index_rebuild-5.lua)
local PLACEMENT_STALE_BATCH = 32
-- ...and, while more are left, stale members of the buckets a call's picks
-- met them in, at most (sweep_stale_bucket).  (The sweep takes the oldest,
-- wherever they sit; a stale entry costs a decision only where its picks
-- land, so most of the allowance goes there.  Both together, with the
-- picks' bounds (includes/schedule.lua): a placement at 100,000 nodes,
-- 10 % or 99 % of them dark, 1.4-1.7 ms of Redis at the median and
-- 3.3-3.8 at the p99, docs/performance.md.)
local STALE_BUCKET_READS = 32

-- The layout of the index keys and bucket ids; the policy hash records the
-- one its index was built with (index_format), and a Schedule uses the index
-- only when that is this one.  2: counts-first bucket ids, loads as scores.
-- While the cell's index is of another layout (or being dropped, UPGRADE
-- below) no call writes an entry: a node that moves leaves the old one.
local INDEX_FORMAT = '2'

-- The shapes with buckets, read once a call (kept up to date by this call's moves).
local function shapes(ctx)
  local read = ctx[CTX.shapes]
  if not read then
    local set = {}
    read = redis.call('SMEMBERS', IDX_SHAPES)
    for _, shape in ipairs(read) do set[shape] = true end
    ctx[CTX.shapes], ctx[CTX.shape_set] = read, set
  end
  return read
end
local function shape_added(ctx, shape)
  redis.call('SADD', IDX_SHAPES, shape)
  local read = ctx[CTX.shapes]
  if read and not ctx[CTX.shape_set][shape] then
    read[#read + 1], ctx[CTX.shape_set][shape] = shape, true
  end
end
local function shape_gone(ctx, shape)
  redis.call('SREM', IDX_SHAPES, shape)
  ctx[CTX.shapes], ctx[CTX.shape_set] = false, false
end

local ZERO = { create = false, count = 0, cpu = 0, mem = 0 }

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
  local sizes = ctx[CTX.sizes]
  local left = sizes[bucket]
  if redis.call('ZREM', bk, node_id) == 1 then
    if left then left = left - 1 end
    members_removed(ctx[CTX.members], bucket, node_id)
  end
  if left == nil then left = redis.call('ZCARD', bk) end
  sizes[bucket] = left
  local shape = left == 0 and shape_of(bucket)
  local d = shape and shape_desc(ctx, shape)
  if d then
    local kc, km = d[SHAPE.cpu_key], d[SHAPE.mem_key]
    redis.call('ZREM', kc, bucket)
    redis.call('ZREM', km, bucket)
    local firsts = ctx[CTX.firsts]
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
  local sizes = ctx[CTX.sizes]
  local size = sizes[bucket]
  local added = redis.call('ZADD', bk, '0', node_id) == 1
  if added and size then size = size + 1 end
  -- scored by load (an integer: exact)
  local b = parsed_as(bucket, n)
  local lc, lm = dim_score(b, false), dim_score(b, true)
  local shape = b.shape
  local d = shape_desc(ctx, shape)
  local kc, km = d[SHAPE.cpu_key], d[SHAPE.mem_key]
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
    if ctx[CTX.batch] then ctx[CTX.members][bucket] = { node_id } end
    redis.call('ZADD', km, num_text(lm), bucket)
    local firsts, more = ctx[CTX.firsts], ctx[CTX.firsts_more]
    firsts_added(firsts, more, kc, bucket, lc, false)
    firsts_added(firsts, more, km, bucket, lm, true)
    if from == '' or shape_of(from) ~= shape then shape_added(ctx, shape) end
  elseif added then
    members_added(ctx[CTX.members], bucket, node_id)
  end
end

-- Move node `n` (a read_node table) from bucket n.idx to bucket `want`
-- ("" = out of the index).  The caller stores `want` in the record's idx.
-- `placing`: the move of a placement, n's load grown by it (this call's
-- picks stay right, pick_indexed); any other move forgets them.
local function move_index(ctx, n, want, placing)
  if want == n.idx then return end
  if not placing then ctx[CTX.picks] = false end
  if n.idx ~= '' then idx_remove(ctx, n.id, n.idx) end
  if want ~= '' then idx_add(ctx, n.id, want, n, n.idx) end
  n.idx = want
end

-- Move node `n` (a read_node table, as its record now is) to the bucket its
-- numbers and status imply ("" = out of the index).  True when n.idx
-- changed; the caller stores it in the record.
local function index_entry(ctx, n, P, now)
  read_status(n, P, now)
  if P.index_format ~= INDEX_FORMAT then
    -- (an entry of another layout: the node leaves it, and its bucket with
    -- the last member; what lists the bucket goes with the upgrade's drop)
    if n.idx == '' then return false end
    redis.call('ZREM', bucket_key(n.idx), n.id)
    ctx[CTX.picks], n.idx = false, ''
    return true
  end
  local want = ''
  if indexable(n, P) then want = bucket_of(n) end
  if want == n.idx then return false end
  move_index(ctx, n, want)
  return true
end

-- Bring one node's index entry up to date with its record.
-- A node whose record is corrupt leaves the index (check_status, includes/
-- stages.lua), so its steady heartbeats answer RESYNC and its next full one
-- rewrites the record; pending numbers counted again (read_node) are written.
local function reindex(ctx, node_id, P, now, registered)
  if not registered and not redis.call('ZSCORE', NODES_KEY, node_id) then
    redis.call('ZREM', IDX_SEEN, node_id) -- (a member of no node: a foreign write)
    return
  end
  local n = read_node(node_id)
  local moved = index_entry(ctx, n, P, now)
  if n.recount then
    redis.call('HSET', node_key(node_id), 'pending_count', num_text(n.pend_count), 'pending_cpu',
      num_text(n.pend_cpu), 'pending_memory_bytes', num_text(n.pend_mem), 'idx', n.idx)
  elseif moved then
    redis.call('HSET', node_key(node_id), 'idx', n.idx)
  end
  if n.corrupt and moved and n.idx == '' then
    redis.log(redis.LOG_WARNING, n.corrupt
      .. ': the node is not placed on until its next full heartbeat')
  end
  if n.idx ~= '' and n.last_seen then
    redis.call('ZADD', IDX_SEEN, fmt(n.last_seen), node_id)
  else
    redis.call('ZREM', IDX_SEEN, node_id)
  end
  return n.idx, n
end

local function unindex(ctx, node_id)
  local cur = redis.call('HGET', node_key(node_id), 'idx')
  if cur and cur ~= '' then
    ctx[CTX.picks] = false
    idx_remove(ctx, node_id, cur)
  end
  redis.call('ZREM', IDX_SEEN, node_id)
end

local function reindex_touched(ctx, P, now)
  local touched = ctx[CTX.touched]
  if next(touched) == nil then return end
  for node_id, how in pairs(touched) do reindex(ctx, node_id, P, now, how == 'registered') end
  ctx[CTX.touched] = {}
end

-- A node last seen before this instant is stale, or must heartbeat again
-- (settling).
local function stale_before(P, now)
  local before = now - P.report_ttl_ms
  if P.settle_ms and now < P.settle_ms + P.report_ttl_ms and P.settle_ms + 1 > before then
    before = P.settle_ms + 1
  end
  return before
end

-- Take nodes whose heartbeat went stale, or that must heartbeat again
-- (settling), out of the index, STALE_BATCH at most.  True when none is left
-- behind (the index then holds no stale or settling node), and how many it
-- took.
local function sweep_stale(ctx, P, now, batch)
  batch = batch or STALE_BATCH
  local cutoff = '(' .. fmt(stale_before(P, now))
  local stale = redis.call('ZRANGEBYSCORE', IDX_SEEN, '-inf', cutoff, 'LIMIT', '0', fmt(batch))
  for _, node_id in ipairs(stale) do reindex(ctx, node_id, P, now) end
  ctx[CTX.stale_left] = STALE_BUCKET_READS
  return #stale < batch, #stale
end

-- While sweep_stale left stale nodes behind: the stale members of bucket
-- `idx`, where a pick met a stale node (nodes that went dark together,
-- a rack, often had equal numbers, so its equals are likely gone too),
-- taken out of the index as the sweep takes them, within what is left of
-- the call's allowance (ctx.stale_left: STALE_BUCKET_READS records, each
-- bucket read counting one more).
local function sweep_stale_bucket(ctx, P, now, idx)
  local left = ctx[CTX.stale_left] or 0
  if left <= 0 then return end
  local before = stale_before(P, now)
  local ids = redis.call('ZRANGE', bucket_key(idx), '0', fmt(math.min(left, SMALL_BUCKET) - 1))
  for _, node_id in ipairs(ids) do
    local seen = redis.call('ZSCORE', IDX_SEEN, node_id)
    if seen and tonumber(seen) < before then
      reindex(ctx, node_id, P, now, true)
      left = left - 1
    end
  end
  ctx[CTX.stale_left] = left - 1
end

-- The index rebuilt in bounded steps (after a policy change: observed
-- ceilings, report TTL, settle; or when a pick found it inconsistent).
-- REBUILD.start marks it stale: the policy field index_rebuild names the
-- rebuild under way (an epoch), and <base>idx-rebuild keeps its cursor, the
-- last node id it reindexed (node-id byte order, ZRANGEBYLEX).  Each
-- REBUILD.step reindexes at most `budget` nodes after the cursor under the
-- policy as it now is; the step that finds fewer left ends the rebuild
-- (index_rebuild dropped).  A node added, removed or moved by another call
-- meanwhile is reindexed by that call under the same policy, so when the
-- pass ends every entry is what its record implies.  While stale, a pick
-- checks the node it chose against its record under this policy
-- (includes/schedule.lua), so no ceiling is ever passed; a node the old
-- policy kept out and the new one lets in is placed on once the pass
-- reaches it (or its own next move).
-- (one table: REBUILD.start, REBUILD.step and the step sizes)
local REBUILD = {
  STEP = 64, -- nodes a replica's step reindexes, at most (1.5-3 ms of Redis at 100,000 nodes)
  PLACEMENT_STEP = 32, -- nodes a placement's step reindexes, at most
}
local function rebuild_key() return BASE .. 'idx-rebuild' end
-- What a rebuild step reads of its state (a layout)
-- @layout REBUILD_STATE
local REBUILD_STATE = { 'epoch', 'cursor' }

-- The members of the buckets `among` (of equal rank: a pick rotates among
-- all of them) that the pass under way has not reached (after its cursor),
-- reindexed, at most STALE_CHECK of them in a call; buckets done are not
-- read again in the call (ctx.checked: nothing this call moves into them is
-- the old policy's).  True when that took a node out of one of them (the
-- rotation among them changed: pick again).  With more than STALE_CHECK
-- left to check it checks none: the picked node alone is checked, its rank
-- is the best, and only its turn among its equals may differ.
local STALE_CHECK = 64
function REBUILD.check(ctx, P, now, among)
  local checked = ctx[CTX.checked]
  if not checked then
    checked = {}
    ctx[CTX.checked] = checked
  end
  local from = checked['']
  if from == nil then
    local st = redis.call('HMGET', rebuild_key(), unpack(REBUILD_STATE))
    from = '-'
    local cursor = st[REBUILD_STATE.cursor]
    if st[REBUILD_STATE.epoch] == P.index_rebuild and cursor and cursor ~= '' then
      from = '(' .. cursor
    end
    checked[''] = from -- (bucket ids are never '')
  end
  local todo, owners = {}, {}
  for _, bucket in ipairs(among) do
    if not checked[bucket] then
      local ids = redis.call('ZRANGEBYLEX', bucket_key(bucket), from, '+', 'LIMIT', '0',
        fmt(STALE_CHECK + 1 - #todo))
      for _, id in ipairs(ids) do
        todo[#todo + 1], owners[#todo + 1] = id, bucket
      end
      if #todo > STALE_CHECK then return false end
    end
  end
  local moved = false
  for _, bucket in ipairs(among) do checked[bucket] = true end
  for i, id in ipairs(todo) do
    if reindex(ctx, id, P, now, true) ~= owners[i] then moved = true end
  end
  return moved
end

-- Mark the index stale and start a new pass from the first node (any pass
-- under way starts over: its nodes were reindexed under the old policy).
-- The caller holds a policy read before: load it again (repacked here).
function REBUILD.start()
  local key = rebuild_key()
  local epoch = redis.call('HINCRBY', key, 'epoch', '1')
  redis.call('HSET', key, 'cursor', '')
  redis.call('HSET', POLICY_KEY, 'index_rebuild', fmt(epoch))
  repack_policy()
  return epoch
end

-- One bounded step of the rebuild under way (P.index_rebuild; none: done at
-- once).  Returns whether the index is whole again, and the nodes this step
-- reindexed (at most `budget`).  When it ends the pass it repacks the
-- policy: the caller loads it again.
function REBUILD.step(ctx, P, now, budget)
  local epoch = P.index_rebuild
  if not epoch then return true, 0 end
  local key = rebuild_key()
  local st = redis.call('HMGET', key, unpack(REBUILD_STATE))
  local cursor = ''
  -- (another pass's cursor, or none: this pass starts from the first node)
  if st[REBUILD_STATE.epoch] == epoch then cursor = st[REBUILD_STATE.cursor] or '' end
  local from = '-'
  if cursor ~= '' then from = '(' .. cursor end
  local ids = redis.call('ZRANGEBYLEX', NODES_KEY, from, '+', 'LIMIT', '0', fmt(budget))
  for i = 1, #ids do
    local id = ids[i]
    local idx, n = reindex(ctx, id, P, now, true)
    -- (the record names its bucket; a bucket that lost the member, a
    -- foreign write, gets it back: the rebuild goes by the records)
    if idx ~= '' and not redis.call('ZSCORE', bucket_key(idx), id) then
      ctx[CTX.picks] = false
      idx_add(ctx, id, idx, n, '')
    end
  end
  if #ids < budget then
    redis.call('HSET', key, 'epoch', epoch, 'cursor', '', 'done_ms', fmt(now))
    redis.call('HDEL', POLICY_KEY, 'index_rebuild')
    repack_policy()
    return true, #ids
  end
  redis.call('HSET', key, 'epoch', epoch, 'cursor', ids[#ids])
  return false, #ids
end

-- An index of another layout (an earlier version's, or none yet) dropped in
-- bounded steps, then built anew by a rebuild (sync_policy starts it, every
-- replica's monitor and index_rebuild-5.lua take the steps).  While it is
-- dropped the policy's index_format is UPGRADE.DROPPING: no Schedule reads
-- the index and no call writes an entry (index_entry), so what the drop
-- walks is all there is.  A step walks at most WALK x `budget` nodes by id
-- from the drop's cursor (idx-rebuild drop_cursor), taking each out of the
-- bucket its record names (the whole bucket once it has at most
-- SMALL_BUCKET members) and clearing its idx; then idx-seen and the
-- shapes' streams, TRIM members and SHAPES shapes a step at most (a shape
-- leaves idx-shapes with its streams: the set is its own cursor); then
-- idx-shapes, and the index is of this layout,
-- empty, with a rebuild under way.  (DEL, SRANDMEMBER and SREM: the
-- documented ACL line grants them, where UNLINK and SPOP are not in it.)
local UPGRADE = {
  DROPPING = 'dropping', -- index_format while the old index is dropped
  SHAPES = 64, -- shapes whose streams a step deletes, at most
  TRIM = 1024, -- members a step takes off idx-seen and the streams, at most
  -- nodes a drop step walks per node of its budget: a node's drop is four
  -- small calls (HGET, ZCARD, ZREM or DEL, HSET) where a reindex reads its
  -- whole record (a step of 4 x 64 took 4.9 ms at 100,000 nodes)
  WALK = 2,
}

-- What a drop step reads of its state in idx-rebuild (a layout): the last
-- node walked, and whether the walk ended (the shapes' streams are next)
-- @layout DROP_STATE
local DROP_STATE = { 'drop_cursor', 'drop_shapes' }

-- Take at most `left` members off zset `k` (ZREMRANGEBYRANK), and delete
-- it once no more are left: the budget left, and whether `k` is gone.  (A
-- DEL frees every member at once: idx-seen's 100,000 held a step 35 ms.)
-- A key of another type (another layout's) is deleted whole.
function UPGRADE.trim(k, left)
  local n = redis.pcall('ZCARD', k)
  if type(n) ~= 'number' then
    redis.call('DEL', k)
    return left, true
  end
  if n == 0 then return left, true end
  if left <= 0 then return 0, false end
  if n > left then
    redis.call('ZREMRANGEBYRANK', k, '0', fmt(left - 1))
    return 0, false
  end
  redis.call('DEL', k)
  return left - n, true
end

-- Start dropping the index (a drop under way goes on from where it is).
function UPGRADE.start(P)
  if P.index_format == UPGRADE.DROPPING then return end
  redis.call('HDEL', rebuild_key(), unpack(DROP_STATE))
  redis.call('HSET', POLICY_KEY, 'index_format', UPGRADE.DROPPING)
  redis.call('HDEL', POLICY_KEY, 'index_rebuild')
  repack_policy()
end

-- Whether the cell has no index to drop nor nodes to build it from (a new
-- cell): it is then of this layout at once, with no rebuild to record.
function UPGRADE.empty()
  return redis.call('ZCARD', NODES_KEY) == 0 and redis.call('EXISTS', IDX_SHAPES) == 0
end

-- One step of the drop under way.  Returns whether the drop ended (the
-- index is then this layout's with a rebuild under way: the caller loads
-- the policy again) and the nodes this step walked.
function UPGRADE.step(ctx, budget)
  local key = rebuild_key()
  local st = redis.call('HMGET', key, unpack(DROP_STATE))
  local walked = 0
  if not st[DROP_STATE.drop_shapes] then
    local from = '-'
    local cursor = st[DROP_STATE.drop_cursor]
    if cursor and cursor ~= '' then from = '(' .. cursor end
    local walk = budget * UPGRADE.WALK
    local ids = redis.call('ZRANGEBYLEX', NODES_KEY, from, '+', 'LIMIT', '0', fmt(walk))
    for _, id in ipairs(ids) do
      -- (a record that is no hash, corrupt state, has no entry to drop)
      local cur = redis.pcall('HGET', node_key(id), 'idx')
      if type(cur) == 'string' and cur ~= '' then
        -- (a large bucket loses its members one by one as the walk meets
        -- them, and goes whole once small: a DEL frees every member at once,
        -- 35 ms a step at 100,000 nodes)
        local bucket = bucket_key(cur)
        if redis.call('ZCARD', bucket) <= SMALL_BUCKET then
          redis.call('DEL', bucket)
        else
          redis.call('ZREM', bucket, id)
        end
        redis.call('HSET', node_key(id), 'idx', '')
      end
    end
    walked = #ids
    if #ids == walk then
      redis.call('HSET', key, 'drop_cursor', ids[#ids])
      return false, walked
    end
    redis.call('HSET', key, 'drop_shapes', '1')
  end
  -- then idx-seen and the shapes' streams, TRIM members a step
  local left, gone = UPGRADE.trim(IDX_SEEN, UPGRADE.TRIM)
  if not gone then return false, walked end
  local shapes = redis.call('SRANDMEMBER', IDX_SHAPES, fmt(UPGRADE.SHAPES))
  local dropped = {}
  for _, shape in ipairs(shapes) do
    local cpu_gone, mem_gone = false, false
    left, cpu_gone = UPGRADE.trim(dim_key('cpu', shape), left)
    if cpu_gone then left, mem_gone = UPGRADE.trim(dim_key('mem', shape), left) end
    if not mem_gone then break end
    dropped[#dropped + 1] = shape
  end
  if #dropped > 0 then redis.call('SREM', IDX_SHAPES, unpack(dropped)) end
  if #dropped < #shapes or #shapes == UPGRADE.SHAPES then return false, walked end
  redis.call('DEL', IDX_SHAPES)
  redis.call('HDEL', key, unpack(DROP_STATE))
  ctx[CTX.shapes], ctx[CTX.shape_set], ctx[CTX.firsts], ctx[CTX.firsts_more] = false, false, {}, {}
  ctx[CTX.sizes], ctx[CTX.members], ctx[CTX.picks] = {}, {}, false
  redis.call('HSET', POLICY_KEY, 'index_format', INDEX_FORMAT)
  REBUILD.start()
  return true, walked
end
