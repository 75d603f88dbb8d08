--[[
  heartbeat-5.lua: ingest a node's heartbeat: snapshot, identity, roster.

  A heartbeat is sent in full, or as a delta against the record a replica
  last wrote (same generation): only changed fields, and the roster only
  when its digest changed.  A delta that meets any other record writes
  nothing and answers RESYNC; the replica then sends it in full.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     node_id
  ARGV[2]     service_instance_id (a new one = the node restarted)
  ARGV[3]     endpoint ("" = keep; ignored for nodes of the static list)
  ARGV[4]     base: "<incarnation>:<generation>" this delta is based on ("" = a full
              heartbeat); a record gets a cell-unique incarnation when created,
              so a delta can never apply to a record deleted and made again
  ARGV[5]     roster_digest (of the sorted roster; computed by the client)
  ARGV[6]     roster_form: "1" the roster follows, "0" unchanged since the base,
              "2" (a delta only) what joined and left it since the base follows
  ARGV[7]     field_count F, the number of field/value pairs that follow
  ARGV[8..7+2F]  fields: snapshot and identity fields (names in SNAPSHOT_FIELDS)
  ARGV[8+2F..]   roster: "1": every sandbox id the node runs (may be empty);
              "2": the base's roster digest, J, then J sandbox ids that joined,
              then the ids that left (the roster held must still be the base's,
              else RESYNC: it is while the record keeps the base's digest, which
              whatever else takes a sandbox out of it clears, see
              roster_changed in includes/nodes.lua)

  Returns {generation, restarted 1/0, released (reservations), roster_mode 1/0,
          now_ms, incarnation} or {kind "RESYNC"} (a delta whose base is gone;
          nothing written);
          a heartbeat of the stored service instance whose reported_at_unix_ms
          is below the newest it sent writes nothing and answers the stored
          generation with incarnation "" (the replica's next delta resyncs)
  Errors: UNKNOWN_NODE node is not in scheduler node list (static list only),
          BADARG <field> ... (sandbox_ids longer than the policy's
          max_roster_ids, among others), NO_POLICY (no policy); every
          check and the roster diff run before the first write, so an error
          writes nothing
  Writes: node:<id> (snapshot, last_seen_ms, generation, restarts and the
          replaced_service_instance_id at a restart, roster_size,
          roster_mode, roster_digest), nodes (registration), seen, bind:* and
          node-roster:<id> / node-sbx:<id> for sandboxes that joined or left
          the roster (taking one another node's binding held ends the
          reservation charged to it there: includes/bindings.lua), the
          node's index entry, the CPU config round of the cluster it moved
          from (cpucfg:*, includes/cpu_config.lua cfg_moved), and
          releases reservations the node's numbers now include:
          - roster mode (the node has sent a non-empty roster since it
            started): assigned reservations whose sandbox is listed, and
            those whose sandbox two rosters that count did not list (taken
            after its creation by their counter, absent_cs; or stamped
            heartbeats received after its assignment, absent_rt:
            lua/assign-5.lua, includes/heartbeat.lua);
          - counter mode: as many as create_successes rose, those
            acknowledged by a CREATE/FORK event first, then assigned ones,
            then the oldest (and so does the switch to roster mode);
          releases the oldest pending (unassigned) reservations, as many as
          create_fails rose within the instance at the previous heartbeat
          (fails_owed), less the client's cancels of pending reservations
          since (either mode);
          and forgets nodes silent for node_forget_after (a bounded sweep,
          see forget_sweep in includes/nodes.lua).
]]
-- @include heartbeat
-- @include nodes
local r = heartbeat_one(ctx, ARGV)
if r.err or r[1] == 'RESYNC' then return r end
forget_sweep(ctx, ctx[CTX.P], ctx[CTX.heard])
-- @phase forget_sweep
reindex_touched(ctx, ctx[CTX.P], ctx[CTX.heard])
-- @phase reindex_others
return r
