--[[
  probe-5.lua: can this replica write to the cell?  The health check.  As a
  function it is one that may write, so a Redis replica refuses it (READONLY)
  exactly as it would refuse a Schedule, and a full Redis (OOM) or one short
  of min-replicas-to-write (NOREPLICAS) refuses it the same way.  It writes
  (also as a script sent by EVALSHA, which must write to be refused).  With
  min_replicas_acked the replica's WAIT follows it like any write.

  It also tells the replica where the cell's history stands, so a dataset
  that went back in time is noticed (scheduler/domain/history.py): the cell's
  sequence (the sum of the stats counters that only grow, this probe's own
  count included), the generation of the last rewind settle, and Redis TIME
  without the drill offset (a clock that jumps).

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  ARGV[1]     write: ignored ("1" / "0": the form once told whether to write)

  Returns {now_ms, has_policy "1" when the cell's policy exists else "0",
           raw_ms (TIME), sequence, generation (of the last rewind settle)}
  Writes: stats probes (+1), probed_ms (the cell's last recorded time)
]]
-- @include base
-- (the stats counters that only ever grow: their sum orders one history)
local GROWING = { probes = true, reserved_total = true, assigned_total = true,
  released_total = true, cancelled_total = true, expired_total = true, refused_total = true,
  forgotten_total = true, rewound_total = true, incarnations = true, art_seq = true }
local clock = load_clock()
local raw = server_ms()
local s_now = fmt(now_ms(clock or { time_offset_ms = 0 }))
redis.call('HINCRBY', STATS_KEY, 'probes', '1')
redis.call('HSET', STATS_KEY, 'probed_ms', s_now)
local stats = redis.call('HGETALL', STATS_KEY)
local seq, generation = 0, '0'
for i = 1, #stats, 2 do
  if GROWING[stats[i]] then seq = seq + (tonumber(stats[i + 1]) or 0) end
  if stats[i] == 'rewinds' then generation = stats[i + 1] end
end
return { s_now, clock and '1' or '0', fmt(raw), fmt(seq), generation }
