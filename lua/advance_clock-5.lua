--[[
  advance_clock-5.lua: move the cell's clock forward (drills and tests only).

  Every script reads "now" as Redis TIME + policy field time_offset_ms, so
  TTL expiry can be exercised without sleeping.  The offset only grows.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     milliseconds to add

  Returns the new offset in ms
  Errors: PRECONDITION (no policy)
  Writes: policy time_offset_ms
]]
-- @include common
if redis.call('EXISTS', POLICY_KEY) == 0 then return fail('PRECONDITION', NO_POLICY) end
return redis.call('HINCRBY', POLICY_KEY, 'time_offset_ms', ARGV[1])
