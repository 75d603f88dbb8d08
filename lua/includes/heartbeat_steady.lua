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
local function steady_one(ctx, A, P, now, swept)
  local node_id = A[1]
  local sid = A[2]
  local base = A[3]
  local reported = A[4]
  local nkey = node_key(node_id)
  local v = redis.call('HMGET', nkey, 'service_instance_id', 'incarnation', 'generation', 'idx',
    'roster_mode', 'idx_seen_ms', 'reported_order_ms', 'absent_watch', 'fails_owed')
  -- (absent_watch: the node has assigned reservations its rosters do not
  -- list yet, which a full heartbeat counts; fails_owed: a create_fails rise
  -- the next full heartbeat releases: includes/heartbeat.lua)
  if v[1] ~= sid or (v[2] or '') .. ':' .. (v[3] or '') ~= base or not v[4] or v[4] == ''
      or v[8] == '1' or (v[9] or '0') ~= '0' then
    return { 'RESYNC' }
  end
  now = now or heard_ms(P)
  -- (older than the newest the instance sent: nothing moves, answered OK;
  -- includes/heartbeat.lua)
  local order = (reported ~= '' and reported ~= '0') and reported or false
  if order and (tonumber(order) or 0) < (tonumber(v[7]) or 0) then
    return { tonumber(v[3]), v[5] == '1' and 1 or 0, instant_text(ctx, now), v[2] }
  end
  if not swept and #redis.call('ZRANGEBYSCORE', EXPIRY_KEY, '-inf', instant_text(ctx, now), 'LIMIT', '0', '1') > 0 then
    return { 'RESYNC' }
  end
  local generation = tonumber(v[3]) + 1
  local s_now = instant_text(ctx, now) -- (strings: Redis 7.0 prints a Lua number argument with %.17g)
  local hset = { 'last_seen_ms', s_now, 'generation', fmt(generation) }
  if reported == '0' then reported = s_now end
  if reported ~= '' then
    hset[#hset + 1] = 'reported_at_unix_ms'
    hset[#hset + 1] = reported
    if (v[7] or '0') ~= (order or '0') then
      hset[#hset + 1] = 'reported_order_ms'
      hset[#hset + 1] = order or '0'
    end
  end
  if seen_lags(v[6], now, P) then
    hset[#hset + 1] = 'idx_seen_ms'
    hset[#hset + 1] = s_now
    redis.call('ZADD', IDX_SEEN, s_now, node_id)
  end
  redis.call('HSET', nkey, unpack(hset))
  return { generation, v[5] == '1' and 1 or 0, s_now, v[2] }
end
