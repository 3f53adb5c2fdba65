-- KEYS[1] = a scope ZSET, KEYS[2] = the tenant's fence.
local fenced = fence_check(KEYS[2])
if fenced then return fenced end
return cap_in_flight(KEYS[1], cap_now_ms())
