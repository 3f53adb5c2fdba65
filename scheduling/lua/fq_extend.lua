-- Renew the lease of an item in flight, and its capacity slot's lease with it.
-- KEYS[1] = the tenant's items HASH. ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant id;
-- ARGV[A + 2] = item id; ARGV[A + 3] = delivery token or ""; ARGV[A + 4] = lease (ms from now).
-- Returns 1, or 0 (changing nothing) when the item is not in flight or its lease has
-- already ended (it belongs to the reaper then: a lost lease is never taken back).
fq_init(ARGV)
local A = FQ_HEADER
local tid, id = ARGV[A + 1], ARGV[A + 2]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local it = fq_in_flight(tid, id, ARGV[A + 3])
if it == nil or it.lease <= fq.now then return 0 end
local lease_ms = tonumber(ARGV[A + 4])
it.lease = fq.now + lease_ms
fq_save(tid, id, it)
redis.call('ZADD', fq_gkey('inflight'), 'XX', it.lease, tid .. '|' .. id)
cap_extend(fq_holder_record(tid, id), FQ_HOLDER .. id, lease_ms, fq.now)
return 1
