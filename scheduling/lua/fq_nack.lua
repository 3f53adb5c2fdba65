-- An item's work failed or must wait: it goes back to its partition, due after a delay.
-- KEYS[1] = the tenant's items HASH. ARGV[1..7] = fq_init; ARGV[8] = tenant id;
-- ARGV[9] = item id; ARGV[10] = delivery token or ""; ARGV[11] = delay (ms).
-- Ends the lease, gives the capacity slot back and unlocks the partition.
-- Returns 1, or 0 (changing nothing) when that item is not in flight.
fq_init(ARGV)
local tid, id = ARGV[8], ARGV[9]
local it = fq_in_flight(tid, id, ARGV[10])
if it == nil then return 0 end
fq_end_lease(tid, id, it)
fq_requeue(tid, id, it, fq.now + tonumber(ARGV[11]))
fq_unlock(tid, it.partition)
fq_unblock(tid)
return 1
