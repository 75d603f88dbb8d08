--[[
  stats-5.lua: counters of the cell, or its policy.  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     "" = counters, "policy" = the stored policy hash

  Returns counters: {live reservations, field, value, ...} (stats hash)
          policy:   {field, value, ...} (empty when not initialised)
]]
-- @include common
if ARGV[1] == 'policy' then return redis.call('HGETALL', POLICY_KEY) end
local out = { redis.call('ZCARD', EXPIRY_KEY) }
for _, v in ipairs(redis.call('HGETALL', STATS_KEY)) do out[#out + 1] = v end
return out
