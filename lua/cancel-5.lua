--[[
  cancel-5.lua: the client gives a reservation back (its create failed).

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     reservation id

  Returns {node_id, now_ms}
  Errors: NOT_FOUND reservation <id> not found,
          PRECONDITION reservation <id> already <released|cancelled|expired>
  Writes: res:<id> (state cancelled), node-res:<node>, node:<node> pending_*, expiry, stats
]]
-- @include index
local rid = ARGV[1]
local P = load_policy()
if not P then return fail('PRECONDITION', NO_POLICY) end
local r = redis.call('HMGET', res_key(rid), 'state', 'node_id')
if not r[1] then return fail('NOT_FOUND', 'reservation ' .. rid .. ' not found') end
if not LIVE[r[1]] then return fail('PRECONDITION', 'reservation ' .. rid .. ' already ' .. r[1]) end
local now = now_ms(P)
end_reservation(rid, 'cancelled', now)
sweep_expired(now)
reindex_touched(P, now)
return { r[2], fmt(now) }
