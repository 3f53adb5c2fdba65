-- Why an item of the tenant waits, read only (the "why is it waiting?" of a step). KEYS[1] = the
-- tenant's items HASH. ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant id; ARGV[A + 2] = item id.
-- Everything the dequeue looks at, in its order, from the tenant's own keys (its conf and its
-- scopes' confs as the fair queue holds them): returns {found 1/0, state, due (ms), tier,
-- partition, the item in flight on its partition or "", items ahead of it in its partition,
-- suspended 1/0, the tenant's ceiling (-1 none), its slots taken, ms until its rate admits a start,
-- admission (admit_lib.lua's ad_view) or {}, now, its deliveries so far}. Nothing of other tenants.
fq_init(ARGV)
local A = FQ_HEADER
local tid, id = ARGV[A + 1], ARGV[A + 2]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local it = fq_item(tid, id)
if it == nil then return {0} end
local tier, part = it.tier, it.partition
local holder = redis.call('HGET', fq_tkey(tid, 'locks'), part) or ''
if holder == id then holder = '' end
local ahead = redis.call('ZRANK', fq_pkey(tid, tier, part), id) or 0
local conf = fq_conf(tid)
local live = cap_in_flight(fq.tprefix .. tid .. fq.scope, fq.now)
local admission = {}
local pool = it.scope and fq_scope_conf(tid, 'pool:' .. it.scope)
if pool then
  admission = ad_view(ad_decide(tid, it.scope, pool, function(field) return fq_scope_conf(tid, field) end))
end
return {1, it.state, fq_num(it.due), tier, part, holder, ahead, conf.suspended and 1 or 0, conf.limit, live,
  fq_rate_wait_ms(tid, conf), admission, fq.now, it.n or 0}
