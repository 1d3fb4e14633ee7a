-- bench/attention_gpu_bench.lua — GPU attention TFLOP/s, forward and backward, per backend and input
-- layout, plus the host overhead of one cached fused call.
--
-- Shapes (b,h,s,d): (16,16,1024,128) (4,16,4096,128) (2,16,8192,128) (1,16,16384,128) (4,32,4096,64)
-- (4,16,4096,256), causal and not, bf16, for separate bshd tensors ("separate") and for one packed
-- [b,s,3,h,d] buffer declared as qkv_layer ("bs3hd"). Backends: fused everywhere, unfused on the
-- small shape only. FLOPs: forward 4*b*h*s*s*d (halved when causal), backward 2.5x forward.
-- Timing: al.cuda.Event around N calls after warm-up. Host overhead: best of 3 x 1,000 forward calls of a tiny
-- cached fused attention from Lua, wall clock per call after a synchronize.
--
-- Results print as a table; with ATTNLAB_BENCH_OUT=/path they are also appended as JSON lines
-- (scripts/bench_compare.py reads them next to scripts/peer_torch_sdpa.py's). Without a usable GPU
-- the bench says so and exits 0 (make bench skips it cleanly).
-- Usage: luajit bench/attention_gpu_bench.lua [--quick]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"

if not al.cuda.available() then
  local _, why = al.cuda.available()
  print("attention_gpu_bench: skipped, no usable GPU" .. (why and (" (" .. tostring(why) .. ")") or ""))
  os.exit(0)
end

local quick = arg and arg[1] == "--quick"
local ITERS, WARMUP = quick and 3 or 10, quick and 1 or 3

local emit = al.results.bench_emit

local wall = al.clock

-- mean milliseconds of fn over ITERS calls after WARMUP calls, by CUDA events
local function gpu_time(fn) return al.cuda.time(fn, { warmup = WARMUP, iters = ITERS }) end

local info = al.cuda.device_info(0)
local cudnn = al.cuda.backend_info("fused")
print(string.format("attention_gpu_bench on %s (sm_%d%d), %s", info.name, info.capability[1], info.capability[2], cudnn))
emit({ kind = "env", device = info.name, cudnn = cudnn })

local SHAPES = { { 16, 16, 1024, 128 }, { 4, 16, 4096, 128 }, { 2, 16, 8192, 128 }, { 1, 16, 16384, 128 },
  { 4, 32, 4096, 64 }, { 4, 16, 4096, 256 } }
if quick then SHAPES = { { 16, 16, 1024, 128 }, { 4, 16, 4096, 128 } } end

print(string.format("%-20s %-7s %-8s %-8s %9s %9s %9s %9s  %s", "shape (b,h,s,d)", "mask", "layout", "backend",
  "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "note"))

al.manual_seed(1234)
for _, sh in ipairs(SHAPES) do
  local b, h, s, d = sh[1], sh[2], sh[3], sh[4]
  local opts = { dtype = "bf16", device = "cuda" }
  local qkv = al.randn({ b, s, 3, h, d }, opts)
  local q, k, v = al.randn({ b, s, h, d }, opts), al.randn({ b, s, h, d }, opts), al.randn({ b, s, h, d }, opts)
  local dout = al.randn({ b, s, h * d }, opts)
  local backends = { "fused" }
  if s <= 1024 then backends[#backends + 1] = "unfused" end
  for _, mask in ipairs({ "no_mask", "causal" }) do
    local flops = 4 * b * h * s * s * d * (mask == "causal" and 0.5 or 1)
    for _, layout in ipairs({ "separate", "bs3hd" }) do
      local args
      if layout == "separate" then
        args = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = mask }
      else
        args = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = mask }
      end
      for _, be in ipairs(backends) do
        args.backend = be
        local ok, err = pcall(function()
          local ctx
          local tf = gpu_time(function() ctx = select(2, al.attention.forward(args)) end)
          local tb = gpu_time(function() al.attention.backward(ctx, dout) end)
          local rec = { kind = "attention", b = b, h = h, s = s, d = d, mask = mask, layout = layout, backend = be,
            fwd_ms = tf, bwd_ms = tb, fwd_tflops = flops / (tf * 1e-3) / 1e12,
            bwd_tflops = 2.5 * flops / (tb * 1e-3) / 1e12 }
          print(string.format("%-20s %-7s %-8s %-8s %9.3f %9.1f %9.3f %9.1f", string.format("%d,%d,%d,%d", b, h, s, d),
            mask, layout, be, tf, rec.fwd_tflops, tb, rec.bwd_tflops))
          emit(rec)
        end)
        if not ok then
          local msg = tostring(err):gsub("\n", " "):sub(1, 160)
          print(string.format("%-20s %-7s %-8s %-8s %9s %9s %9s %9s  %s", string.format("%d,%d,%d,%d", b, h, s, d),
            mask, layout, be, "-", "-", "-", "-", msg))
          emit({ kind = "attention", b = b, h = h, s = s, d = d, mask = mask, layout = layout, backend = be, error = msg })
        end
        collectgarbage()
      end
    end
  end
  -- (the references dropped, so collectgarbage frees the tensors)
  qkv, q, k, v, dout = nil, nil, nil, nil, nil  -- luacheck: ignore 311
  collectgarbage()
  al.cuda.empty_cache()
end

-- host overhead: one cached fused forward of a tiny shape from Lua
do
  local opts = { dtype = "bf16", device = "cuda" }
  local qkv = al.randn({ 1, 64, 3, 2, 64 }, opts)
  local args = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal",
    backend = "fused" }
  local ok, err = pcall(function()
    for _ = 1, 50 do al.attention.forward(args) end
    al.cuda.synchronize()
    collectgarbage()
    -- best of 3 loops (as bench/host_overhead.lua, the instrument for this figure: one loop right after the
    -- large shapes read 35 us where host_overhead.lua reads 13 us, session 8)
    local n, host, total = 1000, math.huge, math.huge
    for _ = 1, 3 do
      collectgarbage()
      local t0 = wall()
      for _ = 1, n do al.attention.forward(args) end
      host = math.min(host, (wall() - t0) / n * 1e6)
      al.cuda.synchronize()
      total = math.min(total, (wall() - t0) / n * 1e6)
    end
    print(string.format("host overhead, fused forward (1,2,64,64) bs3hd causal, best of 3 x %d calls: %.2f us/call issued, " ..
      "%.2f us/call incl. sync", n, host, total))
    emit({ kind = "host_overhead", backend = "fused", us_per_call = host, us_per_call_synced = total, calls = n })
  end)
  if not ok then print("host overhead: fused failed: " .. tostring(err)) end
end
