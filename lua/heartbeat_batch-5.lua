--[[
  heartbeat_batch-5.lua: several heartbeats in one call, applied in order:
  the same records, releases, bindings and index entries as the same
  heartbeats sent one at a time (heartbeat-5.lua, heartbeat_steady-5.lua),
  for one call's fixed cost (the policy, the clock and the sweeps once).  A
  replica sends what queued while its previous call was in flight.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     count n, the number of heartbeats
  ARGV[2..]   heartbeats: n times "full", "steady", "cpucfg" or "ingest", m, then m
              arguments: heartbeat-5.lua's ARGV (a heartbeat in full or as a
              delta), heartbeat_steady-5.lua's, or cpu_config-6.lua's (a step of
              the CPU config exchange a heartbeat RPC makes; its cluster's key is
              derived from the base, as scheduler/store/keys.py names it).
              "ingest": cpu_config-6.lua's ingest of the heartbeat just before
              it (the same node), in the same trip: its ARGV[5] (restarted) is
              that heartbeat's answer's, and it runs only if that heartbeat
              applied (no error, no RESYNC)

  Returns {answer...}, one an item; answer = {outcome, reply...}: outcome
          "ok" and that script's reply (its RESYNC included), "err" and
          "<CODE> <message>" (that item's own error: it wrote nothing), or
          "skipped" (an ingest whose heartbeat did not apply: it ran not)
  Errors: NO_POLICY (no policy: nothing written), BADARG n or a kind or
          count that does not add up, or an ingest not right after a
          heartbeat of its node (nothing written)
  Writes: as the two scripts, once per heartbeat (the stats counters once, at
          the end); the expiry sweep runs once
          (again before a heartbeat only while a sweep finds a full batch
          due), and a steady heartbeat after it needs no RESYNC for due
          reservations; the forget sweep once at the end
]]
-- @include heartbeat
-- @include nodes
-- @include heartbeat_steady
-- @include cpu_config
-- Write the counts a batch kept (ctx.counts) to stats.
local function flush_counts(ctx)
  for outcome, k in pairs(ctx[CTX.counts] or {}) do
    redis.call('HINCRBY', STATS_KEY, outcome .. '_total', fmt(k))
  end
end
-- The kinds that are heartbeats (an ingest may follow them).
local HEARTBEAT_APPLIES = { full = true, steady = true }
local n = tonumber(ARGV[1])
if n == nil or n < 1 or n ~= math.floor(n) then
  return fail(ERR.BADARG, 'n must count the heartbeats that follow')
end
-- (every item's place, checked before anything is written)
local at, kinds, counts = {}, {}, {}
local a = 2
for i = 1, n do
  local kind, m = ARGV[a], number_of(ARGV[a + 1])
  if not HEARTBEAT_KINDS[kind] or m == nil or m < 0 or m ~= math.floor(m) then
    return fail(ERR.BADARG, 'heartbeat ' .. i .. ' must be ' .. HEARTBEAT_KIND_CHOICES
      .. ' and a count')
  end
  at[i], kinds[i], counts[i] = a + 1, kind, m
  if kind == 'ingest' and (i == 1 or not HEARTBEAT_APPLIES[kinds[i - 1]] or m ~= 5
      or ARGV[a + 2] ~= 'ingest' or ARGV[a + 3] ~= ARGV[at[i - 1] + 1]) then
    return fail(ERR.BADARG, 'heartbeat ' .. i .. ' (an ingest) must follow a heartbeat'
      .. ' of its node')
  end
  a = a + 2 + m
end
if a ~= #ARGV + 1 then return fail(ERR.BADARG, 'n must count the heartbeats that follow') end
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
ctx[CTX.P] = P
local now = heard_ms(P)
ctx[CTX.heard] = now
ctx[CTX.counts] = {}
ctx[CTX.more_due] = sweep_expired(ctx, now) >= SWEEP_BATCH
local out, applied, last = {}, false, nil
for i = 1, n do
  -- (a constructor sizes the table once, where appends grow it step by step;
  -- unpack() of a long roster would pass Lua's stack limit)
  local A
  if counts[i] <= UNPACK_CHUNK then
    A = { unpack(ARGV, at[i] + 1, at[i] + counts[i]) }
  else
    A = {}
    for j = 1, counts[i] do A[j] = ARGV[at[i] + j] end
  end
  local r
  if kinds[i] == 'full' then
    r = heartbeat_one(ctx, A)
  elseif kinds[i] == 'steady' then
    r = steady_one(ctx, A, P, now, ctx[CTX.more_due] == false)
  elseif kinds[i] == 'ingest' and (last.err or last[1] == 'RESYNC') then
    r = nil -- (its heartbeat wrote nothing: neither does its ingest)
  else
    if kinds[i] == 'ingest' then
      -- (a full heartbeat's answer says whether the node restarted; a steady
      -- one's node did not)
      A[5] = (kinds[i - 1] == 'full' and last[2] == 1) and '1' or '0'
    end
    r = cpu_config_one(ctx, A, BASE .. 'cpucfg:' .. (A[3] or ''))
  end
  if r == nil then
    out[i] = { 'skipped' }
  elseif r.err then
    out[i] = { 'err', r.err }
  else
    applied = applied or (HEARTBEAT_APPLIES[kinds[i]] == true and r[1] ~= 'RESYNC')
    out[i] = ok_answer(r)
  end
  last = r
end
if applied then forget_sweep(ctx, P, now) end
reindex_touched(ctx, P, now)
flush_counts(ctx)
return out
