--[[
  rewound-5.lua: the cell's data went back in time (Redis restarted from an
  old snapshot, or Sentinel promoted a replica that was behind), or Redis
  time jumped: a replica's health check saw it (scheduler/domain/history.py).  The
  cell settles as after a failover, and what came back from the past is not
  trusted.

  "settle": unless another replica already did it for this history (the
  stats field `rewinds`, the generation, is past the one the caller saw):
  when ARGV[2] gives the cell time the caller expected and the cell's clock
  is off it by more than ARGV[3] ms, the clock is put back where it should
  be (policy time_offset_ms moves by the difference; a frozen drill clock is
  left alone), so a clock that jumped forward expires nothing and one that
  jumped back keeps no dead node READY; then every node not heard from since
  must heartbeat again before a placement goes to it (settle_ms, as
  settle-5.lua), and the generation rises.
  "reconcile": the live reservations made before ARGV[2] (the settled
  cell's: the caller passes now minus a grace in which a creation in flight
  may not be in its node's roster yet) end, at most ARGV[3] of them
  per call, oldest first: each either ended since (its count is gone from
  the node) or its node's next heartbeat, which the settle waits for, lists
  its sandbox and counts it.  They end cancelled, counted in stats
  rewound_total too.

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  ARGV[1]     mode | mode: "settle" | "reconcile"
  ARGV[2]     generation | before_ms: settle: the generation the caller saw;
              reconcile: the cut-off (cell time, ms)
  ARGV[3]     expected_ms | most: settle: the cell time (ms) the caller
              expected, or "" (no clock check); reconcile: most to end
  ARGV[4]     bound_ms | spare: or absent (reconcile sends three); settle:
              the clock bound (ms), always sent
  ARGV[5]     probed | spare2: or absent; settle: the lower generation the
              caller's probe read, when that is why it settles: a server
              whose generation is ARGV[2] or more is then not settled
              ("known": the probe was another server's)

  Returns settle: {outcome "settled"|"known", generation, now_ms, moved_ms
                   (the clock moved by), age_ms (since the cell's last
                   recorded probe)}
          reconcile: {ended, more "1" when more may be due else "0"}
  Errors: NO_POLICY (no policy)
  Writes: settle: policy settle_ms, time_offset_ms; stats rewinds;
          reconcile: res:<id> (cancelled), node-res:<node>, node:<node>
          pending_*, expiry, stats cancelled_total, rewound_total, the index
]]
-- @include index
local mode = ARGV[1]
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)

if mode == 'reconcile' then
  local cutoff, most = tonumber(ARGV[2]), tonumber(ARGV[3])
  -- (the expiry set is every live reservation's, by created + TTL: the oldest first)
  local due = redis.call('ZRANGEBYSCORE', EXPIRY_KEY, '-inf', fmt(cutoff + P.reservation_ttl_ms),
    'LIMIT', '0', fmt(most))
  local ended = 0
  for _, rid in ipairs(due) do
    local created = tonumber(redis.call('HGET', res_key(rid), 'created_ms'))
    if created == nil or created < cutoff then
      if end_reservation(ctx, rid, 'cancelled', now) then ended = ended + 1 end
    end
  end
  if ended > 0 then redis.call('HINCRBY', STATS_KEY, 'rewound_total', fmt(ended)) end
  reindex_touched(ctx, P, now)
  return { ended, (#due == most and ended > 0) and '1' or '0' }
end

local generation = tonumber(redis.call('HGET', STATS_KEY, 'rewinds')) or 0
local seen = tonumber(ARGV[2]) or 0
-- (a probe that read a lower generation than the caller saw, while this
-- server has it: the probe was another server's, the old primary answering
-- late at a failover; this data is not from before the settle it saw)
if generation > seen or (ARGV[5] and generation >= seen) then
  return { 'known', fmt(generation), fmt(now), 0, 0 }
end
local moved = 0
local expected = tonumber(ARGV[3])
if expected and not P.frozen_now_ms and math.abs(now - expected) > tonumber(ARGV[4]) then
  moved = expected - now
  redis.call('HINCRBY', POLICY_KEY, 'time_offset_ms', fmt(moved))
  now = expected
end
if not P.settle_ms or now > P.settle_ms then
  redis.call('HSET', POLICY_KEY, 'settle_ms', fmt(now))
end
repack_policy()
local probed = tonumber(redis.call('HGET', STATS_KEY, 'probed_ms'))
generation = redis.call('HINCRBY', STATS_KEY, 'rewinds', '1')
return { 'settled', fmt(generation), fmt(now), fmt(moved), probed and fmt(now - probed) or 0 }
