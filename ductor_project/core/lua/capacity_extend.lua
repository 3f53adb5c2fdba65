-- KEYS[1] = the holder's lease record, KEYS[2] = the tenant's fence. ARGV[1] = holder id,
-- ARGV[2] = lease (ms).
local fenced = fence_check(KEYS[2])
if fenced then return fenced end
return cap_extend(KEYS[1], ARGV[1], tonumber(ARGV[2]), cap_now_ms())
