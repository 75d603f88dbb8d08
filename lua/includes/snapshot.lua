--[[
  includes/snapshot.lua: what a heartbeat reads of the record it updates,
  defined once (a library's includes load once per server; a script body
  runs per call).  The heartbeat's field tables (SNAPSHOT_FIELDS,
  INDEX_MOVERS, WHOLE_FIELDS) are in includes/constants, generated from
  scheduler/domain/records.py NodeSnapshot.
]]
-- @exports PREV HB_NODE_AT HB_READ
-- @include index
-- What a heartbeat reads of the record it updates (prev[PREV.field], and
-- prev[#PREV + HB_NODE_AT.field]: layouts, positions resolved when the
-- library is built): PREV, then the node as
-- decisions read it but for what its bucket id spells (the snapshot's counts
-- and capacities, when it is indexed: includes/index.lua): NODE_FIELDS at
-- HB_NODE_AT, that is lingering, status, the observed cpu and memory use, and
-- the pending count, cpu and memory (includes/stages.lua)
-- @layout PREV
local PREV = { 'service_instance_id', 'create_successes', 'roster_mode', 'acked_count', 'static',
  'cluster_id', 'p2p_address', 'generation', 'endpoint', 'roster_digest', 'idx', 'incarnation',
  'forgetting', 'roster_size', 'idx_seen_ms', 'seen_ms', 'node_id', 'reported_order_ms',
  'counted_successes', 'deletes_uncounted', 'create_fails', 'counted_fails', 'cancels_uncounted',
  'absent_watch', 'fails_owed', 'stamp_lead', 'stamp_lead_was', 'stamp_lead_at' }
-- @layout HB_NODE_AT
local HB_NODE_AT = { NODE_FIELDS.lingering, NODE_FIELDS.status, NODE_FIELDS.cpu_percent,
  NODE_FIELDS.memory_used_bytes, NODE_FIELDS.pending_count, NODE_FIELDS.pending_cpu,
  NODE_FIELDS.pending_memory_bytes, NODE_FIELDS.admission }
local HB_READ = {}
-- (plain loops: a library's load runs with no globals, not even ipairs)
for i = 1, #PREV do HB_READ[i] = PREV[i] end
for i = 1, #HB_NODE_AT do HB_READ[#PREV + i] = NODE_FIELDS[HB_NODE_AT[i]] end
