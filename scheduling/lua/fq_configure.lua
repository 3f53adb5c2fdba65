-- Bring a tenant's copy of its limits up to date, and wake what the changes may admit: its
-- conf (weight, limits, suspension: a reactivated tenant is dispatched again at once) and its
-- admission scopes (a pool or connection whose limits or members changed wakes the
-- partitions parked on it). KEYS[1] = the tenant's items HASH (it routes the call).
-- ARGV[1..FQ_HEADER] = fq_init; then: tenant id; 1 if a conf follows, else 0; the conf's
-- values (as fq_enqueue takes them) when it does; 1 if the scopes listed replace all of the
-- tenant's (any other is deleted), else 0; the number of scopes; each as field and JSON.
-- Returns the number of scope confs written or deleted.
fq_init(ARGV)
local A = FQ_HEADER
local tid = ARGV[A + 1]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local i = A + 3
if ARGV[A + 2] == '1' then
  fq_set_conf(tid, ARGV, i)
  i = i + FQ_CONF_ARGS
end
local replace = ARGV[i] == '1'
local listed = {}
local n = tonumber(ARGV[i + 1])
local key = fq_tkey(tid, 'scopes')
local changed = 0
for j = i + 2, i + 1 + 2 * n, 2 do
  listed[ARGV[j]] = true
  if redis.call('HGET', key, ARGV[j]) ~= ARGV[j + 1] then changed = changed + 1 end
  fq_set_scope(tid, ARGV[j], ARGV[j + 1])
end
if replace then
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if not listed[field] then
      fq_set_scope(tid, field, false)
      changed = changed + 1
    end
  end
end
return changed
