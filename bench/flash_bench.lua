-- bench/flash_bench.lua — the flash backend's stand-alone harness (llm.c dev/cuda style): first checks
-- it against the CPU oracle (small shapes) and against the unfused GPU reference (medium shapes), for
-- output, lse and gradients; then times forward and backward with al.cuda.Event over a sweep (the
-- median of 5 rounds per shape and mask, the separate and bs3hd layouts in turn within a round).
--
-- Sweep (b,h,s,d): (4,16,4096,128) (2,16,8192,128) (1,16,16384,128) (4,32,4096,64) (4,16,4096,256),
-- bf16, causal and not, separate bshd tensors ("separate") and one packed [b,s,3,h,d] buffer declared
-- as qkv_layer ("bs3hd"). FLOPs: forward 4*b*h*s*s*d (halved when causal), backward 2.5x forward.
-- The first call of each specialisation compiles it with NVRTC (or loads it from the disk cache):
-- the harness reports that cost separately (al_flash_info) and times only warm calls.
-- Without a usable GPU it says so and exits 0.
-- Usage: luajit bench/flash_bench.lua [--quick] [--check-only] [--deterministic] [--shape=b,h,s,d]
--   --shape times that one shape (full iterations; --quick: 4,16,4096,128 with fewer), after the checks.
--   ATTNLAB_BENCH_OUT=/path appends JSON lines like bench/attention_gpu_bench.lua.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
io.stdout:setvbuf("line")   -- lines reach a log file as they come (a device call cut short keeps them)

-- arguments first, so that a mistyped one is an error with or without a GPU
local function usage_error(msg)
  io.stderr:write("flash_bench: " .. msg .. "\nusage: luajit bench/flash_bench.lua [--quick] [--check-only] " ..
    "[--deterministic] [--shape=b,h,s,d]\n")
  os.exit(2)
end
local flags, only_shape = {}, nil
local KNOWN = { ["--quick"] = true, ["--check-only"] = true, ["--deterministic"] = true }
for _, a in ipairs(arg or {}) do
  local sh = a:match("^%-%-shape=(.*)$")
  if sh then
    only_shape = {}
    for n in (sh .. ","):gmatch("([^,]*),") do
      if not n:match("^%d+$") or tonumber(n) < 1 then usage_error("--shape expects b,h,s,d (four positive integers), got " .. sh) end
      only_shape[#only_shape + 1] = tonumber(n)
    end
    if #only_shape ~= 4 then usage_error("--shape expects b,h,s,d (four positive integers), got " .. sh) end
  elseif KNOWN[a] then
    flags[a] = true
  else
    usage_error("unknown argument " .. a)
  end
end

if not al.cuda.available() then
  local _, why = al.cuda.available()
  print("flash_bench: skipped, no usable GPU" .. (why and (" (" .. tostring(why) .. ")") or ""))
  os.exit(0)
end

local quick = flags["--quick"]
local ITERS, WARMUP = quick and 3 or 10, quick and 1 or 3

local emit = al.results.bench_emit

local function info_fn() return (al.cuda.backend_info("flash")) end

local dev = al.cuda.device_info(0)
print(string.format("flash_bench on %s (sm_%d%d)", dev.name, dev.capability[1], dev.capability[2]))

---------------------------------------------------------------------------------------------------
-- correctness: flash vs cpu (small) and vs unfused (medium)
---------------------------------------------------------------------------------------------------
local TOL = { f16 = 1e-3, bf16 = 1.5e-2 }
-- f16 gradients: P and dS are rounded to f16 inside the kernel (not in the f32 oracle), ~10 ulps at 0.25
local GRAD_TOL = { f16 = 2.5e-3, bf16 = 1.5e-2 }

local function worst(got, want, tol)
  local g, w = got:to("cpu"):to("f64"):flat_values(), want:to("cpu"):to("f64"):flat_values()
  local bad, maxd = 0, 0
  for i = 1, #w do
    if w[i] == -math.huge then
      if g[i] ~= -math.huge then bad = bad + 1 end
    else
      local d = math.abs(g[i] - w[i])
      if not (d <= tol + tol * math.abs(w[i])) then bad = bad + 1 end
      if d > maxd or d ~= d then maxd = d end
    end
  end
  return bad, maxd
end

local failures = 0
local function check(name, ref_backend, dt, build)
  al.manual_seed(7)
  local ra = build(ref_backend == "cpu" and "cpu" or "cuda", dt)
  al.manual_seed(7)
  local fa = build("cuda", dt)
  ra.backend, fa.backend = ref_backend, "flash"
  local _, chosen = al.attention.explain(fa)
  if chosen ~= "flash" then
    print(string.format("  %-46s %-5s vs %-7s FAIL: flash declined:\n%s", name, dt, ref_backend, al.attention.explain(fa)))
    failures = failures + 1
    return
  end
  local ro, rctx = al.attention.forward(ra)
  local fo, fctx = al.attention.forward(fa)
  al.manual_seed(8)
  local rd = al.randn(ro:size(), { dtype = dt, device = ref_backend == "cpu" and "cpu" or "cuda" })
  al.manual_seed(8)
  local fd = al.randn(fo:size(), { dtype = dt, device = "cuda" })
  local rg, fg = al.attention.backward(rctx, rd), al.attention.backward(fctx, fd)
  local tol = TOL[dt]
  local msgs, bad_total = {}, 0
  local function cmp(what, g, w, t)
    local bad, maxd = worst(g, w, t)
    bad_total = bad_total + bad
    msgs[#msgs + 1] = string.format("%s %.2g%s", what, maxd, bad > 0 and string.format(" (%d bad)", bad) or "")
  end
  cmp("out", fo, ro, tol)
  cmp("lse", fctx.lse, rctx.lse, 1e-4)
  for k, w in pairs(rg) do cmp("d" .. k:gsub("_layer", ""), fg[k], w, GRAD_TOL[dt]) end
  if bad_total > 0 then failures = failures + 1 end
  print(string.format("  %-46s %-5s vs %-7s %s  max|diff|: %s", name, dt, ref_backend, bad_total > 0 and "FAIL" or "ok  ",
    table.concat(msgs, ", ")))
end

local function sep(b, sq, skv, h, hg, d, mask, fmt)
  return function(devn, dt)
    local o = { dtype = dt, device = devn }
    local function s(x, y) return fmt == "sbhd" and { x, b, y, d } or { b, x, y, d } end
    return { query_layer = al.randn(s(sq, h), o), key_layer = al.randn(s(skv, hg), o), value_layer = al.randn(s(skv, hg), o),
      qkv_format = fmt or "bshd", attn_mask_type = mask }
  end
end

print("correctness (atol = rtol: f16 1e-3 outputs / 2.5e-3 gradients, bf16 1.5e-2; lse 1e-4)")
for _, dt in ipairs({ "bf16", "f16" }) do
  for _, d in ipairs({ 64, 128, 256 }) do
    check(string.format("b2 h4 hg2 s77 d%d causal bshd", d), "cpu", dt, sep(2, 77, 77, 4, 2, d, "causal"))
  end
  check("b2 h4 hg1 sq200 skv77 d128 causal_bottom_right", "cpu", dt, sep(2, 200, 77, 4, 1, 128, "causal_bottom_right"))
  check("b1 h4 hg4 s300 d64 no_mask sbhd", "cpu", dt, sep(1, 300, 300, 4, 4, 64, "no_mask", "sbhd"))
  check("packed bs3hd b2 h4 s200 d128 causal", "cpu", dt, function(devn, t)
    return { qkv_layer = al.randn({ 2, 200, 3, 4, 128 }, { dtype = t, device = devn }), qkv_interleave_dim = -3,
      qkv_format = "bshd", attn_mask_type = "causal" }
  end)
  check("b2 h8 hg2 s1000 d128 causal", "unfused", dt, sep(2, 1000, 1000, 8, 2, 128, "causal"))
  check("b1 h8 hg8 s2000 d64 no_mask", "unfused", dt, sep(1, 2000, 2000, 8, 8, 64, "no_mask"))
  check("b1 h4 hg4 s1000 d256 causal", "unfused", dt, sep(1, 1000, 1000, 4, 4, 256, "causal"))
end
if failures > 0 then print(string.format("flash_bench: %d correctness check(s) FAILED", failures)) end
if flags["--check-only"] then
  print(info_fn())
  os.exit(failures > 0 and 1 or 0)
end

---------------------------------------------------------------------------------------------------
-- timing
---------------------------------------------------------------------------------------------------
-- mean milliseconds of fn over ITERS calls after WARMUP calls, by CUDA events
local function gpu_time(fn) return al.cuda.time(fn, { warmup = WARMUP, iters = ITERS }) end
-- Each (shape, mask) is timed ROUNDS times, the two layouts in turn within a round, and the median reported:
-- single measurements of a 0.5 ms forward scattered by 10-15% between runs on the H200 (session 13), and
-- interleaving keeps a drift of the clocks out of the packed / separate ratio.
local ROUNDS = quick and 1 or 5
local median = al.results.median

local SHAPES = { { 4, 16, 4096, 128 }, { 2, 16, 8192, 128 }, { 1, 16, 16384, 128 }, { 4, 32, 4096, 64 }, { 4, 16, 4096, 256 } }
if quick then SHAPES = { { 4, 16, 4096, 128 } } end
if only_shape then SHAPES = { only_shape } end
local det = flags["--deterministic"]
print(string.format("\ntiming (bf16, median of %d rounds of %d iterations after %d warm-up calls%s)", ROUNDS, ITERS, WARMUP,
  det and ", deterministic backward" or ""))
print(string.format("%-20s %-8s %-9s %9s %9s %9s %9s  %s", "shape (b,h,s,d)", "mask", "layout", "fwd ms", "fwd TF/s",
  "bwd ms", "bwd TF/s", "note"))
al.manual_seed(1234)
local LAYOUTS = { "separate", "bs3hd" }
for _, sh in ipairs(SHAPES) do
  local b, h, s, d = sh[1], sh[2], sh[3], sh[4]
  local o = { dtype = "bf16", device = "cuda" }
  local qkv = al.randn({ b, s, 3, h, d }, o)
  local q, k, v = al.randn({ b, s, h, d }, o), al.randn({ b, s, h, d }, o), al.randn({ b, s, h, d }, o)
  local dout = al.randn({ b, s, h * d }, o)
  local tag = string.format("%d,%d,%d,%d", b, h, s, d)
  for _, mask in ipairs({ "no_mask", "causal" }) do
    local flops = 4 * b * h * s * s * d * (mask == "causal" and 0.5 or 1)
    local tf, tb, err = {}, {}, {}
    for _, layout in ipairs(LAYOUTS) do tf[layout], tb[layout] = {}, {} end
    for _ = 1, ROUNDS do
      for _, layout in ipairs(LAYOUTS) do
        if not err[layout] then
          local args = layout == "separate"
            and { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = mask }
            or { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = mask }
          args.backend, args.deterministic = "flash", det
          local ok, e = pcall(function()
            local ctx
            tf[layout][#tf[layout] + 1] = gpu_time(function() ctx = select(2, al.attention.forward(args)) end)
            tb[layout][#tb[layout] + 1] = gpu_time(function() al.attention.backward(ctx, dout) end)
          end)
          if not ok then err[layout] = e end
          collectgarbage()
        end
      end
    end
    for _, layout in ipairs(LAYOUTS) do
      if err[layout] then
        print(string.format("%-20s %-8s %-9s %9s %9s %9s %9s  %s", tag, mask, layout, "-", "-", "-", "-",
          tostring(err[layout]):gsub("\n", " "):sub(1, 200)))
      else
        local f, bw = median(tf[layout]), median(tb[layout])
        local rec = { kind = "attention", backend = "flash", b = b, h = h, s = s, d = d, mask = mask, layout = layout,
          fwd_ms = f, bwd_ms = bw, fwd_tflops = flops / (f * 1e-3) / 1e12, bwd_tflops = 2.5 * flops / (bw * 1e-3) / 1e12 }
        print(string.format("%-20s %-8s %-9s %9.3f %9.1f %9.3f %9.1f", tag, mask, layout, f, rec.fwd_tflops, bw,
          rec.bwd_tflops))
        emit(rec)
      end
    end
  end
  -- (the references dropped, so collectgarbage frees the tensors)
  qkv, q, k, v, dout = nil, nil, nil, nil, nil  -- luacheck: ignore 311
  collectgarbage()
  al.cuda.empty_cache()
end
print("\nNVRTC / cache: " .. info_fn())
os.exit(failures > 0 and 1 or 0)
