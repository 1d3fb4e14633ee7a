-- bench/fp8_attention.lua — FP8 fused attention (cuDNN's FP8 SDPA, src/cuda/attn_fused_fp8.cu) against
-- bf16 fused attention in the same run, TFLOP/s and the FP8 / bf16 ratio (target: FP8 forward >= 1.4x
-- the bf16 forward; cuDNN publishes ~1000 vs ~690 TFLOP/s on H200).
--
-- Shapes (b,h,s,d): (4,16,4096,128) (2,16,8192,128) (1,16,16384,128), bshd, no mask and causal.
-- Rows:
--   bf16      al.attention.forward / backward with bf16 q, k, v (fused backend)
--   fp8 call  the C call al_attn_forward / al_attn_backward on already-quantised FP8 q, k, v with a
--             DelayedScaling recipe's settings (its state on the device: al_attn_fp8.ds): the cuDNN graph
--             plus what the call's contract adds (the scalars computed from the device state by a one-block
--             kernel and the amaxes added to it by another, O dequantised to bf16; backward: O and dO
--             quantised, dQ/dK/dV dequantised)
--   fp8 out   the same C call with fp8_output (out_dtype = the FP8 format, TE's fp8_output): O stays in
--             FP8, no dequantisation pass
--   fp8 e2e   al.attention.forward / backward with a DelayedScaling fp8_recipe (adds the recipe: q/k/v
--             quantised with their amax measured on every call, the Lua bookkeeping); its state (amax
--             histories, scales) on the device, read and updated there (al_fp8_ds), so no call waits
--   e2e host  the same with device_scaling = false: the state on the host, so each step first waits for the
--             previous step's amaxes (the path before session 9)
-- FLOPs: forward 4*b*h*s*s*d (halved when causal), backward 2.5x forward. Timing: al.cuda.Event
-- around N calls (>= 10, covering ~30 ms) after warm-up; the rows of one shape and mask are measured in 3 interleaved rounds (rotating
-- order) and each shows its median, so that the FP8/bf16 ratios compare figures taken in the same minute. With ATTNLAB_BENCH_OUT=/path the rows are appended as JSON lines.
-- Without a usable GPU (or below sm_90) the bench says so and exits 0.
-- With ATTNLAB_HOST_PROFILE=1 the run ends with the FP8 forward's host stages per call (outputs, plan, exec,
-- readback = the amax copy that waits for the graph, dequant): where a call's time beyond its kernels goes.
-- Usage: luajit bench/fp8_attention.lua [--quick]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
local T = require "attnlab.tensor"
local C = require("attnlab.ffi").C

if not al.cuda.available() then
  local _, why = al.cuda.available()
  print("fp8_attention: skipped, no usable GPU" .. (why and (" (" .. tostring(why) .. ")") or ""))
  os.exit(0)
end
local info = al.cuda.device_info(0)
if info.capability[1] < 9 then
  print(string.format("fp8_attention: skipped, cuDNN's FP8 SDPA needs sm_90+, this is sm_%d%d", info.capability[1],
    info.capability[2]))
  os.exit(0)
end

local quick = arg and arg[1] == "--quick"
local ITERS, WARMUP = quick and 3 or 10, quick and 1 or 3
local ROUNDS = quick and 1 or 3   -- every row is the median over ROUNDS interleaved measurements
local emit = al.results.bench_emit

-- mean milliseconds of fn over at least ITERS calls after WARMUP calls, by CUDA events; the calls cover about
-- 30 ms (at 4x16x4096 ten calls took 3.5 ms, short enough for one collector pause or clock step to move a row by
-- 10%: session 9 run 1 read the causal fp8_output forward at 0.411 ms where back-to-back calls take 0.34 ms)
local function gpu_time(fn)
  local est = al.cuda.time(fn, { warmup = WARMUP, iters = 2 })
  local n = quick and ITERS or math.max(ITERS, math.min(200, math.ceil(30 / math.max(est, 1e-3))))
  return al.cuda.time(fn, { warmup = 0, iters = n })
end

local cudnn = al.cuda.backend_info("fused")
print(string.format("fp8_attention on %s (sm_%d%d), %s; >= %d iterations (about 30 ms) after %d warm-up", info.name, info.capability[1],
  info.capability[2], cudnn, ITERS, WARMUP))

local SHAPES = { { 4, 16, 4096, 128 }, { 2, 16, 8192, 128 }, { 1, 16, 16384, 128 } }
if quick then SHAPES = { { 4, 16, 4096, 128 } } end

print(string.format("%-18s %-7s %-9s %9s %9s %9s %9s  %s", "shape (b,h,s,d)", "mask", "path", "fwd ms", "fwd TF/s",
  "bwd ms", "bwd TF/s", "FP8/bf16 fwd, bwd"))

local function row(shape, mask, path, tf, tb, flops, base)
  if not tf then return nil end   -- (the path failed: said where it failed)
  local ftf = flops / (tf * 1e-3) / 1e12
  local btf = tb and 2.5 * flops / (tb * 1e-3) / 1e12 or nil
  local ratio = ""
  if base then
    ratio = string.format("%.2fx", ftf / base.f)
    if btf and base.b then ratio = ratio .. string.format(", %.2fx", btf / base.b) end
    if path == "fp8 call" or path == "fp8 out" then
      ratio = ratio .. (ftf / base.f >= 1.4 and "  (>= 1.4x target met)" or "  (below the 1.4x target)")
    end
  end
  print(string.format("%-18s %-7s %-9s %9.3f %9.1f %9s %9s  %s", shape, mask, path, tf, ftf, tb and string.format("%.3f", tb) or "-",
    btf and string.format("%.1f", btf) or "-", ratio))
  return { f = ftf, b = btf }
end

al.manual_seed(4321)
for _, sh in ipairs(SHAPES) do
  local b, h, s, d = sh[1], sh[2], sh[3], sh[4]
  local name = string.format("%d,%d,%d,%d", b, h, s, d)
  local opts = { dtype = "bf16", device = "cuda" }
  local q, k, v = al.randn({ b, s, h, d }, opts), al.randn({ b, s, h, d }, opts), al.randn({ b, s, h, d }, opts)
  local dout = al.randn({ b, s, h * d }, opts)
  for _, mask in ipairs({ "no_mask", "causal" }) do
    local flops = 4 * b * h * s * s * d * (mask == "causal" and 0.5 or 1)
    local args = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = mask,
      backend = "fused" }
    -- Every path's forward and backward become a timed item; the items then run ROUNDS times in a rotating
    -- order and each row reports its median: bench rows minutes apart drift with the GPU's clocks (power,
    -- temperature), so a ratio is only as good as the two figures are simultaneous.
    -- (hold keeps the FP8 inputs of the timed calls alive: written, never read)
    local items, order, hold = {}, {}, nil  -- luacheck: ignore 231
    local function item(key, fn) items[key] = { fn = fn, t = {} }; order[#order + 1] = key end
    local ok, err = pcall(function()
      local ctx
      item("bf16 f", function() local _; _, ctx = al.attention.forward(args) end)
      item("bf16 b", function() al.attention.backward(ctx, dout) end)
      items["bf16 f"].fn()
    end)
    if not ok then print(string.format("%-18s %-7s %-9s failed: %s", name, mask, "bf16", tostring(err):sub(1, 160))) end
    collectgarbage()

    -- FP8: one recipe step sets the scales and gives the FP8 inputs and the al_attn_fp8 settings
    local r = al.fp8.DelayedScaling{ amax_history_len = 16 }
    local a8, ah = {}, {}
    for kk, vv in pairs(args) do a8[kk] = vv; ah[kk] = vv end
    a8.fp8_recipe = r
    ah.fp8_recipe = al.fp8.DelayedScaling{ amax_history_len = 16, device_scaling = false }
    local ad = {}
    for kk, vv in pairs(args) do ad[kk] = vv end
    ad.fp8_recipe = al.fp8.DelayedScaling{ amax_history_len = 16 }
    ok, err = pcall(function()
      local _, ctx8 = al.attention.forward(a8)
      al.attention.backward(ctx8, dout)
      _, ctx8 = al.attention.forward(a8)      -- step 2: delayed scales from step 1's amaxes
      local p, inp = ctx8.params, ctx8.inputs
      hold = ctx8   -- p and inp are cdata: the FP8 inputs they point to live only as long as ctx8
      local last_out, last_lse
      local function call()
        local o, l = T.new(), T.new()
        T.check(C.al_attn_forward(p, inp, o.raw, l.raw, nil), "al_attn_forward")
        T.after_alloc()   -- as al.attention.forward does: the collector learns of the outputs (else the
        return o, l       -- dropped ones pile up on the device and the allocator keeps calling cudaMalloc)
      end
      item("call f", function() last_out, last_lse = call() end)
      -- the backward needs the d=128 (Hopper) FP8 graph; timed on the C call with the forward's out/lse
      local dq, dk, dv = al.empty({ b, s, h, d }, opts), al.empty({ b, s, h, d }, opts), al.empty({ b, s, h, d }, opts)
      local d4 = dout:view({ b, s, h, d })
      local function c_bwd()
        local db, dso = T.new(), T.new()
        T.check(C.al_attn_backward(p, inp, last_out.raw, d4.raw, last_lse.raw, dq.raw, dk.raw, dv.raw, db.raw, dso.raw),
          "al_attn_backward")
      end
      last_out, last_lse = call()
      local bok, berr = pcall(c_bwd)
      if bok then item("call b", c_bwd)
      else print("  fp8 backward failed: " .. tostring(berr):sub(1, 200)) end
      -- fp8_output (TE's): O handed back as its FP8 codes, no dequantisation pass
      local f = inp.fp8
      item("out f", function()
        local od = f.out_dtype
        f.out_dtype = r.fwd_format
        local st, e = pcall(call)
        f.out_dtype = od
        if not st then error(e, 0) end
      end)
      local ctxe, ctxh
      item("e2e f", function() local _; _, ctxe = al.attention.forward(ad) end)
      item("e2e b", function() al.attention.backward(ctxe, dout) end)
      item("e2eh f", function() local _; _, ctxh = al.attention.forward(ah) end)
      item("e2eh b", function() al.attention.backward(ctxh, dout) end)
    end)
    if ok then
      -- each item in its own pcall: one that fails (say the FP8 backward of an unsupported shape) says so and
      -- drops out; the others keep their rows
      local failed = {}
      for round = 1, ROUNDS do
        for i = 1, #order do   -- rotate the start so that no item always follows the same one
          local key = order[(i + round - 2) % #order + 1]
          local it = items[key]
          if not failed[key] then
            local iok, ierr = pcall(function()
              if key:sub(-2) == " b" then items[key:sub(1, -3) .. " f"].fn() end   -- a backward needs its own forward's ctx
              it.t[#it.t + 1] = gpu_time(it.fn)
            end)
            if not iok then
              failed[key] = true
              it.t = {}
              print(string.format("%-18s %-7s %-9s failed: %s", name, mask, key, tostring(ierr):gsub("\n", " "):sub(1, 200)))
            end
          end
        end
      end
      do
        local function med(key)
          local it = items[key]
          if not it or #it.t == 0 then return nil end
          local t = {}
          for i, x in ipairs(it.t) do t[i] = x end
          table.sort(t)
          return #t % 2 == 1 and t[(#t + 1) / 2] or 0.5 * (t[#t / 2] + t[#t / 2 + 1])
        end
        local base = row(name, mask, "bf16", med("bf16 f"), med("bf16 b"), flops)
        emit({ kind = "fp8_attention", path = "bf16", b = b, h = h, s = s, d = d, mask = mask, fwd_ms = med("bf16 f"), bwd_ms = med("bf16 b") })
        row(name, mask, "fp8 call", med("call f"), med("call b"), flops, base)
        emit({ kind = "fp8_attention", path = "fp8_call", b = b, h = h, s = s, d = d, mask = mask, fwd_ms = med("call f"),
          bwd_ms = med("call b") or -1 })
        row(name, mask, "fp8 out", med("out f"), nil, flops, base)
        emit({ kind = "fp8_attention", path = "fp8_output", b = b, h = h, s = s, d = d, mask = mask, fwd_ms = med("out f"), bwd_ms = -1 })
        row(name, mask, "fp8 e2e", med("e2e f"), med("e2e b"), flops, base)
        emit({ kind = "fp8_attention", path = "fp8_e2e", b = b, h = h, s = s, d = d, mask = mask, fwd_ms = med("e2e f"), bwd_ms = med("e2e b") })
        row(name, mask, "e2e host", med("e2eh f"), med("e2eh b"), flops, base)
        emit({ kind = "fp8_attention", path = "fp8_e2e_host_state", b = b, h = h, s = s, d = d, mask = mask, fwd_ms = med("e2eh f"),
          bwd_ms = med("e2eh b") })
      end
    end
    if not ok then print(string.format("%-18s %-7s %-9s failed: %s", name, mask, "fp8", tostring(err):gsub("\n", " "):sub(1, 200))) end
    collectgarbage()
    al.cuda.empty_cache()
  end
  -- (the references dropped, so collectgarbage frees the tensors)
  q, k, v, dout = nil, nil, nil, nil  -- luacheck: ignore 311
  collectgarbage()
  al.cuda.empty_cache()
end
local hp = os.getenv("ATTNLAB_HOST_PROFILE")
if hp and hp ~= "" and hp ~= "0" then
  for line in (al.cuda.backend_info("fused") or ""):gmatch("[^\n]+") do
    if line:match("^host profile") then print(line) end
  end
end
