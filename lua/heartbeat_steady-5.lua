--[[
  heartbeat_steady-5.lua: a heartbeat in which nothing changed.

  The common case of a healthy fleet, kept cheap: a replica whose last write
  for this node is still the record's (same service instance, incarnation
  and generation), and whose new heartbeat carries the same snapshot and
  roster, only moves the node's clock.  This is exactly what heartbeat-5.lua
  would do with such a heartbeat when no reservation is due to expire and the
  node is in the placement index; otherwise this answers RESYNC and writes
  nothing, and the replica sends the heartbeat in full.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id
  ARGV[2]     service_instance_id
  ARGV[3]     "<incarnation>:<generation>" the replica last wrote
  ARGV[4]     reported_at_unix_ms: "" = unchanged, "0" = stamp with Redis time

  Returns {generation, roster mode 1/0, now_ms, incarnation} or {"RESYNC"}
  Errors: PRECONDITION (no policy)
  Writes: node:<id> last_seen_ms, generation (reported_at_unix_ms), and
          idx-seen when its score lags (includes/base.lua seen_lags)
]]
-- @include base
local node_id = ARGV[1]
local sid = ARGV[2]
local base = ARGV[3]
local reported = ARGV[4]

local P = load_clock()
if not P then return fail('PRECONDITION', NO_POLICY) end
local nkey = node_key(node_id)
local v = redis.call('HMGET', nkey, 'service_instance_id', 'incarnation', 'generation', 'idx',
  'roster_mode', 'idx_seen_ms')
if v[1] ~= sid or (v[2] or '') .. ':' .. (v[3] or '') ~= base or not v[4] or v[4] == '' then
  return { 'RESYNC' }
end
local now = heard_ms(P)
if #redis.call('ZRANGEBYSCORE', EXPIRY_KEY, '-inf', fmt(now), 'LIMIT', '0', '1') > 0 then
  return { 'RESYNC' } -- the full heartbeat sweeps and reindexes
end
local generation = tonumber(v[3]) + 1
local s_now = fmt(now) -- (strings: Redis 7.0 prints a Lua number argument with %.17g)
local hset = { 'last_seen_ms', s_now, 'generation', fmt(generation) }
if reported == '0' then reported = s_now end
if reported ~= '' then
  hset[#hset + 1] = 'reported_at_unix_ms'
  hset[#hset + 1] = reported
end
if seen_lags(v[6], now, P) then
  hset[#hset + 1] = 'idx_seen_ms'
  hset[#hset + 1] = s_now
  redis.call('ZADD', IDX_SEEN, s_now, node_id)
end
redis.call('HSET', nkey, unpack(hset))
return { generation, v[5] == '1' and 1 or 0, s_now, v[2] }
