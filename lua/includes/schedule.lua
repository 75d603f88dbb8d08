--[[
  includes/schedule.lua: one Schedule decision, the stages in order: replay,
  index, filter, pick, reserve.  schedule-5.lua makes one;
  schedule_batch-5.lua makes several in one call, in order, each seeing the
  ones before it (exactly as if they had come one by one).
]]
-- @exports finish_batch schedule_one
-- @include index
-- @include locality

-- A whole number argument ("" = the default), or nil when it is not one.
local function whole(arg, default)
  if arg == '' then return default end
  local v = number_of(arg)
  if v == nil or v < 0 or v % 1 ~= 0 then return nil end
  return v
end

-- (ctx, includes/ctx.lua: what the decisions of one call share: the policy,
-- the instant, the sweeps already done and, in a batch, the counters, read
-- once and written once by finish_batch.  A batch decides as if its requests
-- came one by one within the same millisecond.)

-- The rotation counter's next value, taken (given back by give_back_rr).
-- (A counter that is not an integer, a foreign write, starts over: it only
-- rotates equals.)
local function take_rr(ctx, rr_key, dry_run)
  if dry_run then return (tonumber(redis.call('GET', rr_key)) or 0) + 1 end
  if not ctx[CTX.batch] then
    local v = redis.pcall('INCR', rr_key)
    if type(v) == 'number' then return v end
    -- (any other refusal, an ACL's, is raised as Redis words it: called again)
    if not string.find(v.err, 'not an integer', 1, true) then return redis.call('INCR', rr_key) end
    redis.call('SET', rr_key, '1')
    return 1
  end
  if not ctx[CTX.rr] then ctx[CTX.rr] = tonumber(redis.call('GET', rr_key)) or 0 end
  ctx[CTX.rr] = ctx[CTX.rr] + 1
  return ctx[CTX.rr]
end

local function give_back_rr(ctx, rr_key)
  if ctx[CTX.batch] then ctx[CTX.rr] = ctx[CTX.rr] - 1 else redis.call('DECR', rr_key) end
end

-- The cell's count of reservations made, this one included (it orders a
-- node's reservations).
local function next_seq(ctx)
  if not ctx[CTX.batch] then return fmt(redis.call('HINCRBY', STATS_KEY, 'reserved_total', '1')) end
  if not ctx[CTX.seq] then
    local v = redis.call('HGET', STATS_KEY, 'reserved_total')
    ctx[CTX.seq] = number_of(v or '0')
    -- (it orders a node's reservations: never read as 0)
    if not count_ok(ctx[CTX.seq]) then
      error({ err = ERR.CORRUPT .. ' '
        .. corrupt_text(STATS_KEY, 'reserved_total', v, 'an integer >= 0') })
    end
  end
  ctx[CTX.seq] = ctx[CTX.seq] + 1
  return fmt(ctx[CTX.seq])
end

-- A batch's counters, written once at its end.
local function finish_batch(ctx, rr_key)
  if ctx[CTX.rr] then redis.call('SET', rr_key, fmt(ctx[CTX.rr])) end
  if ctx[CTX.seq] then redis.call('HSET', STATS_KEY, 'reserved_total', fmt(ctx[CTX.seq])) end
end

-- An empty list nobody writes to.
local NONE = {}

-- Picks a decision makes while the index is rebuilt before the full scan
-- decides (each one that fails takes a node out of the index it had left);
-- and while stale nodes are left that the sweeps have not reached (each one
-- that fails takes a stale node out, and its bucket's stale members).
local STALE_PICK_TRIES = 8
local UNSWEPT_PICK_TRIES = 8
-- ...and picks that met a stale node, in all the decisions of one call (a
-- batch's share them: 16 decisions of 8 each were 5-8 ms at 100,000 nodes)
local UNSWEPT_CALL_TRIES = 16

-- What a retry's replay reads of the reservation it made (a layout)
-- @layout REPLAY_RES
local REPLAY_RES = { 'state', 'node_id', 'cpu', 'memory_bytes', 'pressure' }
-- What the index's pick reads of the node it chose: its bucket holds the
-- decision inputs (a layout); PICK_READ_NS is it and the node's namespace
-- (the same positions first), for a request with artifact keys
-- @layout PICK_READ
local PICK_READ = { 'idx', 'endpoint', 'last_seen_ms', 'lingering', 'status' }
-- @layout PICK_READ_NS
local PICK_READ_NS = { 'idx', 'endpoint', 'last_seen_ms', 'lingering', 'status', 'cluster_id',
  'p2p_backend' }

-- round_robin and random without reading the fleet (#31): each decides
-- from a bounded walk or a bounded sample of the node list; when that finds
-- no eligible node of known capacity, the decision is least_loaded's
-- (through the index, bounded; the full scan applies the same rules on a
-- fleet of at most FULL_SCAN_MAX nodes, so a decision is the same whichever
-- decides; scheduler/testing/model.py holds the rules).
--   round_robin: the first eligible node of known capacity among the
--     SPREAD.WALK nodes after the cursor <base>rr-cursor (the node it chose
--     last) in node-id byte order, wrapping.
--   random: rejection sampling.  Draw i is node rank r_i of the node list
--     (r_1 = floor(rand * N), then MINSTD from s_1 = floor(rand * (M - 1))
--     + 1, r_i = floor(s_i * N / M)); the first of SPREAD.DRAWS draws that
--     is an eligible node of known capacity is chosen.  Each draw is uniform
--     over the nodes and accepted only within the eligible ones, so each is
--     chosen with the same probability, unless every draw misses (fewer
--     than about one node in DRAWS eligible).
local SPREAD = { WALK = 64, PAGE = 16, DRAWS = 32, M = 2147483647 }

-- The cursor's key, and the cursor ('' before any round_robin decision).
function SPREAD.key() return BASE .. 'rr-cursor' end
function SPREAD.cursor() return redis.call('GET', SPREAD.key()) or '' end

-- An eligible node of known capacity, evaluated, or nil.
function SPREAD.take(ctx, id, P, req, now, dry_run)
  local n = evaluate(id, P, req, now)
  if n.corrupt and n.idx ~= '' and not dry_run then touch(ctx, id) end
  if n.reason == nil and n.known then return n end
  return nil
end

function SPREAD.round_robin(ctx, P, req, now)
  local after = SPREAD.cursor()
  local left, from, to = SPREAD.WALK, '-', '+'
  if after ~= '' then from = '(' .. after end
  for pass = 1, 2 do
    if pass == 2 then
      if after == '' then return nil end
      from, to = '-', '[' .. after
    end
    while left > 0 do
      local page = math.min(left, SPREAD.PAGE)
      local ids = redis.call('ZRANGEBYLEX', NODES_KEY, from, to, 'LIMIT', '0', fmt(page))
      for _, id in ipairs(ids) do
        local n = SPREAD.take(ctx, id, P, req, now)
        if n then return n end
      end
      left = left - #ids
      if #ids < page then break end
      from = '(' .. ids[#ids]
    end
  end
  return nil
end

-- Draw i's rank among n nodes, and the MINSTD state after it.
function SPREAD.draw(i, s, rand, n)
  if i == 1 then return math.floor(rand * n), s end
  s = (s * 48271) % SPREAD.M
  return math.floor(s * n / SPREAD.M), s
end
function SPREAD.seed(rand) return math.floor(rand * (SPREAD.M - 1)) + 1 end

function SPREAD.random(ctx, P, req, now, rand)
  local n = redis.call('ZCARD', NODES_KEY)
  if n == 0 then return nil end
  local s = SPREAD.seed(rand)
  for i = 1, SPREAD.DRAWS do
    local r
    r, s = SPREAD.draw(i, s, rand, n)
    local at = fmt(r)
    local id = redis.call('ZRANGE', NODES_KEY, at, at)[1]
    local picked = id and SPREAD.take(ctx, id, P, req, now)
    if picked then return picked end
  end
  return nil
end

-- The full scan's pick, one per strategy of scheduler/domain/catalog.py STRATEGIES
-- (tests/test_catalog.py holds the names to the catalog's): one node of
-- `group` (the eligible nodes, those of known capacity if any), given the
-- rotation counter's turn `rr_next`, the request's random number in [0, 1)
-- and every node evaluated (byte order by id).
SPREAD.PICK = {
  -- the best ranked (ranks_before), equals in rotation
  least_loaded = function(group, rr_next)
    local best = {}
    for _, n in ipairs(group) do
      if #best == 0 or ranks_before(n, best[1]) then
        best = { n }
      elseif not ranks_before(best[1], n) then
        best[#best + 1] = n
      end
    end
    return best[((rr_next - 1) % #best) + 1]
  end,
  -- (SPREAD's rules over the whole list: the walk's nodes, then least_loaded)
  round_robin = function(group, rr_next, _, evaluated)
    local after, total = SPREAD.cursor(), #evaluated
    local start = 1
    if after ~= '' then
      start = total + 1
      for i, n in ipairs(evaluated) do
        if bytes_lt(after, n.id) then
          start = i
          break
        end
      end
    end
    for j = 0, math.min(SPREAD.WALK, total) - 1 do
      local n = evaluated[(start - 1 + j) % total + 1]
      if n.reason == nil and n.known then return n end
    end
    return SPREAD.PICK.least_loaded(group, rr_next)
  end,
  random = function(group, rr_next, rand, evaluated)
    local s, n = SPREAD.seed(rand), #evaluated
    for i = 1, SPREAD.DRAWS do
      local r
      r, s = SPREAD.draw(i, s, rand, n)
      local x = evaluated[r + 1]
      if x.reason == nil and x.known then return x end
    end
    return SPREAD.PICK.least_loaded(group, rr_next)
  end,
}

-- Phase "arguments": the policy, the kind, the strategy, the request's
-- numbers, the random number and the locality argument checked; nothing
-- read but the policy.  The policy, the strategy, the request and the
-- locality (nil: off), or false and the error reply.
local function schedule_args(ctx, kind, dry_run, strategy_arg, cpu_arg, mem_arg, rid, rand,
    loc_arg)
  local P = ctx[CTX.P] or load_policy(ctx)
  if not P then return false, fail(ERR.NO_POLICY, NO_POLICY) end
  ctx[CTX.P] = P

  if kind ~= 'create' and kind ~= 'route' then
    return false, fail(ERR.BADARG, 'kind must be create or route')
  end
  local strategy = strategy_arg
  if strategy == '' then strategy = P.strategy end
  if not STRATEGIES[strategy] then
    return false, fail(ERR.BADARG, 'strategy must be ' .. STRATEGY_CHOICES .. ', not ' .. strategy)
  end
  local req = { create = kind == 'create', count = 0, cpu = 0, mem = 0 }
  if req.create then
    req.count = 1
    req.cpu = whole(cpu_arg, P.default_cpu)
    if req.cpu == nil then
      return false, fail(ERR.BADARG, 'cpu must be a non-negative whole number')
    end
    req.mem = whole(mem_arg, P.default_memory_bytes)
    if req.mem == nil then
      return false, fail(ERR.BADARG, 'memory_bytes must be a non-negative whole number')
    end
    if not dry_run and (rid == nil or rid == '') then
      return false, fail(ERR.BADARG, 'reservation_id is required')
    end
  end
  if strategy == 'random' and (rand == nil or rand < 0 or rand >= 1) then
    return false, fail(ERR.BADARG, 'random must be in [0, 1)')
  end
  -- locality (includes/locality.lua): on for least_loaded creations that
  -- carry it, in a cell whose locality.weight > 0; nil otherwise
  local L = nil
  if loc_arg ~= nil and loc_arg ~= '' then
    L = LOCALITY.parse(P, loc_arg)
    if L == false then return false, fail(ERR.BADARG, 'locality is not a locality argument') end
    if not (req.create and strategy == 'least_loaded') then L = nil end
  end
  return P, strategy, req, L
end

-- Phase "replay": a retry (the same reservation id, after a connection
-- error or a failover) gets the placement the first attempt made; an id its
-- caller gave up on (cancelled before this call ran) places nothing.
-- `prior`: the reservation of that id (REPLAY_RES), found.  The reply.
local function replayed(P, req, rid, now, prior)
  if prior[REPLAY_RES.state] == 'cancelled' or prior[REPLAY_RES.state] == 'expired' then
    return fail(ERR.PRECONDITION, 'reservation ' .. rid .. ' was '
      .. prior[REPLAY_RES.state] .. ' before its placement was answered')
  end
  if prior[REPLAY_RES.cpu] ~= fmt(req.cpu)
      or prior[REPLAY_RES.memory_bytes] ~= fmt(req.mem) then
    return fail(ERR.BADARG, 'reservation_id ' .. rid .. ' is already used by another request')
  end
  local n = read_node(prior[REPLAY_RES.node_id])
  read_status(n, P, now)
  return { prior[REPLAY_RES.node_id], n.endpoint, rid, prior[REPLAY_RES.pressure] or '0',
    req.cpu, req.mem, n.status, now }
end

-- A decision found the placement index disagreeing with node `id`'s record:
-- the index is rebuilt from the records (in steps), and this decision is the
-- full scan's.
local function index_disagrees(ctx, id)
  redis.log(redis.LOG_WARNING, 'placement index disagrees on ' .. id .. ': rebuilding')
  REBUILD.start()
  load_policy(ctx)
end

-- Phase "index": least_loaded looks at few nodes (see includes/index.lua);
-- the chosen node's record must sit in one of the buckets it was chosen
-- among.  The node chosen, evaluated from its bucket, or nil: the full scan
-- decides (and an index found to disagree is rebuilt); nil, true: no node is
-- eligible (the index holds every node schedulable whatever the request, and
-- no rebuild is under way).
local function index_chosen(ctx, P, req, rr_next, now, L)
  -- While the index is rebuilt, an entry may still be the old policy's;
  -- while the sweeps have not reached every node whose heartbeat went stale
  -- (more than a sweep takes: a rack gone dark, a settle), an entry may be
  -- a stale node's.  Then the chosen node is reindexed from its record
  -- first, and one that leaves its bucket (out of the index, or elsewhere)
  -- is not taken; the pick runs again without it, a bounded number of
  -- times, and then the full scan decides.  (Its rank is the best of the
  -- fresh nodes; among its equals the turn may count stale members still
  -- listed, where the full scan's would not.  Each call used to go to the
  -- full scan while stale nodes were left: about 167 ms of Redis CPU a
  -- placement at 10,000 nodes, 1,000 of them dark.)
  local rebuilding = P.index_rebuild ~= nil
  local stale = rebuilding or ctx[CTX.fresh] ~= true
  local tries = 1
  if rebuilding then
    tries = STALE_PICK_TRIES
  elseif stale then
    tries = UNSWEPT_PICK_TRIES
  end
  for _ = 1, tries do
    local picked, among = pick_indexed(ctx, P, req, rr_next)
    -- (and the members of its equals the pass has not reached yet, so
    -- that the turn among them is the full scan's)
    for _ = 1, tries do
      if not (rebuilding and picked and REBUILD.check(ctx, P, now, among)) then break end
      picked, among = pick_indexed(ctx, P, req, rr_next)
    end
    -- @phase pick
    -- (nothing eligible in an index that holds every schedulable node, and
    -- stale ones besides: nothing is)
    if not picked then return nil, not rebuilding end
    -- The record must sit in one of the buckets it was chosen among; its
    -- bucket then holds every decision input, so nothing else is read.
    -- (with artifact keys, the node's namespace too: locality reads it)
    local v
    if L and #L.keys > 0 then
      v = redis.call('HMGET', node_key(picked), unpack(PICK_READ_NS))
    else
      v = redis.call('HMGET', node_key(picked), unpack(PICK_READ))
    end
    local listed = false
    for i = 1, #among do
      if among[i] == v[PICK_READ.idx] then listed = true end
    end
    if listed and not (stale and reindex(ctx, picked, P, now, true) ~= v[PICK_READ.idx]) then
      local n = node_of_bucket(v[PICK_READ.idx])
      n.id, n.idx, n.endpoint = picked, v[PICK_READ.idx], v[PICK_READ.endpoint] or ''
      n.last_seen, n.lingering, n.reported = tonumber(v[PICK_READ.last_seen_ms]),
        v[PICK_READ.lingering] == '1', v[PICK_READ.status] or ''
      read_status(n, P, now)
      project(n, req)
      if v[PICK_READ_NS.cluster_id] ~= nil then
        n.ns = LOCALITY.ns_of(v[PICK_READ_NS.cluster_id], v[PICK_READ_NS.p2p_backend])
      end
      if not check_status(n) then return n end
    end
    if not (stale and listed) then
      -- (a member its record does not place there, a foreign write among
      -- them, leaves those buckets: the rebuild goes by the records; this
      -- decision is the full scan's)
      if not listed then
        for i = 1, #among do idx_remove(ctx, picked, among[i]) end
      end
      index_disagrees(ctx, picked)
      return nil
    end
    -- (a node not taken while stale ones are left: its bucket's stale
    -- members go with it, its equals that went dark at once; the call's
    -- picks spent, the decision is the full scan's, or BEHIND)
    if not rebuilding then
      sweep_stale_bucket(ctx, P, now, v[PICK_READ.idx])
      local left = (ctx[CTX.stale_tries] or UNSWEPT_CALL_TRIES) - 1
      ctx[CTX.stale_tries] = left
      if left <= 0 then return nil end
    end
  end
  return nil
end

-- Phase "full scan": every node evaluated (byte order by id), then the
-- strategy's pick among those of known capacity, never-heard-from ones as
-- fallback.  The node chosen or nil, every node evaluated, and the refusal
-- ('' when one was chosen).
local function full_scan(ctx, P, req, now, dry_run, strategy, rr_next, rand)
  local ids = redis.call('ZRANGE', NODES_KEY, '0', '-1')
  local evaluated, known, unknown, counts = {}, {}, {}, {}
  -- (the picks met only stale nodes the sweeps had left: the scan, which
  -- reads every record anyway, takes every stale one out, so the fleet is
  -- read once for the lot, not once a call until the sweeps are done)
  local behind = false
  if ctx[CTX.fresh] == 'behind' and not dry_run then
    behind = stale_before(P, now)
    ctx[CTX.fresh] = true
  end
  for i, id in ipairs(ids) do
    local n = evaluate(id, P, req, now)
    evaluated[i] = n
    -- (a corrupt record the index still holds leaves it: reindex_touched)
    if n.corrupt and n.idx ~= '' and not dry_run then touch(ctx, id) end
    if behind and n.idx ~= '' and n.last_seen and n.last_seen < behind then touch(ctx, id) end
    if n.reason then
      if i <= REFUSAL_COUNTED then counts[n.reason] = (counts[n.reason] or 0) + 1 end
    elseif n.known then
      known[#known + 1] = n
    else
      unknown[#unknown + 1] = n
    end
  end
  local group = known
  if #group == 0 then group = unknown end
  if #group == 0 then return nil, evaluated, summarize_reasons(counts, #ids) end
  return SPREAD.PICK[strategy](group, rr_next, rand, evaluated), evaluated, ''
end

-- Phase "refusal": the index found nothing eligible, and it holds every node
-- schedulable whatever the request, so nothing is: the reasons of the first
-- REFUSAL_COUNTED nodes by id (the full scan's count, without reading the
-- fleet).  The refusal, or nil when one of them is eligible after all: the
-- index disagrees with the records, it is rebuilt and the full scan decides.
local function refusal_counted(ctx, P, req, now)
  local ids = redis.call('ZRANGE', NODES_KEY, '0', fmt(REFUSAL_COUNTED - 1))
  local counts = {}
  for _, id in ipairs(ids) do
    local n = evaluate(id, P, req, now)
    if n.corrupt and n.idx ~= '' then touch(ctx, id) end
    if not n.reason then
      index_disagrees(ctx, id)
      return nil
    end
    counts[n.reason] = (counts[n.reason] or 0) + 1
  end
  local total = #ids
  if total == REFUSAL_COUNTED then total = redis.call('ZCARD', NODES_KEY) end
  return summarize_reasons(counts, total)
end

-- An explain row, one node's: contracts.py Verdict's fields, in order
-- (tests/test_contracts.py holds them equal)
-- @layout VERDICT
local VERDICT = { 'id', 'status', 'reason', 'pressure', 'known', 'starting', 'running',
  'paused', 'projected_cpu', 'projected_memory', 'cpu_capacity', 'memory_capacity', 'endpoint',
  'coverage', 'bonus', 'locality' }

-- Phase "explain" (a dry run): the decision and every node evaluated, with
-- its inputs; nothing written.
local function explained(now, strategy, chosen, rr_next, req, refusal, warm, evaluated, L)
  local out = { fmt(now), strategy, chosen and chosen.id or '', fmt(rr_next), fmt(req.cpu),
    fmt(req.mem), refusal }
  local warm_by = {}
  for _, w in ipairs(warm) do warm_by[w.id] = w end
  for _, n in ipairs(evaluated) do
    local row = { n.id, n.status, n.reason or '', fmt(n.pressure), n.known and '1' or '0',
      fmt(n.starting), fmt(n.running), fmt(n.paused), fmt(n.proj_cpu), fmt(n.proj_mem),
      fmt(n.cpu_cap), fmt(n.mem_cap), n.endpoint }
    local w = warm_by[n.id] or n
    if L and w.coverage then
      row[VERDICT.coverage], row[VERDICT.bonus], row[VERDICT.locality] =
        fmt(w.coverage), fmt(w.bonus), w.lost or ''
    end
    out[#out + 1] = row
  end
  return out
end

-- Phase "reserve": the placement counts in every projection from now on:
-- the reservation, its expiry, the node's pending load and index entry.
local function reserved(ctx, P, req, rid, n, now, L)
  -- the cell's count of reservations made, this one included, orders a node's reservations
  local seq = next_seq(ctx)
  -- (text, not a bare number: Redis 7.0 prints a Lua number with %.17g, which is
  -- far slower than fmt's integer conversion; the decisions of one call share
  -- their instant, so instant_text makes each text once a call)
  -- (unassigned, it ends after unassigned_reservation_ttl; its assignment
  -- moves the expiry to placement_reservation_ttl after the Schedule)
  local ttl = P.reservation_ttl_ms
  if P.unassigned_reservation_ttl_ms < ttl then ttl = P.unassigned_reservation_ttl_ms end
  local s_expires = instant_text(ctx, now + ttl)
  -- (a locality placement's group in the same write)
  if L and L.group then
    redis.call('HSET', res_key(rid), 'reservation_id', rid, 'node_id', n.id,
      'cpu', num_text(req.cpu), 'memory_bytes', num_text(req.mem), 'state', 'pending', 'seq', seq,
      'created_ms', instant_text(ctx, now), 'expires_ms', s_expires,
      'pressure', num_text(n.pressure), 'locality', L.group)
    LOCALITY.reserve(P, L, n, now)
  else
    redis.call('HSET', res_key(rid), 'reservation_id', rid, 'node_id', n.id,
      'cpu', num_text(req.cpu), 'memory_bytes', num_text(req.mem), 'state', 'pending', 'seq', seq,
      'created_ms', instant_text(ctx, now), 'expires_ms', s_expires,
      'pressure', num_text(n.pressure))
  end
  if ctx[CTX.new_ids] then ctx[CTX.new_ids][rid] = true end
  redis.call('ZADD', node_res_key(n.id), seq, rid)
  redis.call('ZADD', EXPIRY_KEY, s_expires, rid)
  -- @phase reservation_writes
  -- the node's new pending load and index entry, in one write
  n.pend_count = n.pend_count + 1
  n.pend_cpu = n.pend_cpu + req.cpu
  n.pend_mem = n.pend_mem + req.mem
  -- (an unindexed node, or an index of another layout: reindexed after the
  -- decision, includes/index_moves.lua index_entry)
  local want = n.idx
  if n.idx ~= '' and P.index_format == INDEX_FORMAT then
    want = bucket_of(n)
  else
    touch(ctx, n.id)
  end
  move_index(ctx, n, want, true)
  -- @phase index_move
  redis.call('HSET', node_key(n.id), 'pending_count', num_text(n.pend_count), 'pending_cpu',
    num_text(n.pend_cpu), 'pending_memory_bytes', num_text(n.pend_mem), 'idx', want)
  -- @phase node_write
end

-- Stage "index ready" (a decision through the index): a step of a rebuild
-- under way (includes/index_moves.lua), one a call, the step that ends it
-- leaving a policy without index_rebuild; the stale entries' sweep, once a
-- call (a batch's later decisions pick around what is left, so a call stays
-- bounded when more went stale than a sweep takes).  The policy, reloaded
-- when a rebuild ended.
local function index_ready(ctx, P, now)
  if P.index_format ~= INDEX_FORMAT then return P end
  if P.index_rebuild and not ctx[CTX.rebuilt] then
    ctx[CTX.rebuilt] = true
    if REBUILD.step(ctx, P, now, REBUILD.PLACEMENT_STEP) then P = load_policy(ctx) end
  end
  if ctx[CTX.fresh] == false then
    ctx[CTX.fresh] = sweep_stale(ctx, P, now, PLACEMENT_STALE_BATCH) or 'behind'
  end
  return P
end

-- Stage "behind": a decision the index could not make (built
-- anew, rebuilt, stale nodes still listed past the picks' tries, or found
-- to disagree) goes to the full scan only on a fleet of FULL_SCAN_MAX
-- nodes at most; on a larger one reading the fleet would hold Redis for
-- seconds (every call of the cell waiting), so the decision is refused,
-- retryable, with what is under way.  Every replica's monitor takes the
-- index's steps (index_rebuild-5.lua: the rebuild, the drop of an old
-- layout, the stale sweep) until it is whole, each call bounded.  The
-- message, or nil when the full scan may decide.
local function index_behind(ctx)
  local total = redis.call('ZCARD', NODES_KEY)
  if total <= FULL_SCAN_MAX then return nil end
  local P = ctx[CTX.P] -- (a pick that found the index wrong started a rebuild)
  local why
  if P.index_format ~= INDEX_FORMAT then
    why = 'the placement index is being built anew (index_format '
      .. (P.index_format or 'absent') .. ')'
  elseif P.index_rebuild then
    why = 'the placement index is being rebuilt'
  else
    why = 'nodes whose heartbeat went stale are still listed in the placement index'
  end
  return 'no decision without reading all ' .. fmt(total) .. ' nodes (a Schedule reads at most '
    .. fmt(FULL_SCAN_MAX) .. '): ' .. why .. '; retry, the replicas catch it up in bounded steps'
end

-- One Schedule (schedule-5.lua's ARGV, typed): its reply, or an error reply.
-- Phase by phase (each phase above says what it decides); every check comes
-- before the first write.
local function schedule_one(ctx, RR_KEY, kind, dry_run, strategy_arg, cpu_arg, mem_arg, rid, rand,
    loc_arg)
  -- @phase-begin (phase marks: `python -m bench phases` times them; comments otherwise)
  local P, strategy, req, L = schedule_args(ctx, kind, dry_run, strategy_arg, cpu_arg, mem_arg,
    rid, rand, loc_arg)
  if not P then return strategy end -- (the error reply)
  local now = ctx[CTX.now] or now_ms(P)
  ctx[CTX.now] = now
  -- @phase arguments
  -- (a batch that found none of its ids in Redis reads only ids it reserved itself)
  if req.create and not dry_run and not (ctx[CTX.new_ids] and not ctx[CTX.new_ids][rid]) then
    local prior = redis.call('HMGET', res_key(rid), unpack(REPLAY_RES))
    if prior[REPLAY_RES.state] then return replayed(P, req, rid, now, prior) end
  end
  -- @phase replay
  -- The rotation counter moves once per decision: taken now, given back on a refusal.
  local rr_next = take_rr(ctx, RR_KEY, dry_run)
  local chosen, none = nil, false
  if not dry_run then
    -- Sweeps, before a decision: due expiries, the nodes this call's load
    -- moved reindexed, a step of an index rebuild under way, stale index
    -- entries.  (At one instant, a sweep that found less than a full batch
    -- due leaves nothing for the next decision of the same call.)
    if ctx[CTX.more_due] ~= false then
      ctx[CTX.more_due] = sweep_expired(ctx, now) >= SWEEP_BATCH
    end
    reindex_touched(ctx, P, now)
    if strategy == 'least_loaded' then P = index_ready(ctx, P, now) end
    -- @phase sweeps
    if strategy == 'least_loaded' and P.index_format == INDEX_FORMAT then
      chosen, none = index_chosen(ctx, P, req, rr_next, now, L)
    end
  end
  -- Stage "spread": round_robin and random from a bounded walk or sample
  -- (SPREAD); when it finds nothing, least_loaded's decision through the
  -- index, whose refusal is counted as least_loaded's is.
  if chosen == nil and not dry_run and strategy ~= 'least_loaded' then
    chosen = SPREAD[strategy](ctx, P, req, now, rand)
    if chosen == nil then
      P = index_ready(ctx, P, now)
      if P.index_format == INDEX_FORMAT then
        chosen, none = index_chosen(ctx, P, req, rr_next, now, nil)
      end
    end
  end
  -- @phase record_check
  -- (decided through the index or the spread, no node is evaluated: NONE
  -- stands for the list)
  local evaluated, refusal = NONE, ''
  if chosen == nil and none then refusal = refusal_counted(ctx, P, req, now) or '' end
  if chosen == nil and refusal == '' then
    local behind = not dry_run and index_behind(ctx)
    if behind then
      give_back_rr(ctx, RR_KEY)
      reindex_touched(ctx, P, now)
      return fail(ERR.BEHIND, behind)
    end
    chosen, evaluated, refusal = full_scan(ctx, P, req, now, dry_run, strategy, rr_next, rand)
  end
  -- Stage "locality": a warm node may win within the pressure margin of
  -- the node just chosen (includes/locality.lua).
  local warm = NONE
  if L and chosen ~= nil then
    -- (while the index is rebuilt a warm node's bucket may be the old
    -- policy's: its record is evaluated whole)
    chosen, warm = LOCALITY.choose(P, req, now, L, chosen, #evaluated == 0 and not P.index_rebuild,
      dry_run)
  end
  if dry_run then
    return explained(now, strategy, chosen, rr_next, req, refusal, warm, evaluated, L)
  end
  if chosen == nil then
    give_back_rr(ctx, RR_KEY)
    redis.call('HINCRBY', STATS_KEY, 'refused_total', '1')
    reindex_touched(ctx, P, now)
    return fail(ERR.NO_NODES, refusal)
  end
  -- @phase full_scan
  if strategy == 'round_robin' then redis.call('SET', SPREAD.key(), chosen.id) end
  local out_rid = ''
  if req.create then
    reserved(ctx, P, req, rid, chosen, now, L)
    out_rid = rid
  end
  reindex_touched(ctx, P, now)
  -- @phase tail
  -- (whole numbers travel as integer replies; the pressure as exact text)
  if L then
    return { chosen.id, chosen.endpoint, out_rid, num_text(chosen.pressure), req.cpu, req.mem,
      chosen.status, now, LOCALITY.note(chosen), chosen.pull }
  end
  return { chosen.id, chosen.endpoint, out_rid, num_text(chosen.pressure), req.cpu, req.mem,
    chosen.status, now }
end
