-- scripts/fp8_repeat_probe.lua — does the fused FP8 forward (cuDNN's FP8 SDPA, src/cuda/attn_fused_fp8.cu)
-- give the same output for the same call? Session 30 (H100, cuDNN 9.14.0) found that it need not: identical
-- calls differed in thousands of elements (docs/FP8.md, "Open problem"; docs/PERFORMANCE.md, session 30).
-- This runs each case --reps times from clones of one recipe state and prints, per case, the largest difference
-- between the repeats and the first, how many elements differ by more than a tenth of max|O|, and the RMSE /
-- range against the CPU emulation of the same state (the oracle). Cases:
--   bf16       the bf16 fused forward (the control: bit-identical run to run)
--   first      a fresh DelayedScaling: every scale 1
--   second     after one step with the same mask on that recipe (what fp8_fused_spec's `run` checks)
--   after_nm   after one no_mask step (the S scale from its small amax_S: the unnormalised P saturates)
--   s448       a fresh Recipe whose S scale is pinned at fp8_max (P <= 1 never saturates), others delayed
--   usage: luajit scripts/fp8_repeat_probe.lua [--shape=b,h,s,d] [--mask=no_mask|causal] [--reps=N] [--packed]
-- Defaults: 2,4,128,64, causal, 3 repeats, separate bshd q/k/v (--packed: one bs3hd qkv_layer). Without a
-- GPU it says so and exits 0; a malformed argument is an error naming it (exit 2). The environment reaches
-- the library as usual: CUDA_LAUNCH_BLOCKING=1, ATTNLAB_DNN_PLAN_SKIP=k (cuDNN's next engine configs), and
-- compute-sanitizer can wrap the process.
package.path = "lua/?.lua;lua/?/init.lua;scripts/?.lua;" .. package.path
local al = require "attnlab"
local cli = require "cli_args"

local USAGE = "usage: luajit scripts/fp8_repeat_probe.lua [--shape=b,h,s,d] [--mask=no_mask|causal] [--reps=N] [--packed]"
local usage_error = cli.usage_error("fp8_repeat_probe", USAGE)

local shape, mask, reps, packed = { 2, 4, 128, 64 }, "causal", 3, false
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_]+)=(.*)$")
  if a == "--packed" then
    packed = true
  elseif k == "shape" then
    shape = cli.shape(v, usage_error)
  elseif k == "mask" then
    mask = cli.mask(v, usage_error)
  elseif k == "reps" then
    reps = cli.int("reps", v, 2, usage_error)
  else
    usage_error("unknown argument " .. a)
  end
end
if not al.cuda.available() then print("fp8_repeat_probe: skipped, no usable GPU") os.exit(0) end

local b, h, s, d = shape[1], shape[2], shape[3], shape[4]
al.manual_seed(12)
local function rnd(sz) return al.randn(sz, { dtype = "bf16", device = "cuda" }) end
local inputs
if packed then
  inputs = { qkv_layer = rnd({ b, s, 3, h, d }), qkv_interleave_dim = -3, qkv_format = "bshd" }
else
  inputs = { query_layer = rnd({ b, s, h, d }), key_layer = rnd({ b, s, h, d }), value_layer = rnd({ b, s, h, d }),
    qkv_format = "bshd" }
end

-- the call's arguments on the given backend (CPU tensors for "cpu"), with recipe and mask
local function call(backend, recipe, m)
  local a = { backend = backend, fp8_recipe = recipe, attn_mask_type = m or mask }
  for k, v in pairs(inputs) do a[k] = (backend == "cpu" and al.is_tensor(v)) and v:cpu() or v end
  return al.attention.forward(a)
end

local function values(t) return t:float():cpu():flat_values() end

-- the largest |x - ref|, how many elements differ by more than tol (NaN counts as a difference)
local function compare(x, ref, tol)
  local m, n = 0, 0
  for i = 1, #x do
    local e = math.abs(x[i] - ref[i])
    if e ~= e then e = math.huge end
    if e > tol then n = n + 1 end
    if e > m then m = e end
  end
  return m, n
end

local function rel_rmse(a, ref)
  local lo, hi, sum = math.huge, -math.huge, 0
  for i = 1, #ref do
    sum = sum + (a[i] - ref[i]) ^ 2
    if ref[i] < lo then lo = ref[i] end
    if ref[i] > hi then hi = ref[i] end
  end
  return math.sqrt(sum / #ref) / (hi - lo)
end

local DS = function() return al.fp8.DelayedScaling{ amax_history_len = 4, device_scaling = false } end
local function s448()
  return al.fp8.Recipe{ amax_history_len = 4, scale = function(slot, amaxes, fmax)
    if slot == "s" then return fmax end
    local m = 0
    for _, x in ipairs(amaxes) do if x > m then m = x end end
    return (m > 0 and m < math.huge) and fmax / m or 1
  end }
end

-- each case: a recipe in the state to repeat from (nil: the bf16 control)
local cases = {
  { "bf16", function() return nil end },
  { "first", DS },
  { "second", function() local r = DS(); call("fused", r); r:settle(); return r end },
  { "after_nm", function() local r = DS(); call("fused", r, "no_mask"); r:settle(); return r end },
  { "s448", s448 },
}

print(string.format("fp8_repeat_probe: %dx%dx%dx%d (b,h,s,d) %s, %s q/k/v, %d repeats per case", b, h, s, d, mask,
  packed and "packed bs3hd" or "separate bshd", reps))
for _, c in ipairs(cases) do
  local state = c[2]()
  local ok, err = pcall(function()
    local first = values(call("fused", state and state:clone()))
    local omax = 0
    for i = 1, #first do omax = math.max(omax, math.abs(first[i])) end
    local worst, nworst = 0, 0
    for _ = 2, reps do
      local m, n = compare(values(call("fused", state and state:clone())), first, 0.1 * omax)
      if m > worst then worst = m end
      if n > nworst then nworst = n end
    end
    local emul = state and string.format("%.4f", rel_rmse(first, values(call("cpu", state:clone())))) or "-"
    print(string.format("  %-9s repeats vs the first: max |diff| %.4g, elements off by > 0.1 max|O|: %d of %d (max|O| %.4g);" ..
      " RMSE/range vs the emulation %s", c[1], worst, nworst, #first, omax, emul))
  end)
  if not ok then print(string.format("  %-9s error: %s", c[1], tostring(err))) end
end
