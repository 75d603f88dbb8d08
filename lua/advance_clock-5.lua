--[[
  advance_clock-5.lua: move the cell's clock (drills and tests only).

  Every script reads "now" as Redis TIME + policy field time_offset_ms, or
  as policy field frozen_now_ms when that is set, so TTL expiry can be
  exercised without sleeping and, frozen, without any timing race.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     ms: milliseconds to add (>= 0)
  ARGV[2]     mode: "freeze" stop the clock at the current instant first,
              "thaw" let it run again (from wherever it was frozen),
              "" just advance

  Returns now_ms, the cell's "now" after the change
  Errors: NO_POLICY (no policy)
  Writes: policy time_offset_ms / frozen_now_ms
]]
-- @include common
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local add = tonumber(ARGV[1])
local mode = ARGV[2]
local now = now_ms(P)
local frozen = P.frozen_now_ms -- (P is shared and read-only: load_policy caches it)
if mode == 'freeze' then
  redis.call('HSET', POLICY_KEY, 'frozen_now_ms', fmt(now))
  frozen = now
elseif mode == 'thaw' and frozen then
  local real = server_ms()
  redis.call('HDEL', POLICY_KEY, 'frozen_now_ms')
  redis.call('HSET', POLICY_KEY, 'time_offset_ms', fmt(frozen - real))
  frozen = nil
end
if frozen then
  redis.call('HSET', POLICY_KEY, 'frozen_now_ms', fmt(frozen + add))
else
  redis.call('HINCRBY', POLICY_KEY, 'time_offset_ms', add)
end
repack_policy()
return fmt(now + add)
