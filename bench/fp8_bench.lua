-- bench/fp8_bench.lua — combine_and_quantize: quantising a packed QKV buffer in one pass (one amax, one
-- cast over the caller's buffer) vs the legacy path (amax and cast of the q, k, v views separately),
-- same scale, bit-identical codes. CPU, and GPU when one is usable. Prints ms per call and the ratio.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"

local ok_socket, socket = pcall(require, "socket")
local function wall() return ok_socket and socket.gettime() or os.clock() end
local function bench(fn, iters, sync)
  fn()
  if sync then sync() end
  local t0 = wall()
  for _ = 1, iters do fn() end
  if sync then sync() end
  return (wall() - t0) * 1000 / iters
end

local function run(device, shape, iters)
  al.manual_seed(1)
  local qkv = al.randn(shape, { dtype = "bf16" })
  if device ~= "cpu" then qkv = qkv:cuda() end
  local sync = device ~= "cpu" and function() al.cuda.synchronize() end or nil
  local combined = function()
    local a = al.fp8.amax(qkv)
    return al.fp8.quantize(qkv, { scale = 448 / a })
  end
  local legacy = function()
    local q, k, v = qkv:select(3, 1), qkv:select(3, 2), qkv:select(3, 3)
    local a = math.max(al.fp8.amax(q), al.fp8.amax(k), al.fp8.amax(v))
    return al.fp8.quantize(q, { scale = 448 / a }), al.fp8.quantize(k, { scale = 448 / a }), al.fp8.quantize(v, { scale = 448 / a })
  end
  local tc = bench(combined, iters, sync)
  local tl = bench(legacy, iters, sync)
  print(string.format("%-5s bshd qkv %-20s  combined %8.3f ms   legacy (3 views) %8.3f ms   speedup %.2fx", device,
    table.concat(shape, "x"), tc, tl, tl / tc))
end

print("fp8 combine_and_quantize (amax + cast, e4m3, bf16 input)")
run("cpu", { 4, 1024, 3, 16, 64 }, 10)
run("cpu", { 2, 4096, 3, 16, 128 }, 3)
if al.cuda.available() then
  run("cuda", { 4, 4096, 3, 16, 128 }, 50)
  run("cuda", { 2, 8192, 3, 16, 128 }, 50)
else
  print("cuda: skipped (" .. select(2, al.cuda.available()) .. ")")
end
