-- scripts/flash_probe.lua — one shape's flash forward and a few backwards, nothing else: the process to hand a
-- profiler (ncu, nsys, compute-sanitizer). Random inputs, separate bshd tensors.
--   luajit scripts/flash_probe.lua [--shape=b,h,s,d] [--mask=no_mask|causal] [--dtype=bf16|f16] [--calls=N]
--                                  [--softcap=CAP]
-- Defaults: 4,16,4096,128, no_mask, bf16, 3 backwards after one forward. --softcap=CAP runs soft-capping as a
-- score_mod (CAP tanh(score / CAP), bench/variants.lua's section 1): the generated variant kernels instead.
-- Each backward launches the pre pass and the Hopper dK/dV and dQ kernels (kernels/flash_bwd.cu,
-- flash_bwd_sm90.cu), so the second backward's three kernels are launches 4-6 of regex "al_flash_bwd" (the first
-- warms the module cache). Session 14's profile
-- (docs/PERFORMANCE.md) was, from the repo root after `. .gpu-deps/env.sh`:
--   ncu --clock-control none --kernel-name regex:"al_flash_bwd" --launch-skip 3 --launch-count 3 \
--       --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
--   lts__t_sector_hit_rate.pct,dram__bytes_read.sum,smsp__inst_executed.sum luajit scripts/flash_probe.lua
-- (add --section WarpStateStats --section SchedulerStats for where the warps wait; per SASS instruction:
-- --section SourceCounters -o REPORT, then `ncu -i REPORT.ncu-rep --page source --csv --print-source sass > s.csv`
-- and `python3 scripts/ncu_stalls.py s.csv`, session 15). Without a GPU it says so and
-- exits 0; a malformed argument is an error naming it (exit 2).
package.path = "lua/?.lua;lua/?/init.lua;scripts/?.lua;" .. package.path
local al = require "attnlab"
local cli = require "cli_args"

local USAGE = "usage: luajit scripts/flash_probe.lua [--shape=b,h,s,d] [--mask=no_mask|causal] [--dtype=bf16|f16] " ..
  "[--calls=N] [--softcap=CAP]"
local usage_error = cli.usage_error("flash_probe", USAGE)

local shape, mask, dtype, calls, softcap = { 4, 16, 4096, 128 }, "no_mask", "bf16", 3, nil
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_]+)=(.*)$")
  if k == "shape" then
    shape = cli.shape(v, usage_error)
  elseif k == "mask" then
    mask = cli.mask(v, usage_error)
  elseif k == "dtype" then
    if v ~= "bf16" and v ~= "f16" then usage_error("--dtype expects bf16 or f16, got " .. v) end
    dtype = v
  elseif k == "calls" then
    calls = cli.int("calls", v, 1, usage_error)
  elseif k == "softcap" then
    softcap = tonumber(v)
    if not softcap or softcap <= 0 then usage_error("--softcap expects a positive number, got " .. v) end
  else
    usage_error("unknown argument " .. a)
  end
end
if not al.cuda.available() then print("flash_probe: skipped, no usable GPU") os.exit(0) end

local b, h, s, d = shape[1], shape[2], shape[3], shape[4]
al.manual_seed(3)
local function r() return al.randn({ b, s, h, d }, { dtype = dtype, device = "cuda" }) end
local args = { query_layer = r(), key_layer = r(), value_layer = r(), qkv_format = "bshd", backend = "flash",
  attn_mask_type = mask }
if softcap then args.score_mod = function(score) return softcap * al.tanh(score / softcap) end end
local out, ctx = al.attention.forward(args)
local dout = al.randn(out:size(), { dtype = dtype, device = "cuda" })
for _ = 1, calls do al.attention.backward(ctx, dout) end
al.cuda.synchronize()
print(string.format("flash_probe: %dx%dx%dx%d %s %s%s, one forward and %d backward%s", b, h, s, d, dtype, mask,
  softcap and string.format(", soft-capping %g (score_mod)", softcap) or "", calls, calls == 1 and "" or "s"))
