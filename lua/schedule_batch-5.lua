--[[
  schedule_batch-5.lua: several Schedules in one call, decided in order, each
  seeing the ones before it: the same decisions, rotations and reservations
  as the same requests sent one at a time (schedule-5.lua), for one call's
  fixed cost.  A replica sends what queued while its previous call was in
  flight.

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  KEYS[6]     rr: the cell's round-robin counter
  ARGV[1]     count n, the number of requests
  ARGV[2..]   requests: n times schedule-5.lua's ARGV[1..7] (kind, dry run (must be
              "0"), strategy, cpu, memory bytes, reservation id, random), or
              n times its ARGV[1..8] (and locality, "" = none)

  Returns {answer...}, one a request; answer = {outcome, reply...}: outcome
          "ok" and schedule-5.lua's decision fields, or "err" and
          "<CODE> <message>" (that request's own error)
  Errors: NO_POLICY (no policy: nothing decided), BADARG n or a dry run
  Writes: as schedule-5.lua, once per placed request (the rotation counter and
          stats reserved_total once, at the end)
]]
-- @include schedule
-- @phase-begin (phase marks: `python -m bench phases` times them; comments otherwise)
local n = tonumber(ARGV[1])
local w = n and n >= 1 and (#ARGV - 1) / n -- (7 arguments a request, or 8 with locality)
if w ~= 7 and w ~= 8 then
  return fail(ERR.BADARG, 'n must count the requests that follow, 7 or 8 arguments each')
end
if not load_policy(ctx) then return fail(ERR.NO_POLICY, NO_POLICY) end
ctx[CTX.batch] = true
-- Replay: when none of the batch's reservation ids exists yet (the common
-- case), one EXISTS spares a read of each; ctx.new_ids then holds the ones
-- this call reserves, which a repeated id must still find (schedule_one).
local rkeys = {}
for i = 1, n do
  local a = 1 + w * (i - 1)
  if ARGV[a + 1] == 'create' and ARGV[a + 6] ~= '' then rkeys[#rkeys + 1] = res_key(ARGV[a + 6]) end
end
if #rkeys > 0 and #rkeys <= UNPACK_CHUNK and redis.call('EXISTS', unpack(rkeys)) == 0 then
  ctx[CTX.new_ids] = {}
end
local out = {}
-- @phase batch_setup
for i = 1, n do
  local a = 1 + w * (i - 1)
  if ARGV[a + 2] == '1' then return fail(ERR.BADARG, 'a batch holds no dry run') end
  -- @phase batch_loop
  local r = schedule_one(ctx, KEYS[6], ARGV[a + 1], false, ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
    ARGV[a + 6], tonumber(ARGV[a + 7]), w == 8 and ARGV[a + 8] or nil)
  if r.err then
    out[i] = { 'err', r.err }
  else
    out[i] = ok_answer(r)
  end
end
finish_batch(ctx, KEYS[6])
-- @phase batch_finish
return out
