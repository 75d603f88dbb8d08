--[[
  assign-5.lua: record that a sandbox was created on a node (RecordAssignment).

  Attaches the sandbox to a pending reservation of that node (the one named,
  or else the node's newest unclaimed one, so a placement whose create never
  came keeps aging until unassigned_reservation_ttl ends it) and writes the
  binding.  A reservation the node's counter already released for a
  creation not yet assigned (counted_unclaimed) is taken first, already ended: the counter
  counted this sandbox, and another placement's pending reservation must not
  be charged to it (its DELETE would end that one early).  If a
  roster of that node already listed the sandbox, the node's numbers include
  it, so the reservation is released at once.  If another node's roster
  lists it, that node holds it: the binding stays, and the reservation is
  released at once (in counter mode the node's counter baseline moves on
  by one with it).  Taking an unlisted binding from another node ends the
  reservation charged to it there (includes/bindings.lua write_binding).  A
  sandbox is charged at most one reservation: one already charged (by an
  earlier assignment or event) stays; a named reservation that another
  sandbox of the node claimed first is replaced by the node's newest
  unclaimed one.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     sandbox_id
  ARGV[2]     node_id
  ARGV[3]     endpoint (must equal the node's stored endpoint)
  ARGV[4]     reservation_id, "" = the node's newest unclaimed one

  Returns {reservation_id attached or "", released now 1/0, now_ms}
  Errors: UNKNOWN_NODE node is not in scheduler node list, NO_POLICY (no policy)
  Writes: bind:<sandbox> (claim: a named reservation the cell has no record
          of), node-sbx:<node>, res:<id> (state assigned, sandbox_id,
          absent_cs, absent_rt), node:<node> absent_watch, counted_unclaimed
          (deletes_uncounted), stats; another node's res:<id> and
          deletes_uncounted (a take)
]]
-- @include bindings
-- The node's oldest reservation that no sandbox has claimed yet, or nil.
local function oldest_unclaimed(node_id)
  for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), '0', '-1')) do
    if redis.call('HGET', res_key(rid), 'state') == 'pending' then return rid end
  end
  return nil
end
-- The node's newest reservation that no sandbox has claimed yet, or nil: the
-- one an assignment naming none is charged.  A placement whose create never
-- came then keeps the age of its own Schedule, and unassigned_reservation_ttl
-- ends it however often the node creates (taking the oldest moved that room
-- onto ever younger reservations; docs/design.md, the RecordAssignment row,
-- says why no real creation loses its slot by it).
local function newest_unclaimed(node_id)
  local ids = redis.call('ZRANGE', node_res_key(node_id), '0', '-1')
  for i = #ids, 1, -1 do
    if redis.call('HGET', res_key(ids[i]), 'state') == 'pending' then return ids[i] end
  end
  return nil
end
-- A node's counted_unclaimed (a field of its record): the ids, oldest first,
-- of pending reservations its create_successes rise released before any
-- assignment claimed them (includes/heartbeat.lua adds them, the newest 16
-- kept: one whose create was never sent ages out).  Each stands for a
-- creation the node counted whose assignment is still to come; that
-- assignment takes one instead of another placement's pending reservation.
-- Takes `wanted` ('' = the oldest) off the list and charges it to sandbox
-- `sb` (it is ended: nothing more to release); the id, or nil when the list
-- does not hold it.
local function counted_unclaimed(node_id, wanted, sb)
  local nkey = node_key(node_id)
  local list = redis.call('HGET', nkey, 'counted_unclaimed') or ''
  local rest, pick = {}, nil
  for rid in string.gmatch(list, '%S+') do
    if not pick and (wanted == '' or rid == wanted) then pick = rid else rest[#rest + 1] = rid end
  end
  if not pick then return nil end
  if #rest == 0 then redis.call('HDEL', nkey, 'counted_unclaimed')
  else redis.call('HSET', nkey, 'counted_unclaimed', table.concat(rest, ' ')) end
  if redis.call('HGET', res_key(pick), 'state') then
    redis.call('HSET', res_key(pick), 'sandbox_id', sb)
  end
  return pick
end
-- What it reads of the named reservation (a layout)
-- @layout ASSIGN_WANTED
local ASSIGN_WANTED = { 'state', 'node_id' }
-- The pending reservation an assignment names (`wanted`, when it is the
-- node's and still pending), or with none named the node's oldest unclaimed
-- one; nil when neither.
local function named_or_oldest(node_id, wanted)
  if wanted == '' then return oldest_unclaimed(node_id) end
  local r = redis.call('HMGET', res_key(wanted), unpack(ASSIGN_WANTED))
  if r[ASSIGN_WANTED.node_id] == node_id and r[ASSIGN_WANTED.state] == 'pending' then
    return wanted
  end
  return nil
end
local sb = ARGV[1]
local node_id = ARGV[2]
local endpoint = ARGV[3]
local wanted = ARGV[4]

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
if not redis.call('ZSCORE', NODES_KEY, node_id)
    or redis.call('HGET', node_key(node_id), 'endpoint') ~= endpoint then
  return fail(ERR.UNKNOWN_NODE, 'node is not in scheduler node list')
end
local now = now_ms(P)
sweep_expired(ctx, now)

local already_listed = listed_on(sb, node_id)
if buried_on(sb, node_id, now) then
  -- The node already reported this sandbox deleted.  If a reservation was
  -- charged to it before, that was its one: nothing more.  Otherwise, in
  -- roster mode no roster will list it again: its reservation ends now; in
  -- counter mode the creation already moved create_successes: the counter
  -- releases one.
  local rid = nil
  local charged_before = redis.call('HGET', bind_key(sb), 'reservation_id') or ''
  local roster = redis.call('HGET', node_key(node_id), 'roster_mode') == '1'
  if charged_before == '' and not roster then
    -- (counter mode: a rise that came before this assignment released one
    -- unclaimed for it; the tombstone takes that one, already ended)
    rid = counted_unclaimed(node_id, wanted, sb)
      or (wanted ~= '' and counted_unclaimed(node_id, '', sb)) or nil
    if rid then redis.call('HSET', bind_key(sb), 'reservation_id', rid) end
  elseif charged_before == '' then
    rid = named_or_oldest(node_id, wanted)
  end
  local released = 0
  if rid and end_reservation(ctx, rid, 'released', now) then
    released = 1
    -- (the tombstone remembers it: a repeated assignment charges nothing more)
    redis.call('HSET', bind_key(sb), 'reservation_id', rid)
  end
  reindex_touched(ctx, P, now)
  return { rid or '', released, fmt(now) }
end

-- Another node's roster lists the sandbox: it is that node's (the roster
-- that listed it last decides; an assignment takes no sandbox from a lister),
-- and that node's numbers include it.  The reservation it was placed under
-- here ends now, once: none if one was charged to the sandbox before, on any
-- node (the binding keeps its id); a counter-mode node's baseline moves on
-- with it (deletes_uncounted, as a DELETE's), so a rise of this node's
-- counter for the same creation releases nothing more.  When this node's
-- counter already rose for it (counted_unclaimed holds a reservation that
-- rise released), that one is charged instead: nothing more ends.
-- So does a tombstone of another node whose last roster listed the sandbox
-- (includes/bindings.lua bury_binding): its DELETE may be a late one of an
-- instance replaced before the last (events-5.lua applies it) while the
-- sandbox runs and that node's numbers include it; if it did end, it was
-- counted there, and its end ends the count.
-- (includes/bindings.lua listed_elsewhere; `held`: the binding as it read it)
local lister, held = listed_elsewhere(sb, node_id, now)
if lister then
  local rid, counted = nil, nil
  if (held[HOLDER_READ.reservation_id] or '') == '' then
    -- (a rise of this node's counter that came first released one unclaimed
    -- for it: the assignment takes that one, already ended, as a tombstone's
    -- does above, never another placement's pending one, whose creation may
    -- still be on its way)
    counted = counted_unclaimed(node_id, wanted, sb)
      or (wanted ~= '' and counted_unclaimed(node_id, '', sb)) or nil
    rid = counted or named_or_oldest(node_id, wanted)
  end
  local released = 0
  if counted then
    redis.call('HSET', bind_key(sb), 'reservation_id', rid)
  elseif rid then
    redis.call('HSET', res_key(rid), 'sandbox_id', sb, 'assigned_ms', fmt(now))
    redis.call('HINCRBY', STATS_KEY, 'assigned_total', '1')
    -- (the lister's numbers include it: end_charge moves this node's counter
    -- baseline, the reservation being this node's)
    if end_charge(ctx, rid, lister, now) then
      released = 1
      redis.call('HSET', bind_key(sb), 'reservation_id', rid)
    end
  end
  reindex_touched(ctx, P, now)
  return { rid or '', released, fmt(now) }
end

-- A sandbox is charged one reservation, once: a repeated assignment keeps the
-- one it has (live or already released).
-- What it reads of a reservation an assignment names (a layout)
-- @layout ASSIGN_NAMED
local ASSIGN_NAMED = { 'state', 'node_id', 'sandbox_id' }
-- What it reads of the node for the two-heartbeat rule (a layout)
-- @layout ASSIGN_NODE
local ASSIGN_NODE = { 'create_successes', 'pending_count', 'roster_mode', 'absent_watch',
  'reported_order_ms' }
local rid, _, r_held = bound_reservation(sb, node_id)
local attached = nil
-- (a named reservation the cell has no record of: the binding keeps its id
-- as `claim`, so that the placement, written back after a rewind by the
-- replica that answered it (replay-5.lua), attaches to this sandbox)
local claim = nil
-- What it reads of the reservation it attaches (a layout)
-- @layout ASSIGN_ATTACHED
local ASSIGN_ATTACHED = { 'created_ms', 'replayed' }
-- (the attached one was written back after a rewind, replay-5.lua)
local replayed = false
-- (charged before: on this node, or a live binding of another node that
-- carries its charge here: it follows the sandbox, write_binding)
local charged = (held[HOLDER_READ.reservation_id] or '') ~= ''
  and (held[HOLDER_READ.node_id] == node_id or held[HOLDER_READ.deleted] ~= '1')
if not rid and not charged then
  -- A creation the node's counter already counted before its assignment came
  -- released a pending reservation no sandbox had claimed (counted_unclaimed,
  -- above): the assignment takes that one, ended, never
  -- another placement's pending one, which a DELETE would then end early.
  if wanted ~= '' then
    local r = redis.call('HMGET', res_key(wanted), unpack(ASSIGN_NAMED))
    if r[ASSIGN_NAMED.node_id] == node_id and r[ASSIGN_NAMED.state] == 'pending' then
      attached = wanted
    elseif not r[ASSIGN_NAMED.state] and not r[ASSIGN_NAMED.node_id] then
      claim = wanted
    elseif r[ASSIGN_NAMED.node_id] == node_id and r[ASSIGN_NAMED.state] == 'released'
        and (r[ASSIGN_NAMED.sandbox_id] or '') == '' then
      rid = counted_unclaimed(node_id, wanted, sb)
    elseif r[ASSIGN_NAMED.node_id] == node_id and r[ASSIGN_NAMED.sandbox_id]
        and r[ASSIGN_NAMED.sandbox_id] ~= sb
        and (r[ASSIGN_NAMED.state] == 'assigned' or r[ASSIGN_NAMED.state] == 'acked'
          or r[ASSIGN_NAMED.state] == 'released') then
      -- the named reservation was claimed by another sandbox of this node (its
      -- CREATE event came first): this sandbox takes the next unclaimed one
      rid = counted_unclaimed(node_id, '', sb)
      attached = not rid and newest_unclaimed(node_id) or nil
    end
  else
    rid = counted_unclaimed(node_id, '', sb)
    attached = not rid and newest_unclaimed(node_id) or nil
  end
  if attached then
    -- (assigned: it lives placement_reservation_ttl from its Schedule, no
    -- longer unassigned_reservation_ttl)
    local a = redis.call('HMGET', res_key(attached), unpack(ASSIGN_ATTACHED))
    local created = tonumber(a[ASSIGN_ATTACHED.created_ms]) or now
    replayed = a[ASSIGN_ATTACHED.replayed] == '1'
    local s_expires = fmt(created + P.reservation_ttl_ms)
    redis.call('HSET', res_key(attached), 'state', 'assigned', 'sandbox_id', sb,
      'assigned_ms', fmt(now), 'expires_ms', s_expires)
    redis.call('ZADD', EXPIRY_KEY, s_expires, attached)
    redis.call('HINCRBY', STATS_KEY, 'assigned_total', '1')
    rid = attached
  end
end
local released = 0
if rid and already_listed
    and end_charge(ctx, rid, node_id, now, rid ~= attached and r_held or nil) then
  released = 1
end
if attached and not already_listed then
  -- The two-heartbeat rule (includes/heartbeat.lua) counts the node's
  -- rosters that were taken after this sandbox was created: those whose
  -- create_successes reached absent_cs, the stored count plus every live
  -- reservation of the node (this one included): no creation of the
  -- scheduler's since the stored heartbeat can be past that, so a roster
  -- that reached it was taken after this sandbox was created, however late
  -- it arrives; and, of the stamped heartbeats received from now on, each
  -- with a stamp other than the last counted (absent_rt: at first the
  -- stored one, reported_order_ms), the second and later.
  -- A reservation written back after a rewind (replay-5.lua) was placed
  -- before the settle, and its sandbox assigned then too: counted from the
  -- stored count alone (the second heartbeat received from now on was
  -- taken after the first was answered, after that assignment, when the
  -- sandbox, if it still ran, was in the node's store).  The live
  -- reservations would hold it for as many more creations as were written
  -- back, which a node that stopped creating never makes.
  local nd = redis.call('HMGET', node_key(node_id), unpack(ASSIGN_NODE))
  local more = replayed and 0 or (tonumber(nd[ASSIGN_NODE.pending_count]) or 1)
  redis.call('HSET', res_key(attached), 'absent_cs',
    fmt((tonumber(nd[ASSIGN_NODE.create_successes]) or 0) + more),
    'absent_rt', nd[ASSIGN_NODE.reported_order_ms] or '0')
  if nd[ASSIGN_NODE.roster_mode] == '1' and nd[ASSIGN_NODE.absent_watch] ~= '1' then
    redis.call('HSET', node_key(node_id), 'absent_watch', '1')
  end
end
write_binding(ctx, sb, node_id, endpoint, already_listed and '1' or '0', rid, now, P)
if claim then redis.call('HSET', bind_key(sb), 'claim', claim) end
reindex_touched(ctx, P, now)
return { rid or '', released, fmt(now) }
