-- An item's work failed or must wait: it goes back to its partition, due after a delay.
-- KEYS[1] = the tenant's items HASH. ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant id;
-- ARGV[A + 2] = item id; ARGV[A + 3] = delivery token or ""; ARGV[A + 4] = delay (ms); ARGV[A + 5] =
-- the work it did (ms), or "" for its time in flight; ARGV[A + 6] = the longest delay (ms), or "" for
-- the delay as given.
-- With a longest delay, the delay doubles with each failure in a row of the item (its `fails`,
-- which an ack that keeps the item clears), up to that longest.
-- Ends the lease, gives the capacity slot back and unlocks the partition.
-- Returns 1, or 0 (changing nothing) when that item is not in flight.
fq_init(ARGV)
local A = FQ_HEADER
local tid, id = ARGV[A + 1], ARGV[A + 2]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local it = fq_in_flight(tid, id, ARGV[A + 3])
if it == nil then return 0 end
fq_settle(tid, it, tonumber(ARGV[A + 5]))
fq_end_lease(tid, id, it)
local delay, longest = tonumber(ARGV[A + 4]), tonumber(ARGV[A + 6])
it.fails = (it.fails or 0) + 1
if longest then delay = math.min(delay * 2 ^ math.min(it.fails - 1, 40), math.max(delay, longest)) end
fq_requeue(tid, id, it, fq.now + delay)
fq_unlock(tid, it.partition)
fq_unblock(tid)
return 1
