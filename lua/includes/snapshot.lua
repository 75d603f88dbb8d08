--[[
  includes/snapshot.lua: what a heartbeat reads of the record it updates,
  defined once (a library's includes load once per server; a script body
  runs per call).  The heartbeat's field tables (SNAPSHOT_FIELDS,
  INDEX_FIELDS, WHOLE_FIELDS) are in includes/constants, generated from
  scheduler/records.py NodeSnapshot.
]]
-- @include stages
-- what a heartbeat reads of the record it updates: PREV, then the node as
-- decisions read it (NODE_FIELDS, for its index entry), in one read
local PREV = { 'service_instance_id', 'create_successes', 'roster_mode', 'acked_count', 'static',
  'cluster_id', 'p2p_address', 'generation', 'endpoint', 'roster_digest', 'idx', 'incarnation',
  'forgetting', 'roster_size' }
local HB_READ = {}
-- (plain loops: a library's load runs with no globals, not even ipairs)
for i = 1, #PREV do HB_READ[i] = PREV[i] end
for i = 1, #NODE_FIELDS do HB_READ[#PREV + i] = NODE_FIELDS[i] end
