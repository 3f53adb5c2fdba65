-- Renew the lease of an item in flight, and its capacity slot's lease with it.
-- KEYS[1] = the tenant's items HASH. ARGV[1..7] = fq_init; ARGV[8] = tenant id;
-- ARGV[9] = item id; ARGV[10] = delivery token or ""; ARGV[11] = lease (ms from now).
-- Returns 1, or 0 (changing nothing) when the item is not in flight or its lease has
-- already ended (it belongs to the reaper then: a lost lease is never taken back).
fq_init(ARGV)
local tid, id = ARGV[8], ARGV[9]
local it = fq_in_flight(tid, id, ARGV[10])
if it == nil or it.lease <= fq.now then return 0 end
local lease_ms = tonumber(ARGV[11])
it.lease = fq.now + lease_ms
fq_save(tid, id, it)
redis.call('ZADD', fq_gkey('inflight'), 'XX', it.lease, tid .. '|' .. id)
cap_extend(fq_holder_record(tid, id), FQ_HOLDER .. id, lease_ms, fq.now)
return 1
