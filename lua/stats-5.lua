--[[
  stats-5.lua: counters of the cell, or its policy.  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     part: "" = counters, "policy" = the stored policy hash

  Returns counters: {pending (live reservations), counters...} (counters: field,
          value, ... of the stats hash)
          policy:   {fields...} (field, value, ... of the policy; empty when not
          initialised)
]]
-- @include common
if ARGV[1] == 'policy' then return redis.call('HGETALL', POLICY_KEY) end
local out = { redis.call('ZCARD', EXPIRY_KEY) }
for _, v in ipairs(redis.call('HGETALL', STATS_KEY)) do out[#out + 1] = v end
return out
