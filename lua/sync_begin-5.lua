--[[
  sync_begin-5.lua: begin a pass that makes the cell's node list equal a
  given one (includes/sync_pass.lua): the static list of a replica's
  configuration, or the one Kubernetes discovery computed.  The list then
  goes in chunks (sync_stage-5.lua) and a walk over the nodes removes every
  node not on it (sync_walk-5.lua), each step bounded: no call of a pass
  reads more than a chunk of the list or a step of the fleet (issue #31).

  A live pass of the same kind, digest and listed (the same list: another
  replica syncing it) is joined: its token is answered, and the joiner
  stages the whole list again into its set (the same ids: harmless) and
  walks its shared cursor.  Any other begin supersedes the live pass: its
  staging set goes and every later step of it is refused (SUPERSEDED)
  before it writes anything, so the nodes end equal to the newest pass's
  list, never a mix of two.

  Discovery's positions are checked here: a pass is begun only when none of
  its positions is below the one the last begun pass stored (stats fields
  discovery_rv_1..3): its view then holds every change such a view held, so
  a node it leaves out is gone and not yet unknown to it.  A pass behind in
  any stream begins nothing ("stale"); otherwise its positions are stored.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     token: the new pass's (1..19 digits, random)
  ARGV[2]     kind: "static" (the static list) or "discovered"
  ARGV[3]     digest: the list's (1..128 bytes; a pass of the same is joined)
  ARGV[4]     listed: "1" a non-empty list, "0" an empty one (static only:
              the static nodes leave, heartbeat registration rules)
  ARGV[5..7]  positions: discovered only: the writer's watch positions, each
              a resourceVersion (a decimal etcd revision) up to which it has
              applied one stream: the EndpointSlices, the
              ignore_pod_selector pods, the no_schedule_pod_selector pods

  An empty static list when the static set is whole and empty and no pass
  is under way has nothing to remove: "done" at once (a replica starting in
  heartbeat-registration mode makes this one call).

  Returns {outcome "begun"|"joined"|"stale"|"done", token (the pass's; ""
           when stale or done), positions...} (positions: the stored 1, 2,
           3, "" when none)
  Errors: NO_POLICY (no policy); BADARG (ARGV; a position that is not a
          whole number)
  Writes: sync-pass, sync-stage:<token> of a superseded pass (deleted),
          stats discovery_rv_1..3
]]
-- @include sync_pass
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local token, kind, digest, listed = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local bad = check_token(token)
if bad then return bad end
if kind ~= 'static' and kind ~= 'discovered' then
  return fail(ERR.BADARG, 'ARGV[2] (kind): want static or discovered')
end
if not digest or #digest < 1 or #digest > 128 then
  return fail(ERR.BADARG, 'ARGV[3] (digest): want 1..128 bytes')
end
if listed ~= '1' and listed ~= '0' then return fail(ERR.BADARG, 'ARGV[4] (listed): want 1 or 0') end
local stored = { '', '', '' }
-- The positions of discovery stored in stats, in ARGV's order (a layout)
-- @layout DISCOVERY_RV
local DISCOVERY_RV = { 'discovery_rv_1', 'discovery_rv_2', 'discovery_rv_3' }
if kind == 'discovered' then
  if #ARGV ~= 7 then return fail(ERR.BADARG, 'positions: a discovered pass needs 3') end
  if listed ~= '1' then return fail(ERR.BADARG, 'ARGV[4] (listed): a discovered pass is 1') end
  -- (whole numbers as canonical digit strings: compared exactly, past 2^53 too)
  local function below(a, b)
    if #a ~= #b then return #a < #b end
    return a < b
  end
  local rv = redis.call('HMGET', STATS_KEY, unpack(DISCOVERY_RV))
  -- (the stored position of each stream, in ARGV's order)
  local was = { rv[DISCOVERY_RV.discovery_rv_1], rv[DISCOVERY_RV.discovery_rv_2],
    rv[DISCOVERY_RV.discovery_rv_3] }
  local stale = false
  for i = 1, 3 do
    local p = ARGV[4 + i]
    if #p < 1 or #p > 20 or string.find(p, '%D') or (#p > 1 and string.sub(p, 1, 1) == '0') then
      return fail(ERR.BADARG, 'position ' .. i .. ' must be a whole number (a resourceVersion)')
    end
    if was[i] and below(p, was[i]) then stale = true end
    stored[i] = was[i] or ''
  end
  if stale then return { 'stale', '', stored[1], stored[2], stored[3] } end
  redis.call('HSET', STATS_KEY, 'discovery_rv_1', ARGV[5], 'discovery_rv_2', ARGV[6],
    'discovery_rv_3', ARGV[7])
  stored = { ARGV[5], ARGV[6], ARGV[7] }
elseif #ARGV ~= 4 then
  return fail(ERR.BADARG, 'positions: a static pass takes none')
end
local pass = redis.call('HMGET', pass_key(), unpack(PASS))
local live = pass[PASS.token]
if kind == 'static' and listed == '0' and not live
    and redis.call('HGET', STATS_KEY, 'static_set') == '1'
    and redis.call('SCARD', static_key()) == 0 then
  return { 'done', '', '', '', '' } -- (no static node to remove: nothing to walk)
end
if live and pass[PASS.kind] == kind
    and pass[PASS.digest] == digest and pass[PASS.listed] == listed then
  redis.call('PEXPIRE', pass_key(), PASS_TTL_MS)
  return { 'joined', pass[PASS.token], stored[1], stored[2], stored[3] }
end
-- (the older pass's staging set goes: its steps are refused from now on)
if pass[PASS.token] then redis.call('DEL', stage_key(pass[PASS.token])) end
redis.call('DEL', pass_key())
redis.call('HSET', pass_key(), 'token', token, 'kind', kind, 'digest', digest, 'listed', listed,
  'cursor', '', 'changed', '0', 'removed', '0')
redis.call('PEXPIRE', pass_key(), PASS_TTL_MS)
return { 'begun', token, stored[1], stored[2], stored[3] }
