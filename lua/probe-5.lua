--[[
  probe-5.lua: can this replica write to the cell?  The health check.  As a
  function it is one that may write, so a Redis replica refuses it (READONLY)
  exactly as it would refuse a Schedule, and a full Redis (OOM) or one short
  of min-replicas-to-write (NOREPLICAS) refuses it the same way, without it
  writing anything.  Sent as a script (EVALSHA, no functions here), it must
  write to be refused: ARGV[1] "1" asks for that.  With min_replicas_acked
  the replica's WAIT follows it like any write.

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  ARGV[1]     write: "1" = write stats probed_ms (scripts form); "0" = write nothing

  Returns {now_ms, has_policy "1" when the cell's policy exists else "0"}
  Writes: stats probed_ms (ARGV[1] "1" only)
]]
-- @include base
local clock = load_clock()
local s_now = fmt(now_ms(clock or { time_offset_ms = 0 }))
if ARGV[1] == '1' then redis.call('HSET', STATS_KEY, 'probed_ms', s_now) end
return { s_now, clock and '1' or '0' }
