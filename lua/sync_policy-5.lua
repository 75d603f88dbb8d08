--[[
  sync_policy-5.lua: store the cell's shared policy, or check it agrees.

  Every replica must decide under the same policy.  An empty cell takes the
  given one; a cell with a different one refuses (the caller shows both)
  unless told to overwrite.  The drill clock fields (time_offset_ms,
  frozen_now_ms) are not part of the comparison and survive an overwrite;
  `packed` (the same policy in one string, for the scripts) is rebuilt.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     mode: "1" overwrite, "0" check, "r" restore: check, and when the cell
              had no policy (Redis lost its data), also settle it (settle_ms =
              now, in the same step: see settle-5.lua)
  ARGV[2..]   fields: field, value pairs of the wanted policy

  Returns {outcome, stored...}: outcome "created", "same", "overwritten" or
          "conflict"; stored the field, value, ... of the stored policy
  Writes: policy (unless "same" or "conflict"; settle_ms when restoring), and
          starts a rebuild of the placement index (index_rebuild, idx-rebuild:
          bounded steps, the first one in this call; includes/index_moves.lua);
          an index built by another version (policy field index_format) is
          dropped and built anew, even when the policy is the same, in
          bounded steps as a rebuild is (includes/index_moves.lua UPGRADE)
]]
-- @include index
-- (NOT_POLICY, the fields kept beside the policy: includes/constants)
local overwrite = ARGV[1] == POLICY_MODE.overwrite
local restoring = ARGV[1] == POLICY_MODE.restore
local stored = redis.call('HGETALL', POLICY_KEY)
local have = {}
for i = 1, #stored, 2 do
  if not NOT_POLICY[stored[i]] then have[stored[i]] = stored[i + 1] end
end
local want = {}
local same = true
local nwant = 0
for i = 2, #ARGV, 2 do
  want[ARGV[i]] = ARGV[i + 1]
  nwant = nwant + 1
  if have[ARGV[i]] ~= ARGV[i + 1] then same = false end
end
for k, _ in pairs(have) do
  if want[k] == nil then same = false end
end
local outcome
if #stored == 0 then
  outcome = 'created'
elseif same then
  outcome = 'same'
elseif overwrite then
  outcome = 'overwritten'
else
  outcome = 'conflict'
end
local format = redis.call('HGET', POLICY_KEY, 'index_format')
if outcome == 'created' or outcome == 'overwritten' then
  -- (the drill clock, kept through an overwrite; named locals, not a layout:
  -- these are policy fields, which no table of a Lua file may copy)
  local offset, frozen, settle = unpack(redis.call('HMGET', POLICY_KEY, 'time_offset_ms',
    'frozen_now_ms', 'settle_ms'))
  redis.call('DEL', POLICY_KEY)
  if nwant > 0 then redis.call('HSET', POLICY_KEY, unpack(ARGV, 2)) end
  if offset then redis.call('HSET', POLICY_KEY, 'time_offset_ms', offset) end
  if frozen then redis.call('HSET', POLICY_KEY, 'frozen_now_ms', frozen) end
  if settle then redis.call('HSET', POLICY_KEY, 'settle_ms', settle) end
  if restoring and outcome == 'created' then
    redis.call('HSET', POLICY_KEY, 'settle_ms', fmt(server_ms()))
  end
  if format then redis.call('HSET', POLICY_KEY, 'index_format', format) end
  -- (a rebuild under way went with the old policy: REBUILD.start below starts over)
  repack_policy()
end
if outcome ~= 'conflict' then
  local P = load_policy(ctx)
  if format ~= INDEX_FORMAT then
    -- an index built by another version (or none yet): dropped and built
    -- anew in bounded steps, the first ones here (a cell of at most
    -- REBUILD.STEP nodes is whole again when this call returns; a new cell
    -- has nothing to drop or build)
    if UPGRADE.empty() then
      redis.call('HSET', POLICY_KEY, 'index_format', INDEX_FORMAT)
      redis.call('HDEL', POLICY_KEY, 'index_rebuild')
      repack_policy()
    else
      UPGRADE.start(P)
      if UPGRADE.step(ctx, REBUILD.STEP) then
        REBUILD.step(ctx, load_policy(ctx), now_ms(P), REBUILD.STEP)
      end
    end
  elseif outcome ~= 'same' then
    -- indexability depends on policy (observed ceilings, report TTL): the
    -- index is rebuilt in bounded steps, the first one here (a cell of at
    -- most REBUILD.STEP nodes is whole again when this call returns)
    REBUILD.start()
    REBUILD.step(ctx, load_policy(ctx), now_ms(P), REBUILD.STEP)
  end
end
local out = { outcome }
for i = 1, #stored do out[#out + 1] = stored[i] end
return out
