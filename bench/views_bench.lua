--[[
bench/views_bench.lua — the cost of creating a view from Lua (foundation issue: <= 1 µs per view).

Times 10^6 `qkv:select(3, 2)` calls on a packed [b, s, 3, h, d] buffer, plus narrow and transpose,
and prints µs per call. Run: make bench (or luajit bench/views_bench.lua from the repo root).
]]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"

local now = al.clock

local qkv = al.randn({2, 128, 3, 16, 64})
local N = 1000000
local function bench(name, fn)
  for _ = 1, 10000 do fn() end -- warm up the JIT
  local t0 = now()
  for _ = 1, N do fn() end
  local us = (now() - t0) / N * 1e6
  print(string.format("%-34s %7.3f us/call  %s", name, us, us <= 1.0 and "(target <= 1 us: met)" or "(target <= 1 us: MISSED)"))
end

print(string.format("views on a packed %s buffer, %d calls each (wall clock, GC included)", table.concat(qkv:size(), "x"), N))
bench("qkv:select(3, 2)", function() return qkv:select(3, 2) end)
bench("qkv:narrow(2, 17, 64)", function() return qkv:narrow(2, 17, 64) end)
bench("qkv:transpose(1, 2)", function() return qkv:transpose(1, 2) end)
