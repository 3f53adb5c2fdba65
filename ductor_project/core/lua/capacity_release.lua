-- KEYS[1] = the holder's lease record, KEYS[2] = the tenant's fence. ARGV[1] = holder id.
local fenced = fence_check(KEYS[2])
if fenced then return fenced end
return cap_release(KEYS[1], ARGV[1], cap_now_ms())
