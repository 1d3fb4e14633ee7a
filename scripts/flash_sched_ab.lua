-- scripts/flash_sched_ab.lua — interleaved A/B of the Hopper kernels' launch orders (ATTNLAB_FLASH_SCHED,
-- src/cuda/attn_flash_sm90.cu's sched_heads) on a GPU:
--   luajit scripts/flash_sched_ab.lua [--modes=0,default,4] [--rounds=9] [--no-mask] [--env=NAME]
-- Each round times every mode in turn (al.cuda.time: 10 forward calls, then 10 backward calls of that
-- forward's ctx), so clock drift spreads over all modes; prints per case and mode the median over rounds
-- in ms and TFLOP/s, then the rounds themselves. Modes: "default" (the variable unset), 0 (the grid's
-- order), "all", or N (sections of N (head, batch) pairs). Cases: bf16 causal 4x16x4096x128 (separate
-- and bs3hd), 2x16x8192x128, 1x16x16384x128, 4x32x4096x64; --no-mask adds 4x16x4096x128 without a mask.
-- --env=NAME varies another variable the same way (ATTNLAB_FLASH_SM90_BWD_FUSED: --modes=default,1).
-- docs/PERFORMANCE.md (session 13) has what it measured.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
local ffi = require "ffi"
pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")

local MODES, ROUNDS, NO_MASK, VAR = { "0", "default" }, 9, false, "ATTNLAB_FLASH_SCHED"
local function usage_error(msg)
  io.stderr:write("flash_sched_ab: " .. msg .. "\nusage: luajit scripts/flash_sched_ab.lua [--modes=a,b,...] " ..
    "[--rounds=N] [--no-mask] [--env=NAME]\n")
  os.exit(2)
end
for _, a in ipairs(arg or {}) do
  local m, r, e = a:match("^%-%-modes=(.*)$"), a:match("^%-%-rounds=(.*)$"), a:match("^%-%-env=(.*)$")
  if m then
    MODES = {}
    for x in m:gmatch("[^,]+") do MODES[#MODES + 1] = x end
    if #MODES < 1 then usage_error("--modes expects a comma-separated list, got " .. a) end
  elseif r then
    if not r:match("^%d+$") or tonumber(r) < 1 then usage_error("--rounds expects a positive integer, got " .. r) end
    ROUNDS = tonumber(r)
  elseif e then
    if not e:match("^[%a_][%w_]*$") then usage_error("--env expects an environment variable's name, got " .. e) end
    VAR = e
  elseif a == "--no-mask" then NO_MASK = true
  else usage_error("unknown argument " .. a) end
end
if not al.cuda.available() then print("flash_sched_ab: skipped, no usable GPU") os.exit(0) end

local cases = { -- b, h, s, d, mask, layout
  { 4, 16, 4096, 128, "causal", "separate" }, { 4, 16, 4096, 128, "causal", "bs3hd" },
  { 2, 16, 8192, 128, "causal", "separate" }, { 1, 16, 16384, 128, "causal", "separate" },
  { 4, 32, 4096, 64, "causal", "separate" },
}
if NO_MASK then cases[#cases + 1] = { 4, 16, 4096, 128, "no_mask", "separate" } end

local median = al.results.median
local function list(t)
  local s = {}
  for i, x in ipairs(t) do s[i] = string.format("%.3f", x) end
  return table.concat(s, " ")
end

for _, c in ipairs(cases) do
  local b, h, s, d, mask, layout = unpack(c)
  local o = { dtype = "bf16", device = "cuda" }
  al.manual_seed(5)
  local args
  if layout == "bs3hd" then
    args = { qkv_layer = al.randn({ b, s, 3, h, d }, o), qkv_interleave_dim = -3 }
  else
    args = { query_layer = al.randn({ b, s, h, d }, o), key_layer = al.randn({ b, s, h, d }, o),
      value_layer = al.randn({ b, s, h, d }, o) }
  end
  args.qkv_format, args.attn_mask_type, args.backend = "bshd", mask, "flash"
  local dout = al.randn({ b, s, h, d }, o)
  local flops = 4 * b * h * s * s * d * (mask == "causal" and 0.5 or 1)
  local tf, tb = {}, {}
  for _, m in ipairs(MODES) do tf[m], tb[m] = {}, {} end
  for r = 1, ROUNDS do
    for _, m in ipairs(MODES) do
      if m == "default" then ffi.C.unsetenv(VAR) else ffi.C.setenv(VAR, m, 1) end
      local ctx
      tf[m][r] = al.cuda.time(function() ctx = select(2, al.attention.forward(args)) end, { warmup = 2, iters = 10 })
      tb[m][r] = al.cuda.time(function() al.attention.backward(ctx, dout) end, { warmup = 2, iters = 10 })
      ctx = nil
      collectgarbage()
    end
  end
  ffi.C.unsetenv(VAR)
  for _, m in ipairs(MODES) do
    local f, bw = median(tf[m]), median(tb[m])
    print(string.format("S %d,%d,%d,%d %-7s %-8s " .. VAR:gsub("^ATTNLAB_", "") .. "=%-7s fwd %7.3f ms %6.1f TF/s  bwd %7.3f ms %6.1f TF/s",
      b, h, s, d, mask, layout, m, f, flops / f / 1e9, bw, 2.5 * flops / bw / 1e9))
  end
  for _, m in ipairs(MODES) do print(string.format("  rounds %s: fwd %s | bwd %s", m, list(tf[m]), list(tb[m]))) end
  args, dout = nil, nil
  collectgarbage()
  al.cuda.empty_cache()
end
