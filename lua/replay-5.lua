--[[
  replay-5.lua: write back placements a replica answered OK that the cell's
  data lacks (Redis restarted from an old snapshot, a failover to a replica
  that was behind): the replica remembers them (PlacementMemo,
  scheduler/domain/history.py) and sends them after a rewind or failover
  settle, before it writes its assignments again.

  Each is decided from what the cell holds now, never charged twice:
  - res:<id> exists (live, or a tombstone: it ended): left as it is;
  - made before the settle (policy settle_ms, or now) less ARGV[1]: in its
    node's roster by now (which the settle waits for) or ended: written
    ended, released, charging nothing;
  - its sandbox (when the replica knows it) listed by the node's last roster
    or reported deleted there: the node's numbers include it, or it ended:
    written released (charged to that sandbox once);
  - past its unassigned expiry (made + the shorter of
    placement_reservation_ttl and unassigned_reservation_ttl): written
    expired;
  - its node not in the cell: not written;
  - else written pending, charged to its node as schedule-5.lua charges it,
    with the expiry of its original Schedule; when its sandbox is bound to
    the node charged nothing (the replica knows the sandbox, or an
    assignment that came while the cell had no record of the reservation
    left a `claim` on the binding, assign-5.lua), attached to it at once as
    an assignment attaches one (placement_reservation_ttl from that
    Schedule); else the assignment written again after it attaches it.
    Then the usual rules end it (a roster that lists the sandbox, the
    two-heartbeat rule, its TTL).
  A tombstone written lives the tombstone TTL from its Schedule (never longer
  than the original's would have); one whose TTL is already over is not
  written.

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  ARGV[1]     grace_ms: a placement made this long before the settle or less
              may still be in flight (not listed yet)
  ARGV[2]     count n, the number of placements
  ARGV[3..]   placements: n times (reservation id, node id, cpu, memory bytes,
              created_ms (the cell time of its Schedule), pressure, sandbox id
              or "")

  Returns {live, ended, kept, unknown}: written pending, written ended,
          left as they are (the cell has them), not written (node unknown
          or tombstone TTL over)
  Errors: NO_POLICY (no policy), BADARG a count or number that is not one
  Writes: res:<id>, node-res:<node>, node:<node> pending_count, pending_cpu,
          pending_memory_bytes (acked_count, absent_watch), expiry,
          bind:<sandbox> reservation_id (claim), stats replayed_total,
          replayed_ended_total, assigned_total, the index
]]
-- @include bindings
local W = 7
local grace = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
if not count_ok(grace) then return fail(ERR.BADARG, 'grace_ms must be a whole number >= 0') end
if not count_ok(n) or #ARGV ~= 2 + W * n then
  return fail(ERR.BADARG, 'n must count the placements that follow, 7 arguments each')
end
-- every check before the first write
for i = 1, n do
  local a = 2 + W * (i - 1)
  if ARGV[a + 1] == '' or ARGV[a + 2] == '' then
    return fail(ERR.BADARG, 'placements[' .. (i - 1) .. '] needs a reservation id and a node id')
  end
  for k, name in ipairs({ 'cpu', 'memory_bytes', 'created_ms' }) do
    if not count_ok(tonumber(ARGV[a + 2 + k])) then
      return fail(ERR.BADARG,
        'placements[' .. (i - 1) .. '].' .. name .. ' must be a whole number >= 0')
    end
  end
  if tonumber(ARGV[a + 6]) == nil then
    return fail(ERR.BADARG, 'placements[' .. (i - 1) .. '].pressure must be a number')
  end
end
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
sweep_expired(ctx, now)
local cutoff = (P.settle_ms or now) - grace
local ttl = P.reservation_ttl_ms
if P.unassigned_reservation_ttl_ms < ttl then ttl = P.unassigned_reservation_ttl_ms end
local seq = redis.call('HGET', STATS_KEY, 'reserved_total') or '0'
-- What it reads of a node it charges (a layout)
-- @layout REPLAY_NODE
local REPLAY_NODE = { 'pending_count', 'pending_cpu', 'pending_memory_bytes', 'create_successes',
  'roster_mode', 'absent_watch', 'reported_order_ms' }
-- What it reads of the sandbox's binding (a layout)
-- @layout REPLAY_BIND
local REPLAY_BIND = { 'node_id', 'reservation_id', 'claim' }
-- The sandbox whose binding on `node_id` claims reservation `rid` and is
-- charged none (assign-5.lua wrote the claim: its assignment came when the
-- cell had no record of the reservation), or nil.  A node's bindings are
-- read once a call.
local claims = {}
local function claimed(node_id, rid)
  local c = claims[node_id]
  if not c then
    c = {}
    for _, set in ipairs({ node_sbx_key(node_id), node_roster_key(node_id) }) do
      for _, b in ipairs(redis.call('SMEMBERS', set)) do
        local f = redis.call('HMGET', bind_key(b), unpack(REPLAY_BIND))
        if f[REPLAY_BIND.claim] and f[REPLAY_BIND.node_id] == node_id
            and (f[REPLAY_BIND.reservation_id] or '') == '' then
          c[f[REPLAY_BIND.claim]] = b
        end
      end
    end
    claims[node_id] = c
  end
  return c[rid]
end
local live, ended, kept, unknown = 0, 0, 0, 0
for i = 1, n do
  local a = 2 + W * (i - 1)
  local rid, node_id = ARGV[a + 1], ARGV[a + 2]
  local cpu, mem = fmt(tonumber(ARGV[a + 3])), fmt(tonumber(ARGV[a + 4]))
  local created, pressure, sb = tonumber(ARGV[a + 5]), ARGV[a + 6], ARGV[a + 7]
  local rkey = res_key(rid)
  if redis.call('EXISTS', rkey) == 1 then
    kept = kept + 1
  else
    if sb == '' and created >= cutoff then sb = claimed(node_id, rid) or '' end
    -- (the sandbox's binding on this node, charged no reservation: this one takes it)
    local bound = false
    if sb ~= '' then
      local f = redis.call('HMGET', bind_key(sb), unpack(REPLAY_BIND))
      bound = f[REPLAY_BIND.node_id] == node_id and (f[REPLAY_BIND.reservation_id] or '') == ''
    end
    local outcome = nil
    if created < cutoff then
      outcome = 'released'
    elseif sb ~= '' and (listed_on(sb, node_id) or buried_on(sb, node_id, now)) then
      outcome = 'released'
    elseif created + ttl <= now then
      outcome = 'expired'
    end
    if outcome then
      local left = created + P.reservation_tombstone_ttl_ms - now
      if left > 0 then
        local fields = { 'reservation_id', rid, 'node_id', node_id, 'cpu', cpu, 'memory_bytes', mem,
          'state', outcome, 'seq', seq, 'created_ms', fmt(created),
          'expires_ms', fmt(created + ttl),
          'pressure', pressure, 'ended_ms', fmt(now), 'replayed', '1' }
        if sb ~= '' then fields[#fields + 1], fields[#fields + 2] = 'sandbox_id', sb end
        redis.call('HSET', rkey, unpack(fields))
        redis.call('PEXPIRE', rkey, fmt(left))
        if bound then
          -- (charged once: a later assignment of that sandbox charges nothing more)
          redis.call('HSET', bind_key(sb), 'reservation_id', rid)
          redis.call('HDEL', bind_key(sb), 'claim')
        end
        ended = ended + 1
      else
        unknown = unknown + 1
      end
    elseif not redis.call('ZSCORE', NODES_KEY, node_id) then
      unknown = unknown + 1
    else
      local expires = fmt(created + ttl)
      redis.call('HSET', rkey, 'reservation_id', rid, 'node_id', node_id, 'cpu', cpu,
        'memory_bytes', mem, 'state', 'pending', 'seq', seq, 'created_ms', fmt(created),
        'expires_ms', expires, 'pressure', pressure, 'replayed', '1')
      redis.call('ZADD', node_res_key(node_id), seq, rid)
      local nkey = node_key(node_id)
      local r = redis.call('HMGET', nkey, unpack(REPLAY_NODE))
      local count, pcpu, pmem = number_of(r[REPLAY_NODE.pending_count] or '0'),
        number_of(r[REPLAY_NODE.pending_cpu] or '0'),
        number_of(r[REPLAY_NODE.pending_memory_bytes] or '0')
      if count_ok(count) and count_ok(pcpu) and count_ok(pmem) then
        count, pcpu, pmem = count + 1, pcpu + tonumber(cpu), pmem + tonumber(mem)
      else
        -- (a corrupt pending number: counted again, this one included)
        local acked
        count, pcpu, pmem, acked = recount_pending(node_id)
        redis.call('HSET', nkey, 'acked_count', num_text(acked))
      end
      redis.call('HSET', nkey, 'pending_count', num_text(count), 'pending_cpu', num_text(pcpu),
        'pending_memory_bytes', num_text(pmem))
      if bound then
        -- its sandbox's assignment came already (this replica's, or one that
        -- claimed it): attached as assign-5.lua attaches one written back,
        -- the two-heartbeat rule counting from the stored count (the
        -- sandbox was in the node's store at that assignment),
        -- placement_reservation_ttl from its Schedule
        expires = fmt(created + P.reservation_ttl_ms)
        redis.call('HSET', rkey, 'state', 'assigned', 'sandbox_id', sb, 'assigned_ms', fmt(now),
          'expires_ms', expires, 'absent_cs',
          fmt(tonumber(r[REPLAY_NODE.create_successes]) or 0),
          'absent_rt', r[REPLAY_NODE.reported_order_ms] or '0')
        redis.call('HINCRBY', STATS_KEY, 'assigned_total', '1')
        if r[REPLAY_NODE.roster_mode] == '1' and r[REPLAY_NODE.absent_watch] ~= '1' then
          redis.call('HSET', nkey, 'absent_watch', '1')
        end
        redis.call('HSET', bind_key(sb), 'reservation_id', rid)
        redis.call('HDEL', bind_key(sb), 'claim')
      end
      redis.call('ZADD', EXPIRY_KEY, expires, rid)
      touch(ctx, node_id, true)
      live = live + 1
    end
  end
end
if live > 0 then redis.call('HINCRBY', STATS_KEY, 'replayed_total', fmt(live)) end
if ended > 0 then redis.call('HINCRBY', STATS_KEY, 'replayed_ended_total', fmt(ended)) end
reindex_touched(ctx, P, now)
return { live, ended, kept, unknown }
