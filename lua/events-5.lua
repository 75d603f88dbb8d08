--[[
  events-5.lua: a node reports sandbox lifecycle events (ReportSandboxEvent).

  CREATE / FORK: the sandbox exists on the node.  The reservation its
    binding names (its assignment's) is marked acked, and the node's next
    heartbeat releases it (at once if a roster already listed the sandbox).
    A sandbox no reservation is charged to (a FORK child, one made outside
    the scheduler, or one whose assignment has not come yet) takes none: it
    is the node's own, its next roster or counter rise counts it.  The
    binding is written.
  DELETE: the binding goes (a tombstone stays for binding_ttl).  A
    reservation still attached is released (the sandbox is gone).  In
    counter mode the node's counter baseline moves on by one with it
    (deletes_uncounted, added to the baseline by the node's next heartbeat,
    a new instance's too), so the create_successes rise that covers that
    creation releases nothing more (includes/heartbeat.lua).  Not one a
    rise that released a pending reservation left live (seq at most the
    node's unclaimed_seq): that rise may have counted this sandbox, and the
    reservation hold the room of the released one's creation; the next rise
    ends it.
  PAUSE / RESUME: refresh the binding only.
  A sandbox another node's roster lists is that node's (the roster that
  listed it last decides): an event of this node for it writes no binding
  (a DELETE: includes/bindings.lua bury_binding keeps the other's).
  Events of the service instance the node's stored one replaced (a late
  event of its previous instance: replaced_service_instance_id, written by
  the heartbeat that saw the restart) change nothing and are answered OK;
  those of an instance not heard from yet (the next one, before its first
  heartbeat) are applied.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id
  ARGV[2]     service_instance_id the events come from ("" = not said: the
              node's current instance)
  ARGV[3..]   events, two values each: sandbox_id, type (CREATE|DELETE|PAUSE|RESUME|FORK)

  Returns {acked (reservations), released (reservations), now_ms}
  Errors: UNKNOWN_NODE, BADARG type ..., NO_POLICY (no policy)
  Writes: res:<id> (state acked), node:<node> acked_count (deletes_uncounted),
          bind:*, node-sbx:<node>
]]
-- @include bindings
local node_id = ARGV[1]

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
if not redis.call('ZSCORE', NODES_KEY, node_id) then
  return fail(ERR.UNKNOWN_NODE, 'node is not in scheduler node list')
end
local sid = ARGV[2]
for i = 3, #ARGV, 2 do
  if not EVENT_TYPES[ARGV[i + 1]] then
    return fail(ERR.BADARG, 'event_type ' .. tostring(ARGV[i + 1]) .. ' is not known')
  end
end
local now = now_ms(P)
-- What it reads of the node: its endpoint, its mode and baseline, its
-- instances (a layout)
-- @layout EVENTS_NODE
local EVENTS_NODE = { 'endpoint', 'roster_mode', 'counted_successes', 'service_instance_id',
  'replaced_service_instance_id', 'unclaimed_seq' }
local node = redis.call('HMGET', node_key(node_id), unpack(EVENTS_NODE))
-- (the replaced instance's late events: what the current one established
-- stays; an instance not heard from yet may be the next one, its events count)
if sid ~= '' and sid ~= node[EVENTS_NODE.service_instance_id]
    and sid == node[EVENTS_NODE.replaced_service_instance_id] then
  return { 0, 0, fmt(now) }
end
sweep_expired(ctx, now)
local endpoint = node[EVENTS_NODE.endpoint] or ''
local roster_mode = node[EVENTS_NODE.roster_mode] == '1'
-- (a node that sent no heartbeat yet has no baseline: its first gives it)
local counts = not roster_mode and node[EVENTS_NODE.counted_successes]
local acked, released = 0, 0
for i = 3, #ARGV, 2 do
  local sb, kind = ARGV[i], ARGV[i + 1]
  if kind == 'DELETE' then
    -- (a charge another node's placement made follows its sandbox here:
    -- end_charge moves that node's baseline if it counts by its counter)
    local rid, _, r = bound_reservation(sb, node_id)
    local own = rid and r[RES_READ.node_id] == node_id
    -- (a reservation a rise that guessed left live, unclaimed_seq: the
    -- sandbox may be the creation that rise counted, its reservation the
    -- room of one still on its way; kept, the next rise ends it)
    if counts and own and node[EVENTS_NODE.unclaimed_seq]
        and (tonumber(redis.call('ZSCORE', node_res_key(node_id), rid)) or 0)
          <= (tonumber(node[EVENTS_NODE.unclaimed_seq]) or 0) then
      rid = nil
    end
    if rid and end_charge(ctx, rid, node_id, now, r) then
      released = released + 1
      -- (kept apart from the baseline until the node's next heartbeat: that
      -- heartbeat may be a new instance's, whose baseline starts from 0 and
      -- whose counter may already include this creation)
      if counts and own then redis.call('HINCRBY', node_key(node_id), 'deletes_uncounted', '1') end
    end
    bury_binding(ctx, sb, node_id, now, P)
  elseif not listed_elsewhere(sb, node_id, now) then
    local creation = kind == 'CREATE' or kind == 'FORK'
    -- (a sandbox no reservation is charged to, a FORK child or one made
    -- outside the scheduler, is the node's own: it takes no reservation,
    -- which belongs to a creation still on its way)
    local rid, _, r = bound_reservation(sb, node_id)
    local listed = listed_on(sb, node_id)
    if rid and creation and listed then
      -- a roster already listed it: the node's numbers include it now
      if end_charge(ctx, rid, node_id, now, r) then released = released + 1 end
    elseif rid and creation and r[RES_READ.state] ~= 'acked' and r[RES_READ.node_id] == node_id then
      -- (acked counts on its own node: another node's charge that followed
      -- the sandbox here waits for this node's roster or DELETE)
      redis.call('HSET', res_key(rid), 'state', 'acked', 'acked_ms', fmt(now))
      redis.call('HINCRBY', node_key(node_id), 'acked_count', '1')
      acked = acked + 1
    end
    if write_binding(ctx, sb, node_id, endpoint, listed and '1' or '0', rid, now, P) then
      released = released + 1
    end
  end
end
reindex_touched(ctx, P, now)
return { acked, released, fmt(now) }
