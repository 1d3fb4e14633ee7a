-- copy_bench.lua — bandwidth of the CUDA plugin's copy paths on 1 GiB tensors (llm.c style):
--   d2d copy       f32 -> f32 dense copy_ (cudaMemcpyAsync)           bytes moved: read 4 + write 4 per element
--   f32 -> bf16    dense convert kernel (16-byte vector loads)        read 4 + write 2
--   bf16 -> f32    dense convert kernel                               read 2 + write 4
--   f32 -> e4m3    dense convert kernel (saturating FP8, hardware cvt) read 4 + write 1
--   f32 -> e5m2    the same for E5M2                                  read 4 + write 1
--   bf16 -> e4m3   the same from bf16                                 read 2 + write 1
--   strided f32    transposed copy (the tiled transpose kernel)       read 4 + write 4
--   strided bf16   transposed copy, bf16                              read 2 + write 2
--   f32 -> bf16 T  transposed copy converting f32 -> bf16             read 4 + write 2
--   add f32        element-wise a + b (float4 kernel)                 read 8 + write 4
-- Each is timed with al.cuda.Event over several repetitions after a warm-up, on fresh random
-- inputs; the table gives the best time, GB/s and the ratio to the d2d copy's GB/s (the convert
-- kernel's target is >= 0.80). Usage: luajit bench/copy_bench.lua [GiB] (default 1).
local al = require "attnlab"

local ok, why = al.cuda.available()
if not ok then
  print("copy_bench: skipped, CUDA not available: " .. tostring(why))
  return
end

local gib = tonumber(arg and arg[1]) or 1
local n = math.floor(gib * 2 ^ 30 / 4)          -- f32 elements in `gib` GiB
local rows = 16384
n = math.floor(n / rows) * rows
local cols = n / rows
local REPS = 10

al.manual_seed(20261203)
local x = al.randn({ rows, cols }, { device = "cuda" })
local y = al.randn({ rows, cols }, { device = "cuda" })
local dst32 = al.empty({ rows, cols }, { device = "cuda" })
local dst16 = al.empty({ rows, cols }, { device = "cuda", dtype = "bf16" })
local dst8 = al.empty({ rows, cols }, { device = "cuda", dtype = "fp8_e4m3" })
local dst85 = al.empty({ rows, cols }, { device = "cuda", dtype = "fp8_e5m2" })
local xb = x:to("bf16")
-- transposed destinations of the same shape: every element written through the tiled transpose
local dstT = al.empty({ cols, rows }, { device = "cuda" }):t()
local dstTb = al.empty({ cols, rows }, { device = "cuda", dtype = "bf16" }):t()

local function time(f)
  f()                                    -- warm-up (and cache the allocator's blocks)
  al.cuda.synchronize()
  local best = math.huge
  for _ = 1, REPS do
    local e0, e1 = al.cuda.Event(), al.cuda.Event()
    e0:record()
    f()
    e1:record()
    e1:synchronize()
    best = math.min(best, e0:elapsed_time(e1))
  end
  return best
end

local results = {}
local function run(name, bytes_per_elem, f)
  local ms = time(f)
  local gbs = bytes_per_elem * n / (ms * 1e-3) / 1e9
  results[#results + 1] = { name, ms, gbs }
end

run("d2d copy f32", 8, function() dst32:copy_(x) end)
run("convert f32->bf16", 6, function() dst16:copy_(x) end)
run("convert bf16->f32", 6, function() dst32:copy_(xb) end)
run("convert f32->fp8_e4m3", 5, function() dst8:copy_(x) end)
run("convert f32->fp8_e5m2", 5, function() dst85:copy_(x) end)
run("convert bf16->fp8_e4m3", 3, function() dst8:copy_(xb) end)
run("strided copy f32 (transposed)", 8, function() dstT:copy_(x) end)
run("strided copy bf16 (transposed)", 4, function() dstTb:copy_(xb) end)
run("transpose+convert f32->bf16", 6, function() dstTb:copy_(x) end)
run("add f32", 12, function() local z = x + y; z:free() end)

local base = results[1][3]
print(string.format("copy_bench: %d x %d f32 (%.2f GiB), best of %d, device %s", rows, cols, n * 4 / 2 ^ 30, REPS,
  al.cuda.device_info(0).name))
print(string.format("%-32s %10s %10s %10s", "kernel", "ms", "GB/s", "vs d2d"))
for _, r in ipairs(results) do
  print(string.format("%-32s %10.3f %10.1f %10.2f", r[1], r[2], r[3], r[3] / base))
end
-- sanity: each converted / transposed tensor equals the CPU conversion on a sample (bit-exact; the
-- FP8 ones compared as raw codes through u8 so that NaN-free equality is exact)
local function check(what, want, got)
  assert(al.max_abs_diff(want:to("f64"), got:cpu():to("f64")) == 0, "copy_bench: " .. what .. " differs from the CPU conversion")
end
local xs, xbs = x:narrow(1, 1, 4):cpu(), xb:narrow(1, 1, 4):cpu()
check("f32->bf16", xs:to("bf16"), dst16:narrow(1, 1, 4))
check("f32->fp8_e5m2", xs:to("fp8_e5m2"), dst85:narrow(1, 1, 4))
check("bf16->fp8_e4m3", xbs:to("fp8_e4m3"), dst8:narrow(1, 1, 4))     -- dst8 last written from xb
check("f32 transposed", xs, dstT:narrow(1, 1, 4))
check("f32->bf16 transposed", xs:to("bf16"), dstTb:narrow(1, 1, 4))     -- dstTb last written from x
print("copy_bench: sampled results equal the CPU conversions")
