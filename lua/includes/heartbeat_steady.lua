--[[
  includes/heartbeat_steady.lua: one heartbeat in which nothing changed
  (heartbeat_steady-5.lua's ARGV as `A`); heartbeat_steady-5.lua makes one,
  heartbeat_batch-5.lua any number.
]]
-- @exports steady_one
-- @include base

-- `P`: the clock fields of the policy (load_clock, or a whole policy).
-- `now`: the call's instant, nil to read it here.  `swept`: the call swept
-- and nothing is left due at `now` (else a due reservation is a RESYNC: the
-- full heartbeat sweeps and reindexes).
-- What a steady heartbeat reads: its checks (STEADY_CHECKS of them), then,
-- one heartbeat in VOUCH_EVERY (by generation), the numbers decisions read
-- (includes/stages.lua CHECKED), which it vouches for by moving the clock
-- alone: a record whose numbers are not ones (corrupt state) is a RESYNC,
-- and the full heartbeat rewrites them.  (The pending numbers, derived, may
-- be absent; the snapshot's never are on a record a full heartbeat wrote.)
-- (Every heartbeat would cost a steady one 27% more Redis instructions, 45%
-- coalesced; one in four costs 6% and 10%: docs/performance.md.)  A
-- placement or a reindex that reads the record meanwhile excludes the node
-- at once (and its next steady heartbeat is a RESYNC).
-- What it reads, by name (v[STEADY_READ.generation]: a layout, folded to
-- positions by the loader): the checks (up to roster_digest), then the
-- pending numbers (from STEADY_PENDING); the snapshot's numbers follow
-- (WHOLE_FIELDS, appended at the first call, unnamed: from STEADY_SNAPSHOT,
-- the 17th).  Read as `unpack(STEADY_READ, 1, n)`, never whole by name.
-- @layout STEADY_READ
local STEADY_READ = { 'service_instance_id', 'incarnation', 'generation', 'idx', 'roster_mode',
  'idx_seen_ms', 'reported_order_ms', 'absent_watch', 'fails_owed', 'stamp_lead',
  'stamp_lead_was', 'stamp_lead_at', 'roster_digest',
  'pending_count', 'pending_cpu', 'pending_memory_bytes' }
local VOUCH_EVERY = 4
local STEADY_CHECKS = STEADY_READ.roster_digest
local STEADY_PENDING, STEADY_SNAPSHOT = STEADY_READ.pending_count, 17
-- Texts that passed the check (kept_table, includes/base.lua): the same
-- counts and sizes come back heartbeat after heartbeat.
local COUNT_TEXTS = kept_table(4096)
local function count_text_ok(s)
  if COUNT_TEXTS.t[s] then return true end
  if #s < 1 or #s > 16 or string.find(s, '%D') then return false end
  keep(COUNT_TEXTS, s, true)
  return true
end

local function steady_one(ctx, A, P, now, swept)
  local node_id = A[1]
  local sid = A[2]
  local base = A[3]
  local reported = A[4]
  local nkey = node_key(node_id)
  if #STEADY_READ < STEADY_SNAPSHOT then
    for name, _ in pairs(WHOLE_FIELDS) do STEADY_READ[#STEADY_READ + 1] = name end
  end
  -- (the generation the replica last wrote, from its base "<incarnation>:<generation>")
  local vouch = tonumber(string.match(base, '(%d+)$') or '0') % VOUCH_EVERY == 0
  local v = redis.call('HMGET', nkey,
    unpack(STEADY_READ, 1, vouch and #STEADY_READ or STEADY_CHECKS))
  -- (absent_watch: the node has assigned reservations its rosters do not
  -- list yet, which a full heartbeat counts; fails_owed: a create_fails rise
  -- the next full heartbeat releases: includes/heartbeat.lua; roster_digest
  -- "": a sandbox left the roster held other than by this node's heartbeat
  -- (another node's roster took it, a DELETE buried it: roster_changed,
  -- includes/bindings.lua), and the full heartbeat restores what it lists)
  if v[STEADY_READ.service_instance_id] ~= sid
      or (v[STEADY_READ.incarnation] or '') .. ':' .. (v[STEADY_READ.generation] or '') ~= base
      or not v[STEADY_READ.idx] or not string.find(v[STEADY_READ.idx], '^%d')
      or v[STEADY_READ.absent_watch] == '1' or (v[STEADY_READ.fails_owed] or '0') ~= '0'
      or v[STEADY_READ.roster_digest] == '' then
    return { 'RESYNC' }
  end
  for i = STEADY_PENDING, #v do
    local s = v[i]
    if s then
      if not count_text_ok(s) then return { 'RESYNC' } end
    elseif i >= STEADY_SNAPSHOT then
      return { 'RESYNC' }
    end
  end
  now = now or heard_ms(P)
  -- (older than the newest the instance sent: nothing moves, answered OK,
  -- naming no incarnation, as includes/heartbeat.lua does: the replica must
  -- not take the late heartbeat's fields for the record's, or the same late
  -- heartbeat again would go as steady without its stamp and move the clock)
  local order = (reported ~= '' and reported ~= '0') and reported or false
  if order and (tonumber(order) or 0) < (tonumber(v[STEADY_READ.reported_order_ms]) or 0) then
    return { tonumber(v[STEADY_READ.generation]), v[STEADY_READ.roster_mode] == '1' and 1 or 0,
      instant_text(ctx, now), '' }
  end
  if not swept and #redis.call('ZRANGEBYSCORE', EXPIRY_KEY, '-inf', instant_text(ctx, now),
      'LIMIT', '0', '1') > 0 then
    return { 'RESYNC' }
  end
  local generation = tonumber(v[STEADY_READ.generation]) + 1
  -- (strings: Redis 7.0 prints a Lua number argument with %.17g)
  local s_now = instant_text(ctx, now)
  local hset = { 'last_seen_ms', s_now, 'generation', fmt(generation) }
  if reported == '0' then reported = s_now end
  if reported ~= '' then
    hset[#hset + 1] = 'reported_at_unix_ms'
    hset[#hset + 1] = reported
    if (v[STEADY_READ.reported_order_ms] or '0') ~= (order or '0') then
      hset[#hset + 1] = 'reported_order_ms'
      hset[#hset + 1] = order or '0'
    end
  end
  -- (every stamped heartbeat applied is a sample of the stamp lead, a
  -- steady one too: includes/base.lua stamp_lead)
  if order then
    stamp_lead(v[STEADY_READ.stamp_lead], v[STEADY_READ.stamp_lead_was],
      v[STEADY_READ.stamp_lead_at], hset, order, now)
  end
  if seen_lags(v[STEADY_READ.idx_seen_ms], now, P) then
    hset[#hset + 1] = 'idx_seen_ms'
    hset[#hset + 1] = s_now
    redis.call('ZADD', IDX_SEEN, s_now, node_id)
  end
  redis.call('HSET', nkey, unpack(hset))
  return { generation, v[STEADY_READ.roster_mode] == '1' and 1 or 0, s_now,
    v[STEADY_READ.incarnation] }
end
