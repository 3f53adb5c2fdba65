-- How admission would decide an item of one of the tenant's pools now, changing nothing:
-- routing's dry run (admit_lib.lua's ad_decide, without ad_commit). KEYS[1] = the tenant's
-- items HASH (it routes the call). ARGV[1..FQ_HEADER] = fq_init; then: tenant id; pool id;
-- the pool's conf (JSON); the number of connection confs; each as field and JSON.
-- Returns {admitted 1/0, connection chosen or "", why, parked on the pool 1/0, look again at
-- (ms, Redis clock) or -1, the pool's live leases, its limit (-1: none), {per member: id,
-- breaker, live leases, limit, eligible 1/0, why}}.
fq_init(ARGV)
local A = FQ_HEADER
local tid, pool = ARGV[A + 1], ARGV[A + 2]
local confs = {}
for j = A + 5, A + 4 + 2 * tonumber(ARGV[A + 4]), 2 do
  confs[ARGV[j]] = cjson.decode(ARGV[j + 1])
end
local d = ad_decide(tid, pool, cjson.decode(ARGV[A + 3]), function(field) return confs[field] end)
local members = {}
for _, c in ipairs(d.cands) do
  members[#members + 1] = {c.id, c.breaker, c.live, c.limit, c.eligible and 1 or 0, c.why}
end
return {d.ok and 1 or 0, d.conn or '', d.why or '', d.park and 1 or 0, d.at or -1, d.pool_live, d.pool_limit,
  members}
