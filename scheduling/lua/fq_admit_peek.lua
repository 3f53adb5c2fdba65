-- How admission would decide an item of one of the tenant's pools now, changing nothing:
-- routing's dry run (admit_lib.lua's ad_decide, without ad_commit). KEYS[1] = the tenant's
-- items HASH (it routes the call). ARGV[1..FQ_HEADER] = fq_init; then: tenant id; pool id;
-- the pool's conf (JSON); the number of connection confs; each as field and JSON.
-- Returns the decision as admit_lib.lua's ad_view gives it.
fq_init(ARGV)
local A = FQ_HEADER
local tid, pool = ARGV[A + 1], ARGV[A + 2]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local confs = {}
for j = A + 5, A + 4 + 2 * tonumber(ARGV[A + 4]), 2 do
  confs[ARGV[j]] = cjson.decode(ARGV[j + 1])
end
return ad_view(ad_decide(tid, pool, cjson.decode(ARGV[A + 3]), function(field) return confs[field] end))
