--[[
  includes/heartbeat.lua: one node's heartbeat (heartbeat-5.lua's ARGV as
  `A`): checks, snapshot, roster, releases, index entry.  heartbeat-5.lua
  makes one; heartbeat_batch-5.lua several in one call, in order, each as if
  it had come alone within the same millisecond.  The callers then run the
  forget sweep and reindex the other nodes this call touched.
]]
-- @exports heartbeat_one
-- @include bindings
-- @include snapshot
-- @include cpu_config

-- Texts that passed the whole-number check (kept_table, includes/base.lua).
local WHOLE_TEXTS = kept_table(4096)

-- What it reads besides the record (layouts, folded to positions by the
-- loader): a node-sbx member's binding (the binding sample); a reservation
-- roster mode watches for absence, and its sandbox's binding.
-- @layout SAMPLED_BIND
local SAMPLED_BIND = { 'node_id', 'listed' }
-- @layout ABSENT_RES
local ABSENT_RES = { 'state', 'absent_cs', 'absent_beats', 'sandbox_id', 'absent_rt',
  'assigned_ms' }
-- @layout ABSENT_BIND
local ABSENT_BIND = { 'node_id', 'listed', 'deleted' }
-- One member of a ZRANGE ... WITHSCORES reply (a layout)
-- @layout SCORED
local SCORED = { 'member', 'score' }

-- Is a sandbox absent from `node_id`'s rosters for the two-heartbeat rule
-- (gone_assigned), its binding `b` read as ABSENT_BIND?  Unbound, or this
-- node's unlisted binding, or a tombstone; a live binding of another node,
-- listed or not, carries the charge there, to end by that node's roster or
-- DELETE.  (Not includes/bindings.lua listed_elsewhere, which asks whether
-- another node's roster listed it, and counts its listed tombstone.)
local function absent_here(b, node_id)
  return not b[ABSENT_BIND.node_id] or b[ABSENT_BIND.deleted] == '1'
    or (b[ABSENT_BIND.node_id] == node_id and b[ABSENT_BIND.listed] ~= '1')
end

-- The phases of one heartbeat.  Each is a function of what it reads, named
-- in its arguments, and answers what it decides; heartbeat_one below holds
-- the heartbeat's facts as locals and passes them on.  (No table of state:
-- an argument costs a register move, a table field a lookup, and a
-- heartbeat would read one about a hundred times.)

-- Phase "read and order check": the arguments, the policy, the record read
-- once, the registration, the fields sent, then the order: a delta whose
-- base is not the record answers RESYNC, a heartbeat older than the newest
-- its instance sent changes nothing and is answered OK.  Nothing written.
-- nil and the reply to give, or the policy, the record as read (HB_READ),
-- the fields sent (name -> value), whether one moves the node in the index,
-- whether the node was registered, where the roster starts in A, the instant
-- heard (and as a text), reported_at_unix_ms (false: not stamped),
-- whether a new service instance sends it, and the record's key.
local function read_checked(ctx, A, node_id, sid, base, roster_full, roster_delta)
  -- @phase-begin (phase marks: `python -m bench phases` times them; comments otherwise)
  local nfields = number_of(A[7])
  local P = ctx[CTX.P] or load_policy(ctx)
  if not P then return nil, fail(ERR.NO_POLICY, NO_POLICY) end
  ctx[CTX.P] = P
  if node_id == '' then return nil, fail(ERR.BADARG, 'node_id is required') end
  if roster_delta and base == '' then
    return nil, fail(ERR.BADARG, 'a roster delta needs the record it is based on')
  end
  if sid == '' then return nil, fail(ERR.BADARG, 'service_instance_id is required') end
  local first_sb = 8 + 2 * nfields
  if roster_full and #A - first_sb + 1 > P.max_roster_ids then
    return nil, fail(ERR.BADARG, 'sandbox_ids has ' .. (#A - first_sb + 1)
      .. ' entries, more than max_roster_ids (' .. P.max_roster_ids .. ')')
  end
  local nkey = node_key(node_id)
  -- (prev[i]: PREV's fields; then the node as decisions read it)
  local prev = redis.call('HMGET', nkey, unpack(HB_READ))
  -- A record that names its node is registered: node_id is written only with
  -- the registration (a heartbeat's, the static list's, a static node's bare
  -- record that stays listed); a node without one, the cell is asked.
  -- (a field the record lacks comes back false)
  local registered = prev[PREV.node_id] or redis.call('ZSCORE', NODES_KEY, node_id)
  if not registered and P.static_nodes then
    return nil, fail(ERR.UNKNOWN_NODE, 'node is not in scheduler node list')
  end
  local values = {}
  local moves = false -- (does a field sent move the node in the index?)
  for i = 0, nfields - 1 do
    local name = A[8 + 2 * i]
    if not SNAPSHOT_FIELDS[name] then
      return nil, fail(ERR.BADARG, name .. ' is not a heartbeat field')
    end
    local value = A[9 + 2 * i]
    local mover = INDEX_MOVERS[name]
    if mover and (mover == true or P.limits[mover]) then moves = true end
    -- the placement index spells these as whole numbers (the client checks
    -- their ranges; this keeps any other writer from slipping a fraction in)
    -- (1 to 16 digits: a length and one scan for a non-digit)
    -- (a text that passed is kept: the same counts and sizes come back)
    if WHOLE_FIELDS[name] and not WHOLE_TEXTS.t[value] then
      if #value < 1 or #value > 16 or string.find(value, '%D') then
        return nil, fail(ERR.BADARG, 'snapshot.' .. name .. ' must be a whole number below 10^16')
      end
      keep(WHOLE_TEXTS, value, true)
    end
    values[name] = value
  end
  -- @phase checks

  local stored_sid = prev[PREV.service_instance_id]
  if base ~= '' and (base ~= (prev[PREV.incarnation] or '') .. ':' .. (prev[PREV.generation] or '')
      or stored_sid ~= sid
      or (not (roster_full or roster_delta) and prev[PREV.roster_digest] ~= A[5])
      or (roster_delta and (prev[PREV.roster_digest] or '') ~= A[first_sb])) then
    return nil, { 'RESYNC' }
  end
  local now = ctx[CTX.heard] or heard_ms(P)
  ctx[CTX.heard] = now
  local s_now = instant_text(ctx, now) -- (text: Redis prints a Lua number argument with %.17g)
  local restarted = stored_sid and stored_sid ~= '' and stored_sid ~= sid
  -- Order: the node stamps reported_at_unix_ms from one clock (its own; 0 =
  -- not stamped, Redis time is written instead and orders nothing).  A
  -- heartbeat of the stored service instance older than the newest it sent
  -- (through another replica, or late out of a queue) changes nothing and is
  -- answered OK; its answer names no incarnation, so the replica's next
  -- delta meets RESYNC and goes in full.
  local order = values.reported_at_unix_ms
  if order == '0' or order == '' then order = false end
  if order and stored_sid == sid
      and (tonumber(order) or 0) < (tonumber(prev[PREV.reported_order_ms]) or 0) then
    return nil, { tonumber(prev[PREV.generation]) or 0, 0, 0,
      prev[PREV.roster_mode] == '1' and 1 or 0, s_now, '' }
  end
  return P, prev, values, moves, registered, first_sb, now, s_now, order, restarted, nkey
end

-- Phase "node in hand": the record as it will be, held to the end
-- (includes/common.lua ctx.held): releases change its pending numbers there,
-- its index entry is worked out from it, and it is written once.  An indexed
-- node's bucket id spells its counts and capacities (the record's own pending
-- numbers are read); any other node is read whole.  The node, or nil: a
-- delta met a corrupt record (RESYNC).
local function node_in_hand(P, prev, values, node_id, now, base)
  local o = #PREV
  local n
  if (prev[PREV.idx] or '') ~= '' and P.index_format == INDEX_FORMAT then
    n = node_of_bucket(prev[PREV.idx]) -- (nil: the record's idx is no bucket id)
    if n then n.id, n.idx, n.endpoint = node_id, prev[PREV.idx], prev[PREV.endpoint] or '' end
  end
  if n == nil then n = read_node(node_id) end
  n.lingering = prev[o + HB_NODE_AT.lingering] == '1'
  n.reported = prev[o + HB_NODE_AT.status] or ''
  n.cpu_percent = tonumber(prev[o + HB_NODE_AT.cpu_percent]) or 0
  n.mem_used = tonumber(prev[o + HB_NODE_AT.memory_used_bytes]) or 0
  -- (pending numbers that are not ones, corrupt state, or missing while the
  -- node holds reservations, are counted again from them and written:
  -- never read as 0)
  local pc, pcpu, pmem = number_of(prev[o + HB_NODE_AT.pending_count]),
    number_of(prev[o + HB_NODE_AT.pending_cpu]),
    number_of(prev[o + HB_NODE_AT.pending_memory_bytes])
  local acked = number_of(prev[PREV.acked_count] or '0')
  n.pending = prev[o + HB_NODE_AT.pending_count] ~= false
  if n.pending and count_ok(pc) and count_ok(pcpu) and count_ok(pmem) and count_ok(acked) then
    n.pend_count, n.pend_cpu, n.pend_mem, n.acked = pc, pcpu, pmem, acked
  elseif n.pending or n.recount or n.pend_count > 0 then
    n.pend_count, n.pend_cpu, n.pend_mem, n.acked = recount_pending(node_id)
    n.pending, n.dirty, n.acked_was = true, true, -1
  else
    n.pend_count, n.pend_cpu, n.pend_mem, n.acked = 0, 0, 0, 0
  end
  n.last_seen = now
  -- A record found corrupt (read_node: a number that is not one) is
  -- rewritten by a full heartbeat, which sends every number; a delta
  -- cannot vouch for what it does not send: RESYNC, so the full one comes.
  if n.corrupt then
    if base ~= '' then return nil end
    n.corrupt = false
  end
  for name, value in pairs(values) do
    local key = NODE_NUMBERS[name]
    -- (the whole numbers come back; observed use moves all the time)
    if key then n[key] = (WHOLE_FIELDS[name] and number_of(value) or tonumber(value)) or 0 end
  end
  if values.status then n.reported = values.status end
  n.admission = values.admission or prev[o + HB_NODE_AT.admission] or ''
  -- @phase record_read
  return n
end

-- Phase "roster walk", before the first write: bindings follow the node's
-- own list; only what changed since its previous roster costs work
-- (includes/bindings.lua).  What joined, what left, the roster's size (nil:
-- none sent) and whether the node is in roster mode; or nil and the error.
local function roster_planned(A, P, prev, node_id, roster_full, roster_delta, first_sb)
  local added, gone = {}, {}
  local roster_size
  if roster_full then
    local listed, before = {}, {}
    roster_size = 0
    for _, sb in ipairs(redis.call('SMEMBERS', node_roster_key(node_id))) do before[sb] = true end
    for i = first_sb, #A do
      local sb = A[i]
      if sb ~= '' and not listed[sb] then
        listed[sb] = true
        roster_size = roster_size + 1
        if not before[sb] then added[#added + 1] = sb end
      end
    end
    for sb, _ in pairs(before) do
      if not listed[sb] then gone[#gone + 1] = sb end
    end
  elseif roster_delta then
    -- the base's roster is the one held (checked above): the client's diff is this one
    local joined = number_of(A[first_sb + 1])
    for i = first_sb + 2, first_sb + 1 + joined do added[#added + 1] = A[i] end
    for i = first_sb + 2 + joined, #A do gone[#gone + 1] = A[i] end
    roster_size = (number_of(prev[PREV.roster_size]) or 0) + #added - #gone
    if roster_size > P.max_roster_ids then
      return nil, fail(ERR.BADARG, 'sandbox_ids has ' .. roster_size .. ' entries, more than '
        .. 'max_roster_ids (' .. P.max_roster_ids .. ')')
    end
  end
  -- (a node in roster mode stays in it, across its agent's restarts too:
  -- an empty roster is an empty node, and the reporter a restart brings
  -- back sends its store as the one before did)
  local roster_mode = prev[PREV.roster_mode] == '1' or (roster_size or 0) > 0
  if not (roster_full or roster_delta) then roster_mode = prev[PREV.roster_mode] == '1' end
  -- @phase roster_plan
  return added, gone, roster_size, roster_mode
end

-- Phase "record": the snapshot, stamped with Redis time, planned into the
-- record's one write at the end (hset: field, value, ...; the pending
-- numbers and index entry are added later); the registration, a restart
-- and the p2p set written now.  hset, the new generation, the incarnation
-- and the node's endpoint.
local function record_planned(ctx, A, prev, values, node_id, nkey, sid, registered, restarted,
    order, s_now, roster_mode, roster_size)
  local generation = (tonumber(prev[PREV.generation]) or 0) + 1
  local incarnation = prev[PREV.incarnation]
  if not incarnation then
    incarnation = tostring(redis.call('HINCRBY', STATS_KEY, 'incarnations', '1'))
  end
  -- (what the record holds already is not written again: its ids, its
  -- incarnation and roster mode while they stay)
  local hset = { 'last_seen_ms', s_now, 'generation', fmt(generation) }
  if not prev[PREV.node_id] then
    hset[#hset + 1] = 'node_id'
    hset[#hset + 1] = node_id
  end
  if prev[PREV.service_instance_id] ~= sid then
    hset[#hset + 1] = 'service_instance_id'
    hset[#hset + 1] = sid
  end
  if prev[PREV.incarnation] ~= incarnation then
    hset[#hset + 1] = 'incarnation'
    hset[#hset + 1] = incarnation
  end
  if roster_size then -- (a roster was sent)
    local mode = roster_mode and '1' or '0'
    local k = #hset
    hset[k + 1], hset[k + 2] = 'roster_size', num_text(roster_size)
    hset[k + 3], hset[k + 4] = 'roster_digest', A[5]
    if prev[PREV.roster_mode] ~= mode then hset[k + 5], hset[k + 6] = 'roster_mode', mode end
  end
  if values.reported_at_unix_ms and (prev[PREV.reported_order_ms] or '0') ~= (order or '0') then
    hset[#hset + 1] = 'reported_order_ms'
    hset[#hset + 1] = order or '0'
  end
  for name, value in pairs(values) do
    if name == 'reported_at_unix_ms' and (value == '' or value == '0') then value = s_now end
    if not (name == 'cpu_config_json' and value == '') then
      hset[#hset + 1] = name
      hset[#hset + 1] = value
    end
  end
  local endpoint = A[3]
  local node_endpoint = prev[PREV.endpoint] or ''
  if endpoint ~= '' and prev[PREV.static] ~= '1' and endpoint ~= node_endpoint then
    hset[#hset + 1] = 'endpoint'
    hset[#hset + 1] = endpoint
    node_endpoint = endpoint
    touch(ctx, node_id)
  end
  if not registered then
    redis.call('ZADD', NODES_KEY, '0', node_id)
    hset[#hset + 1] = 'first_seen_ms'
    hset[#hset + 1] = s_now
  end
  if restarted then
    hset[#hset + 1] = 'restarted_at_ms'
    hset[#hset + 1] = s_now
    -- (the instance replaced: its late events change nothing, events-5.lua)
    hset[#hset + 1] = 'replaced_service_instance_id'
    hset[#hset + 1] = prev[PREV.service_instance_id]
    redis.call('HINCRBY', nkey, 'restarts', '1')
  end
  -- (back before it was all forgotten)
  if prev[PREV.forgetting] then redis.call('HDEL', nkey, 'forgetting') end
  local cluster = values.cluster_id or prev[PREV.cluster_id] or ''
  local p2p = values.p2p_address or prev[PREV.p2p_address] or ''
  if (prev[PREV.cluster_id] or '') ~= cluster or (prev[PREV.p2p_address] or '') ~= p2p then
    if prev[PREV.cluster_id] then
      redis.call('SREM', BASE .. 'p2p:' .. prev[PREV.cluster_id], node_id)
      -- (moved: out of its cluster's CPU config round, includes/cpu_config.lua)
      if prev[PREV.cluster_id] ~= cluster then cfg_moved(node_id, cluster) end
    end
    if p2p ~= '' then redis.call('SADD', BASE .. 'p2p:' .. cluster, node_id) end
  end
  -- @phase record_plan
  return hset, generation, incarnation, node_endpoint
end

-- Phase "bindings": the sandboxes that joined the roster bound to this node
-- (ending what they carried), those that left unbound, the roster sets
-- moved, and every other heartbeat two node-sbx members sampled.
-- Reservations released.
local function roster_bound(ctx, P, node_id, node_endpoint, added, gone, generation, now)
  local released = 0
  -- (the node's sets change in one call each, whatever the number of sandboxes)
  local unsbx = {} -- (listed now: out of node-sbx)
  for _, sb in ipairs(added) do
    local rid, b, r = bound_reservation(sb, node_id)
    if rid and end_charge(ctx, rid, node_id, now, r) then released = released + 1 end
    -- (another node's binding: this roster listed it last, it is this
    -- node's; the reservation charged to it there ends: write_binding)
    if write_binding(ctx, sb, node_id, node_endpoint, '1', rid, now, P, b, unsbx) then
      released = released + 1
    end
  end
  -- @phase joined_bindings_releases
  -- (a listed binding is in the roster set only: leaving it is all there is)
  for _, sb in ipairs(gone) do
    if listed_on(sb, node_id) then redis.call('DEL', bind_key(sb)) end
  end
  -- @phase left_bindings
  local roster_key = node_roster_key(node_id)
  set_all(false, node_sbx_key(node_id), unsbx)
  set_all(false, roster_key, gone)
  set_all(true, roster_key, added)
  -- @phase roster_sets
  -- node-sbx's members that are no longer this node's unlisted bindings
  -- (assignments whose binding expired; listed ones a version that kept
  -- every binding there left): bounded work, every other heartbeat (two
  -- samples each).
  if generation % 2 == 0 then
    for _, sb in ipairs(redis.call('SRANDMEMBER', node_sbx_key(node_id), '2')) do
      local b = redis.call('HMGET', bind_key(sb), unpack(SAMPLED_BIND))
      if b[SAMPLED_BIND.node_id] ~= node_id or b[SAMPLED_BIND.listed] == '1' then
        redis.call('SREM', node_sbx_key(node_id), sb)
      end
    end
  end
  -- @phase binding_sample
  return released
end

-- Phase "mode and baselines": how many reservations the counters release.
-- create_successes: the baseline (counted_successes) is the highest the
-- service instance reported (a count going backwards releases nothing and
-- the next rise counts only creations past it), moved on by the counter-mode
-- DELETEs that released their creation since (events-5.lua); a record
-- written before it was kept starts from create_successes.  The first
-- heartbeat we ever see gives the baseline and releases nothing; a new
-- instance's is 0.  Fails owed: create_fails has a baseline of its own
-- (counted_fails), kept the same way, which the gateway's cancels of
-- unassigned reservations since the last heartbeat (cancels_uncounted,
-- cancel-5.lua) move, so a failure is ended once, by whichever comes first;
-- its rise is owed (fails_owed) until the node's next heartbeat.  The rise
-- of create_successes to release (k), the failures owed since the last
-- heartbeat (f), and create_successes (the two-heartbeat rule reads it).
local function baselines(prev, values, hset, restarted, roster_mode, joined)
  local successes = tonumber(values.create_successes or prev[PREV.create_successes]) or 0
  local baseline = tonumber(prev[PREV.counted_successes] or prev[PREV.create_successes])
  if restarted then baseline = 0 end
  -- The counter-mode DELETEs since the last heartbeat move the baseline now,
  -- a new instance's too: a creation deleted before its instance's first
  -- heartbeat is in that instance's count (a DELETE of the old instance's
  -- creation then holds one reservation longer: an over-count).
  local uncounted = prev[PREV.deletes_uncounted]
  if baseline and uncounted then baseline = baseline + (tonumber(uncounted) or 0) end
  if uncounted and uncounted ~= '0' then
    hset[#hset + 1] = 'deletes_uncounted'
    hset[#hset + 1] = '0'
  end
  -- (counts: their texts are kept, num_text, as the same ones come back)
  local counted_now = baseline and baseline > successes and baseline or successes
  if prev[PREV.counted_successes] ~= num_text(counted_now) then
    hset[#hset + 1] = 'counted_successes'
    hset[#hset + 1] = num_text(counted_now)
  end
  local fails = tonumber(values.create_fails or prev[PREV.create_fails]) or 0
  local fail_base = tonumber(prev[PREV.counted_fails] or prev[PREV.create_fails])
  if restarted then fail_base = 0 end
  local cancels = prev[PREV.cancels_uncounted]
  if fail_base and cancels then fail_base = fail_base + (tonumber(cancels) or 0) end
  if cancels and cancels ~= '0' then
    hset[#hset + 1] = 'cancels_uncounted'
    hset[#hset + 1] = '0'
  end
  local fails_now = fail_base and fail_base > fails and fail_base or fails
  if prev[PREV.counted_fails] ~= num_text(fails_now) then
    hset[#hset + 1] = 'counted_fails'
    hset[#hset + 1] = num_text(fails_now)
  end
  -- The heartbeat that switches the instance to roster mode (its first
  -- roster) applies the counter too: what it rose by since the last counter
  -- heartbeat, less every sandbox its roster lists (all joined it: a listed
  -- creation is the roster's to count, and its assignment, if still to come,
  -- releases its own reservation; a rise that covered it releases no other),
  -- releases as in counter mode; the roster lists only what runs now.
  local switching = roster_mode and prev[PREV.roster_mode] ~= '1' and not restarted
  local k = (not roster_mode or switching) and baseline and successes - baseline - joined or 0
  -- create_fails rising by f releases the f oldest unassigned (pending)
  -- reservations: a create that failed was never assigned (the gateway
  -- assigns when the create answered).  One heartbeat later: the rise is
  -- owed (fails_owed) until the node's next heartbeat, and a client's cancel
  -- meanwhile pays one (cancel-5.lua): a gateway that cancels its failed
  -- create ends that one, and the rise ends no other.
  local rise = fail_base and fails - fail_base or 0
  local f = tonumber(prev[PREV.fails_owed]) or 0
  if rise < 0 then rise = 0 end
  if num_text(rise) ~= (prev[PREV.fails_owed] or '0') then
    hset[#hset + 1] = 'fails_owed'
    hset[#hset + 1] = num_text(rise)
  end
  return k, f, successes
end

-- Phase "counter release" (k > 0 or f > 0): f owed failures end the oldest
-- pending reservations; a rise of k ends acknowledged ones (CREATE/FORK
-- events) first, then assigned ones, then the oldest.  A heartbeat whose
-- snapshot predates a creation has not counted it yet, so an acknowledgement
-- alone never releases (in roster mode the roster does).  Reservations
-- released.
local function counter_released(ctx, node_id, hset, k, f, now)
  local released = 0
  -- (acknowledged first, then assigned ones (the gateway heard their
  -- create succeed), then the oldest: a creation the rise covered is
  -- likelier released than one still on its way, whose reservation a
  -- DELETE could not give back)
  local ids = redis.call('ZRANGE', node_res_key(node_id), '0', '-1')
  local states = {}
  for i, rid in ipairs(ids) do states[i] = redis.call('HGET', res_key(rid), 'state') end
  for i, rid in ipairs(ids) do
    if f <= 0 then break end
    if states[i] == 'pending' and end_reservation(ctx, rid, 'released', now) then
      released, f, states[i] = released + 1, f - 1, 'released'
    end
  end
  local unclaimed = ''
  for pass = 1, 3 do
    local want = pass == 1 and 'acked' or pass == 2 and 'assigned'
    for i, rid in ipairs(ids) do
      if k <= 0 then break end
      local was = states[i]
      if (not want or was == want) and end_reservation(ctx, rid, 'released', now) then
        released, k, states[i] = released + 1, k - 1, 'released'
        if was == 'pending' then unclaimed = unclaimed .. ' ' .. rid end
      end
    end
  end
  -- A pending reservation the rise released stands for a creation counted
  -- before its assignment came: the node keeps it (counted_unclaimed, the
  -- newest 16), and that assignment takes it, already ended, rather than
  -- another placement's pending one (assign-5.lua).
  if unclaimed ~= '' then
    local kept = {}
    local list = (redis.call('HGET', node_key(node_id), 'counted_unclaimed') or '') .. unclaimed
    for rid in string.gmatch(list, '%S+') do kept[#kept + 1] = rid end
    hset[#hset + 1] = 'counted_unclaimed'
    hset[#hset + 1] = table.concat(kept, ' ', math.max(1, #kept - 15))
    -- Which creation the rise counted is a guess: a reservation it left
    -- live may be the counted one's, standing for the released one's
    -- creation, still on its way.  The node keeps the newest seq it left
    -- (unclaimed_seq): a counter-mode DELETE of a sandbox charged one of
    -- those ends nothing (events-5.lua), the next rise does.
    -- (the highest score is the last by rank: ZRANGE, which the ACL grants)
    local top = redis.call('ZRANGE', node_res_key(node_id), '-1', '-1', 'WITHSCORES')
    if top[SCORED.score] then
      hset[#hset + 1] = 'unclaimed_seq'
      hset[#hset + 1] = top[SCORED.score]
    end
  end
  return released
end

-- Phase "gone assigned", the two-heartbeat rule (roster mode, while the
-- node watches: absent_watch): an assigned reservation whose sandbox this
-- node's rosters do not list, for two heartbeats that count, is released:
-- the sandbox ended, its DELETE lost (a sandbox is listed from the moment
-- its VM starts, before its create returns and it is assigned).  A
-- heartbeat counts when its create_successes reached the reservation's
-- absent_cs (assign-5.lua: taken after the sandbox was created, however
-- late it arrives), or when it is stamped (reported_at_unix_ms) with
-- another stamp than the last one counted for it (absent_rt, at first the
-- node's stored one at the assignment): an accepted heartbeat received
-- after the assignment.  Of two such, the second was taken after the first
-- was answered (the reporter sends one at a time), so after the assignment.
-- One heartbeat alone releases it when its stamp, placed by the stamp lead
-- (stamp_lead, includes/base.lua), says it was taken STAMP_MARGIN_MS or more after the
-- assignment: its roster was read after the sandbox was created, if the
-- smallest transit among the lead's heartbeats was within the margin.
-- The node's steady heartbeats go in full meanwhile
-- (includes/heartbeat_steady.lua).  Reservations released.
local function gone_assigned(ctx, node_id, hset, order, restarted, successes, now, lead)
  local taken = lead and (tonumber(order) or 0) - lead - STAMP_MARGIN_MS
  local released = 0
  local watching = false
  for _, rid in ipairs(redis.call('ZRANGE', node_res_key(node_id), '0', '-1')) do
    local r = redis.call('HMGET', res_key(rid), unpack(ABSENT_RES))
    if (r[ABSENT_RES.state] == 'assigned' or r[ABSENT_RES.state] == 'acked')
        and r[ABSENT_RES.absent_cs] then
      local b = redis.call('HMGET', bind_key(r[ABSENT_RES.sandbox_id] or ''), unpack(ABSENT_BIND))
      local fresh = order and order ~= (r[ABSENT_RES.absent_rt] or '0')
      local counts = fresh
        or not restarted and successes >= (tonumber(r[ABSENT_RES.absent_cs]) or 0)
      if counts and absent_here(b, node_id) then
        local beats = (tonumber(r[ABSENT_RES.absent_beats]) or 0) + 1
        local assigned = tonumber(r[ABSENT_RES.assigned_ms])
        if beats >= 2 or taken and assigned and taken >= assigned then
          if end_reservation(ctx, rid, 'released', now) then released = released + 1 end
        else
          redis.call('HSET', res_key(rid), 'absent_beats', fmt(beats),
            'absent_rt', fresh and order or r[ABSENT_RES.absent_rt] or '0')
          watching = true
        end
      else
        watching = true
      end
    end
  end
  if not watching then
    hset[#hset + 1] = 'absent_watch'
    hset[#hset + 1] = '0'
  end
  return released
end

-- Phase "write record and index": only a change of what places the node
-- moves its index entry (an indexed node's idx-seen score kept fresh); the
-- pending numbers releases changed, the seen score, and the record in one
-- HSET.  The node is no longer held after it.
local function record_written(ctx, P, n, prev, hset, node_id, nkey, moves, registered, restarted,
    now, s_now)
  local touched = ctx[CTX.touched]
  local moved = moves or not registered or restarted or (prev[PREV.idx] or '') == ''
    or touched[node_id]
  touched[node_id], ctx[CTX.held] = nil, false
  local indexed, entering = true, false -- (not moved: it stays in the index)
  if moved then
    local from = n.idx
    if index_entry(ctx, n, P, now) then
      entering = from == ''
      hset[#hset + 1] = 'idx'
      hset[#hset + 1] = n.idx
    end
    indexed = n.idx ~= ''
    if not indexed then redis.call('ZREM', IDX_SEEN, node_id) end
  end
  if indexed and (entering or seen_lags(prev[PREV.idx_seen_ms], now, P)) then
    redis.call('ZADD', IDX_SEEN, s_now, node_id)
    hset[#hset + 1] = 'idx_seen_ms'
    hset[#hset + 1] = s_now
  end
  -- @phase index_move
  if n.dirty then
    local k = #hset
    hset[k + 1], hset[k + 2] = 'pending_count', num_text(n.pend_count)
    hset[k + 3], hset[k + 4] = 'pending_cpu', num_text(n.pend_cpu)
    hset[k + 5], hset[k + 6] = 'pending_memory_bytes', num_text(n.pend_mem)
    if n.acked ~= (n.acked_was or number_of(prev[PREV.acked_count]) or 0) then
      hset[#hset + 1] = 'acked_count'
      hset[#hset + 1] = num_text(n.acked)
    end
  end
  if seen_lags(prev[PREV.seen_ms], now, P) then
    redis.call('ZADD', SEEN_KEY, s_now, node_id)
    hset[#hset + 1] = 'seen_ms'
    hset[#hset + 1] = s_now
  end
  redis.call('HSET', nkey, unpack(hset))
  -- @phase record_write
end

-- One heartbeat, phase by phase (each phase above says what it decides);
-- every check, and the roster walk, come before the first write.
local function heartbeat_one(ctx, A)
  local node_id, sid, base = A[1], A[2], A[4]
  -- (ARGV[6], the roster form, spelled as contracts.py's ROSTER_FULL and
  -- ROSTER_DELTA: read from the constants' ROSTER_FORM instead, the changed
  -- heartbeat cost 1.12 in instructions, not explained yet)
  local roster_full, roster_delta = A[6] == '1', A[6] == '2'
  local P, prev, values, moves, registered, first_sb, now, s_now, order, restarted, nkey =
    read_checked(ctx, A, node_id, sid, base, roster_full, roster_delta)
  if not P then return prev end -- (the error or answer read_checked gave)
  local n = node_in_hand(P, prev, values, node_id, now, base)
  if not n then return { 'RESYNC' } end
  local added, gone, roster_size, roster_mode = roster_planned(A, P, prev, node_id, roster_full,
    roster_delta, first_sb)
  if not added then return gone end -- (the error)
  ctx[CTX.held] = n -- (after the last check: an error leaves nothing held)
  -- Expiry: at one instant, a sweep that found less than a full batch due
  -- leaves nothing due for the batch's later heartbeats.
  if ctx[CTX.more_due] ~= false then ctx[CTX.more_due] = sweep_expired(ctx, now) >= SWEEP_BATCH end
  -- @phase expiry_sweep
  local hset, generation, incarnation, node_endpoint = record_planned(ctx, A, prev, values,
    node_id, nkey, sid, registered, restarted, order, s_now, roster_mode, roster_size)
  n.endpoint = node_endpoint
  local released = roster_bound(ctx, P, node_id, node_endpoint, added, gone, generation, now)
  local k, f, successes = baselines(prev, values, hset, restarted, roster_mode, #added)
  if k > 0 or f > 0 then released = released + counter_released(ctx, node_id, hset, k, f, now) end
  local lead = order and stamp_lead(not restarted and prev[PREV.stamp_lead] or nil,
    prev[PREV.stamp_lead_was], prev[PREV.stamp_lead_at], hset, order, now)
  if roster_mode and prev[PREV.absent_watch] == '1' then
    released = released + gone_assigned(ctx, node_id, hset, order, restarted, successes, now,
      lead)
  end
  record_written(ctx, P, n, prev, hset, node_id, nkey, moves, registered, restarted, now, s_now)
  return { generation, restarted and 1 or 0, released, roster_mode and 1 or 0, s_now,
    incarnation }
end
