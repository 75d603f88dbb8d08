--[[
  cancel-5.lua: the client gives a reservation back (its create failed, or
  its caller gave up before the placement was answered).

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  ARGV[1]     reservation_id
  ARGV[2]     mode: "0" cancel; "1" abandon (its caller gave up): also for an
              id that does not exist (yet): a
              cancelled tombstone then stops a Schedule with that id that is
              still on its way (a call sent before a pause of Redis) from
              placing; and an ended reservation is not an error

  Returns {node_id or "", now_ms}
  Errors: NOT_FOUND reservation <id> not found,
          PRECONDITION reservation <id> already <released|cancelled|expired>
  Writes: res:<id> (state cancelled), node-res:<node>, node:<node> pending_*
          (fails_owed or cancels_uncounted), expiry, stats
]]
-- @include index
local rid = ARGV[1]
local forget = ARGV[2] == CANCEL_MODE.abandon
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
-- What it reads of the reservation, and of its node (layouts: names in the
-- source, positions in the built text, folded by the loader)
-- @layout CANCEL_RES
local CANCEL_RES = { 'state', 'node_id' }
-- @layout CANCEL_OWED
local CANCEL_OWED = { 'node_id', 'fails_owed' }
local r = redis.call('HMGET', res_key(rid), unpack(CANCEL_RES))
local now = now_ms(P)
if not r[CANCEL_RES.state] and not r[CANCEL_RES.node_id] then
  if not forget then return fail(ERR.NOT_FOUND, 'reservation ' .. rid .. ' not found') end
  local s_now = fmt(now)
  redis.call('HSET', res_key(rid), 'reservation_id', rid, 'node_id', '', 'state', 'cancelled',
    'cpu', '0', 'memory_bytes', '0', 'created_ms', s_now, 'expires_ms', s_now, 'ended_ms', s_now)
  redis.call('PEXPIRE', res_key(rid), num_text(math.max(P.reservation_tombstone_ttl_ms,
    P.reservation_ttl_ms)))
  return { '', s_now }
end
if ENDED[r[CANCEL_RES.state]] then
  if forget then return { r[CANCEL_RES.node_id] or '', fmt(now) } end
  return fail(ERR.PRECONDITION, 'reservation ' .. rid .. ' already ' .. r[CANCEL_RES.state])
end
-- (a state that is none, corrupt state, is ended too: end_reservation)
end_reservation(ctx, rid, 'cancelled', now)
-- (the client cancels an unassigned reservation when its create failed: the
-- node's create_fails rise for that failure must release nothing more.  A
-- rise the node reported and that is still owed (fails_owed) is paid by it;
-- else it moves the baseline of the next rise (cancels_uncounted, added by
-- the node's next heartbeat; includes/heartbeat.lua).  Not a forget: its
-- create was never sent.)
-- (a reservation without its node, corrupt state, owes no node anything)
if r[CANCEL_RES.state] == 'pending' and not forget and r[CANCEL_RES.node_id] then
  local owed = redis.call('HMGET', node_key(r[CANCEL_RES.node_id]), unpack(CANCEL_OWED))
  if owed[CANCEL_OWED.node_id] then
    if (tonumber(owed[CANCEL_OWED.fails_owed]) or 0) > 0 then
      redis.call('HINCRBY', node_key(r[CANCEL_RES.node_id]), 'fails_owed', '-1')
    else
      redis.call('HINCRBY', node_key(r[CANCEL_RES.node_id]), 'cancels_uncounted', '1')
    end
  end
end
sweep_expired(ctx, now)
reindex_touched(ctx, P, now)
return { r[CANCEL_RES.node_id] or '', fmt(now) }
