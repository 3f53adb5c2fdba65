-- How long a dispatcher of the shard may sleep. KEYS[1] = the shard's timers ZSET.
-- ARGV[1..FQ_HEADER] = fq_init. Returns 0 when a tenant is ready now, else the ms until the
-- earliest timer or lease end, or -1 when the shard holds nothing at all.
fq_init(ARGV)
for _, tier in ipairs(fq.tiers) do
  if redis.call('ZCARD', fq_gkey('ready:' .. tier)) > 0 then return 0 end
end
local at = nil
for _, name in ipairs({'timers', 'inflight'}) do
  local first = redis.call('ZRANGE', fq_gkey(name), 0, 0, 'WITHSCORES')
  if first[2] ~= nil and (at == nil or tonumber(first[2]) < at) then at = tonumber(first[2]) end
end
if at == nil then return -1 end
return math.max(0, at - fq.now)
