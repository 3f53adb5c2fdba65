-- The shard's cross-tenant indexes, read only (platform admins). KEYS[1] = its timers ZSET.
-- ARGV[1..FQ_HEADER] = fq_init. Returns {per tier {tier, ready tenants, blocked tenants,
-- virtual time as text}, timers, items in flight, leases ended and not yet reaped}.
fq_init(ARGV)
local tiers = {}
for _, tier in ipairs(fq.tiers) do
  tiers[#tiers + 1] = {tier, redis.call('ZCARD', fq_gkey('ready:' .. tier)),
    redis.call('SCARD', fq_gkey('blocked:' .. tier)), fq_num(fq_vtime(tier))}
end
local inflight = fq_gkey('inflight')
return {tiers, redis.call('ZCARD', fq_gkey('timers')), redis.call('ZCARD', inflight),
  redis.call('ZCOUNT', inflight, '-inf', fq.now)}
