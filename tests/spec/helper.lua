-- Loaded by busted before the specs (see .busted): makes `al` reachable and detects the GPU once.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
_G.HAS_GPU = al.cuda.available() and true or false

-- with_env(name, value, fn): runs fn with the environment variable set (value nil: unset) through
-- libc's setenv, so the C library sees it on its next call, then restores what was there, also when
-- fn fails (its error is re-raised). For the specs that compare two kernels behind an env switch.
local ffi = require "ffi"
pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
function _G.with_env(name, value, fn)
  local before = os.getenv(name)
  if value == nil then ffi.C.unsetenv(name) else ffi.C.setenv(name, value, 1) end
  local ok, err = pcall(fn)
  if before then ffi.C.setenv(name, before, 1) else ffi.C.unsetenv(name) end
  if not ok then error(err, 0) end
end

-- hopper_missing(): nil on an sm_90+ GPU (cuDNN's FP8 SDPA, the Hopper kernels), else why not (for pending)
function _G.hopper_missing()
  if not al.cuda.available() then return "no GPU" end
  local cap = al.cuda.device_info(0).capability
  if cap[1] < 9 then return "needs sm_90+, this is sm_" .. cap[1] .. cap[2] end
  return nil
end

-- ATTNLAB_SPEC_SHARD=I/N (1 <= I <= N): this process runs only every N-th test, starting at the I-th, in the order
-- busted registers them; N processes with I = 1..N run each test exactly once between them. For spec files whose
-- run is mostly NVRTC compiles and CPU oracles (attention_flash_spec on a fresh GPU machine compiles every Hopper
-- specialisation: more than a 10-minute device call, sessions 24 and 26): scripts/gpu_session.sh's SHARDS runs them
-- side by side. A test left out is never attached, so it is neither run nor counted.
do
  local v = os.getenv("ATTNLAB_SPEC_SHARD")
  if v and v ~= "" then
    local i, n = v:match("^(%d+)/(%d+)$")
    i, n = tonumber(i), tonumber(n)
    if not (i and n and i >= 1 and i <= n) then
      error("ATTNLAB_SPEC_SHARD: expected I/N with 1 <= I <= N (run every N-th test from the I-th), got '" .. v .. "'",
            0)
    end
    local busted = require "busted"
    local count = 0
    busted.subscribe({ "register", "it" }, function()
      count = count + 1
      return nil, (count - i) % n == 0   -- false: the registration stops here
    end, { priority = 1 })
  end
end
