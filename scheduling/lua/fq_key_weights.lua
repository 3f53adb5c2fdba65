-- Set the weights of some of a tenant's fairness keys (its second level: a key's next finish tag is
-- its start tag plus the charge over its weight), or with `replace` make them all of its weights.
-- KEYS[1] = the tenant's items HASH (it routes the call).
-- ARGV[1..FQ_HEADER] = fq_init; then: tenant id; 1 if every other weight of the tenant goes, else
-- 0; the number of keys, then each key and its weight (1: the default, not stored).
-- Returns how many weights differ from what was stored before (with `replace`: from nothing).
fq_init(ARGV)
local A = FQ_HEADER
local tid = ARGV[A + 1]
local fenced = fq_fenced(tid)
if fenced then return fenced end
if ARGV[A + 2] == '1' then redis.call('DEL', fq_tkey(tid, 'kw')) end
local _, changed = fq_set_kweights(tid, ARGV, A + 3)
return changed
