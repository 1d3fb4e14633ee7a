--[[
layout_bench.lua — what resolving packed QKV costs from Lua (issue 3's speed target: <= 2 us/call).

  declared  al.attention.unpack_qkv{qkv_layer=, qkv_interleave_dim=, qkv_format=}: one FFI call into
            al_qkv_unpack, three fresh tensor handles (zero-copy select views) and the layout string
  detected  al.attention.detect_layout(q, k, v, fmt) on the views of the same buffer: one FFI call into
            al_qkv_detect plus the deprecation-warning bookkeeping (policy "once": shown once, then
            deduplicated per call site on every call); also timed with the policy "ignore"

Run: make bench, or ATTNLAB_LIBDIR=lib LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/layout_bench.lua
]]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"

-- wall time (CLOCK_MONOTONIC): os.clock would add the CPU time of idle-spinning OpenMP threads
local clock = al.clock

local N = 100000

local function time(fn)
  fn(1000) -- warm up (JIT, caches)
  collectgarbage()
  local best = math.huge
  for _ = 1, 5 do
    local t0 = clock()
    fn(N)
    local dt = clock() - t0
    if dt < best then best = dt end
  end
  return best / N * 1e6
end

local rows = {}
local cases = {
  { "bs3hd", { 2, 128, 3, 16, 64 }, -3, "bshd", "qkv_layer" },
  { "sbh3d", { 128, 2, 16, 3, 64 }, -2, "sbhd", "qkv_layer" },
  { "thd_th2d", { 256, 8, 2, 64 }, -2, "thd", "kv_layer" },
}
local worst = 0
for _, c in ipairs(cases) do
  local name, shape, dim, fmt, which = c[1], c[2], c[3], c[4], c[5]
  local buf = al.randn(shape)
  local query = which == "kv_layer" and al.randn({ 256, 16, 64 }) or nil
  local a = { qkv_interleave_dim = dim, qkv_format = fmt }
  a[which] = buf
  a.query_layer = query
  local unpack_qkv, detect_layout = al.attention.unpack_qkv, al.attention.detect_layout
  local q, k, v, l = unpack_qkv(a)
  assert(l == name, l)
  local us_decl = time(function(n)
    for _ = 1, n do q, k, v, l = unpack_qkv(a) end
  end)
  local us_det_once, us_det_ignore
  local old = al.warnings.filter("once")
  al.warnings.capture(function()
    us_det_once = time(function(n)
      for _ = 1, n do l = detect_layout(q, k, v, fmt) end
    end)
  end)
  al.warnings.filter("ignore")
  us_det_ignore = time(function(n)
    for _ = 1, n do l = detect_layout(q, k, v, fmt) end
  end)
  al.warnings.filter(old)
  assert(l == name, l)
  if us_decl > worst then worst = us_decl end
  rows[#rows + 1] = ("%-10s %-10s %12.3f %16.3f %18.3f"):format(name, which, us_decl, us_det_once, us_det_ignore)
end

print(("layout resolution from Lua, %d calls each, best of 5, wall time (us/call)"):format(N))
print(("%-10s %-10s %12s %16s %18s"):format("layout", "input", "declared", "detected(once)", "detected(ignore)"))
for _, r in ipairs(rows) do print(r) end
print(("declared path worst case %.3f us/call: %s the 2 us target"):format(worst, worst <= 2 and "within" or "OVER"))
