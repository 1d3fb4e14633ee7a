-- bench/variants.lua — attention variants (score_mod / mask_mod, docs/VARIANTS.md) on the flash
-- backend, against the same kernels without hooks:
--   1. tanh soft-capping through score_mod vs no hook (issue target: <= 15 % slower)
--   2. causal through mask_mod + block mask vs built-in causal (target: within 10 %)
--   3. sliding window 1024 (mask_mod + block mask) at s = 16384 vs full attention (target: >= 5x faster)
-- (b, h, d) = (1..4, 16, 128), bf16, bshd, forward and backward. FLOPs as bench/flash_bench.lua:
-- forward 4*b*h*s*s*d (halved for causal, the window's kept fraction for sliding windows), backward
-- 2.5x forward; TFLOP/s of the variant are counted with the same FLOPs as its reference.
-- 4. compile cost: a fresh variant's first call (NVRTC compile, target <= 1 s) and the same variant in
--    a fresh process (disk-cached cubin load, target <= 10 ms), as first-call minus warm-call times.
-- Without a usable GPU it says so and exits 0 (what variants cost on the CPU: bench/variants_cpu.lua).
-- Usage: luajit bench/variants.lua [--quick] [--only N ...] [--experiments | --bwd-ab | --fwd-ab] [--rounds N]
--   (--experiments: section 1 also times the defaults' alternatives, two or three consumers or the split grid forced,
--   the sliced backward, the backward folded, the dK/dV kernel's dP^T early; --bwd-ab: section 1 times only the
--   backward's alternatives, for A/Bs of a few percent (with --rounds 9 or more); --fwd-ab: only the forward's (the
--   split grid with programmatic dependent launch, two or three consumers); --child-compile is the fresh-process
--   half of 4)
-- Each ratio compares configurations timed in interleaved rounds (median of 3 or --rounds N; 1 with --quick). With 4
-- rounds or more, section 1's rows add the forward's and backward's paired ratios: the median of the per-round ratios
-- to the reference, with their quartiles (a ratio near the 1.15 target read 1.13-1.17 from run to run in session 26).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
local clock = require("attnlab.progress").clock
io.stdout:setvbuf("line")   -- rows show as they come where the output goes to a file (a device call cut short)

local flags = {}
for _, a in ipairs(arg or {}) do flags[a] = true end

if not al.cuda.available() then
  local _, why = al.cuda.available()
  print("variants bench: skipped, no usable GPU" .. (why and (" (" .. tostring(why) .. ")") or ""))
  os.exit(0)
end

local function inputs(b, h, s, d)
  return { query_layer = al.randn({ b, s, h, d }, { dtype = "bf16", device = "cuda" }),
    key_layer = al.randn({ b, s, h, d }, { dtype = "bf16", device = "cuda" }),
    value_layer = al.randn({ b, s, h, d }, { dtype = "bf16", device = "cuda" }),
    qkv_format = "bshd", backend = "flash" }
end
local function with(a, extra)
  local t = {}
  for k, v in pairs(a) do t[k] = v end
  for k, v in pairs(extra) do t[k] = v end
  return t
end

-- first-call and warm-call time of one forward (host clock, synchronised)
local function call_times(args)
  al.cuda.synchronize()
  local t0 = clock()
  al.attention.forward(args)
  al.cuda.synchronize()
  local first = clock() - t0
  t0 = clock()
  al.attention.forward(args)
  al.cuda.synchronize()
  return first, clock() - t0
end

-- a variant no earlier run compiled: its constant differs per run (cache keys hash the source)
local function fresh_softcap(tag)
  local cap = 20 + (tag % 100000) / 1e5
  return function(score) return cap * al.tanh(score / cap) end
end

if flags["--child-compile"] then
  -- the fresh-process half of the compile test: the parent compiled this variant already
  local tag = tonumber(os.getenv("ATTNLAB_VARIANT_TAG"))
  local a = with(inputs(1, 16, 1024, 128), { attn_mask_type = "no_mask", score_mod = fresh_softcap(tag) })
  al.attention.forward(with(a, { score_mod = nil }))   -- the plain kernel, so only the variant's load is timed
  local first, warm = call_times(a)
  print(string.format("CHILD %.6f %.6f", first, warm))
  os.exit(0)
end

local quick = flags["--quick"]
-- --only N (a section number, repeatable as --only 1 --only 2): run just those sections
local only = {}
for i, a in ipairs(arg or {}) do if a == "--only" and arg[i + 1] then only[tonumber(arg[i + 1])] = true end end
local function section(n) return next(only) == nil or only[n] == true end
local ITERS, WARMUP = quick and 3 or 10, quick and 1 or 3
local dev = al.cuda.device_info(0)
print(string.format("variants bench on %s (sm_%d%d, %d SMs)", dev.name, dev.capability[1], dev.capability[2],
  dev.multiprocessors))

-- The Hopper forward's wave model (src/cuda/flash_sm90_specs.h: al_flash_sm90_c3_pays / c3_rows), printed beside
-- section 1's rows so that they can be read against it: a wave of 128-row blocks (two consumers) costs 128, of
-- 192-row blocks (three) 192 x 0.94, a partly filled wave a whole one. Returns the three costs and the split's r3.
local function wave_model(sq, hb, sms)
  local function waves(blocks) return math.ceil(blocks / sms) end
  local c2, c3 = waves(math.ceil(sq / 128) * hb) * 128, waves(math.ceil(sq / 192) * hb) * 192 * 0.94
  local best, r3 = math.min(c2, c3), c3 < c2 and sq or 0
  for k = 1, math.ceil(sq / 192) - 1 do
    local cost = waves(k * hb) * 192 * 0.94 + waves(math.ceil((sq - 192 * k) / 128) * hb) * 128
    if cost < best then best, r3 = cost, 192 * k end
  end
  return c2, c3, best, r3
end

-- mean milliseconds of fn by CUDA events, over at least ITERS calls and ~30 ms (10 calls of a 0.2 ms
-- forward were 2 ms: host-side noise showed in the ratios), after WARMUP calls
local function gpu_time(fn)
  local est = al.cuda.time(fn, { warmup = WARMUP, iters = 2 })
  local iters = math.max(ITERS, math.ceil((quick and 10 or 30) / math.max(est, 1e-3)))
  return al.cuda.time(fn, { warmup = 1, iters = iters })
end

-- configurations timed under environment variables (A/B switches the C library reads per call):
-- ENV[config] = { name, value [, name2, value2 ...] }, set around the configuration's calls only
local ffi = require "ffi"
pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
local ENV = setmetatable({}, { __mode = "k" })
local function under_env(a, fn)
  local e = ENV[a]
  if not e then return fn() end
  for i = 1, #e, 2 do ffi.C.setenv(e[i], e[i + 1], 1) end
  local ok, r1, r2 = pcall(fn)
  for i = 1, #e, 2 do ffi.C.unsetenv(e[i]) end
  if not ok then error(r1, 0) end
  return r1, r2
end

-- forward ms and backward ms of one configuration, one round. The backward is timed by itself on one forward's ctx
-- (as bench/flash_bench.lua does): until session 24 it was forward+backward minus forward, two timings' noise in one
-- figure (rows running the same backward read 1.13-1.22x at 3 rounds on an H100)
local function measure_once(a, dout)
  return under_env(a, function()
    local tf = gpu_time(function() al.attention.forward(a) end)
    local _, c = al.attention.forward(a)
    local tb = gpu_time(function() al.attention.backward(c, dout) end)
    return tf, tb
  end)
end

local median = al.results.median

-- the ratio of two configurations round by round (each round times both within seconds of each other, so the GPU's
-- clock drift between rounds cancels), as { median, first quartile, third quartile }: the spread that says whether
-- a ratio of medians near a target is on one side of it (session 26: a configuration's ratio moved 2-3% between runs)
local function paired(xs, refs)
  local r = {}
  for k = 1, #xs do r[k] = xs[k] / refs[k] end
  table.sort(r)
  local function at(q) return r[math.max(1, math.min(#r, math.floor(q * (#r - 1) + 1.5)))] end
  return { median(r), at(0.25), at(0.75) }
end

-- forward and backward ms of each configuration, measured in interleaved rounds (ABC, CBA, ABC: the GPU's
-- clocks follow its power and temperature history, so configurations timed minutes apart drift apart),
-- each the median of its rounds. Returns { {fwd, bwd}, ... } in the order given.
local ROUNDS = quick and 1 or 3
for i, a in ipairs(arg or {}) do if a == "--rounds" and tonumber(arg[i + 1]) then ROUNDS = tonumber(arg[i + 1]) end end
local function measure(...)
  local configs, douts = { ... }, {}
  for i, a in ipairs(configs) do   -- one call each first: compiles what the configuration runs
    under_env(a, function()
      local out, ctx = al.attention.forward(a)
      douts[i] = al.randn(out:size(), { dtype = "bf16", device = "cuda" })
      al.attention.backward(ctx, douts[i])
    end)
  end
  local f, bw = {}, {}
  for i = 1, #configs do f[i], bw[i] = {}, {} end
  for r = 1, ROUNDS do
    for k = 1, #configs do
      local i = r % 2 == 1 and k or #configs + 1 - k
      f[i][r], bw[i][r] = measure_once(configs[i], douts[i])
    end
  end
  local res = {}
  for i = 1, #configs do
    res[i] = { median(f[i]), median(bw[i]) }
    if ROUNDS >= 4 and i > 1 then res[i].paired = { paired(f[i], f[1]), paired(bw[i], bw[1]) } end
  end
  return res
end

-- one row; with p (measure's paired ratios, 4 or more rounds) the forward's and backward's paired ratios and their
-- quartiles follow
local function row(name, b, s, flops, tf, tb, rf, rb, p)
  local extra = p and string.format("  paired fwd x%.3f (%.3f-%.3f) bwd x%.3f (%.3f-%.3f)", p[1][1], p[1][2], p[1][3],
    p[2][1], p[2][2], p[2][3]) or ""
  print(string.format("  %-34s b=%d s=%-6d fwd %8.3f ms %7.1f TF/s  bwd %8.3f ms %7.1f TF/s   vs ref: fwd x%.3f bwd x%.3f%s",
    name, b, s, tf, flops / (tf * 1e-3) / 1e12, tb, 2.5 * flops / (tb * 1e-3) / 1e12, tf / rf, tb / rb, extra))
end

local H, D = 16, 128
local BATCHES = quick and { 1 } or { 1, 2, 4 }

if section(1) then
  print("== 1. soft-capping via score_mod vs the same flash kernel without a hook (target <= 1.15)")
  for _, b in ipairs(BATCHES) do
    local s = 4096
    local a = with(inputs(b, H, s, D), { attn_mask_type = "no_mask" })
    local flops = 4 * b * H * s * s * D
    local c2, c3, best, r3 = wave_model(s, b * H, dev.multiprocessors)
    -- the host's policy (al_flash_sm90_split_rows): three throughout where they pay, else the split where it pays
    local default = c3 < c2 and "three" or (r3 > 0 and r3 < s) and ("split at " .. r3) or "two"
    print(string.format("  wave model, b=%d: two consumers %.0f, three %.0f (%.3fx), split at %d rows %.0f (%.3fx); " ..
      "soft-capping's default: %s", b, c2, c3, c3 / c2, r3, best, best / c2, default))
    local sc = function(score) return 30 * al.tanh(score / 30) end
    -- the third: the same variant with a running softmax max (its logits' bound [-30, 30] otherwise gives the
    -- forward a fixed one, kernels/flash_fwd_sm90.cu's AL_FL_FIXED_MAX)
    local running = with(a, { score_mod = sc })
    ENV[running] = { "ATTNLAB_FLASH_SM90_FIXED_MAX", "0" }
    local configs, names = { a, with(a, { score_mod = sc }), running },
      { "plain (reference)", "softcap 30 (score_mod)", "softcap 30, running max" }
    -- extra rows: { score_mod (nil: the plain kernel), ENV pairs, name }
    local VD, FG = "ATTNLAB_VARIANT_DEFINES", "ATTNLAB_VARIANT_FOLD_GRAD"
    local C2, C3 = { "ATTNLAB_FLASH_SM90_CONSUMERS", "2" }, { "ATTNLAB_FLASH_SM90_CONSUMERS", "3" }
    local extra = {}
    if flags["--fwd-ab"] then
      -- the forward's alternatives only: the split grid's second launch beside the first's end (programmatic
      -- dependent launch, ATTNLAB_FLASH_SM90_FWD_PDL=1, opt-in since session 27; it changes split grids only, the
      -- default at b = 1 and 2 here), and the split forced with it where three consumers throughout are the default
      -- (b = 4); two or three consumers throughout
      configs, names = { a, with(a, { score_mod = sc }) }, { "plain (reference)", "softcap 30 (score_mod)" }
      local PDL = "ATTNLAB_FLASH_SM90_FWD_PDL"
      extra = { { sc, { PDL, "1" }, "softcap 30, split + PDL" },
        { sc, { "ATTNLAB_FLASH_SM90_CONSUMERS", "split", PDL, "1" }, "softcap 30, split forced + PDL" },
        { sc, C2, "softcap 30, fwd two consumers" },
        { sc, C3, "softcap 30, fwd three consumers" } }
    elseif flags["--bwd-ab"] then
      -- the backward's alternatives only (the variant's kernels; the plain reference stays the default build)
      configs, names = { a, with(a, { score_mod = sc }) }, { "plain (reference)", "softcap 30 (score_mod)" }
      -- (the dQ kernel's ping-pong, opt-in; the dK/dV kernel's order before session 28 (mode 0; mode 2, one element
      -- pass, is the default since); mode 2 with the dQ one pass; mode 3, FA3's order, was slower than mode 2 at every
      -- b and is not timed here)
      extra = { { sc, { VD, "AL_SM90_BWD_PINGPONG=1" }, "softcap 30, dQ ping-pong" },
        { sc, { FG, "0" }, "softcap 30, bwd logit unfolded" },
        { sc, { VD, "AL_SM90_BWD_EARLY_DP=0" }, "softcap 30, bwd mode 0 (old order)" },
        { sc, { VD, "AL_SM90_BWD_DQ_ONE_PASS=1 AL_SM90_BWD_CONSUMER_REGS=232" },
          "softcap 30, + dQ one pass, 232" } }
    elseif flags["--experiments"] then
      -- the defaults' alternatives: the forward's two or three consumers forced or its grid split where the host
      -- would not (src/cuda/flash_sm90_specs.h: two at b = 1 and 2 here on 132 SMs would be the split's, three at
      -- b = 4 the default), the plain kernel with three, the sliced backward (the lean one is the default), the
      -- backward's logit and gradient unfolded (ATTNLAB_VARIANT_FOLD_GRAD=0; folded is the default), the dK/dV
      -- kernel's dP^T issued beside S^T (AL_SM90_BWD_EARLY_DP=1: under step 2; =3: FA3's order, session 24; =0:
      -- after step 2, the order before session 28; 2, one element-wise pass, is the default). Session 22's build
      -- switches (the tanh or the exponentials partly on the FMA pipe, the c2 forward without ping-pong or S/O
      -- overlap) all measured slower on the H200 in session 23 (docs/PERFORMANCE.md) and are no longer timed here.
      extra = { { sc, C2, "softcap 30, fwd two consumers" },
        { sc, C3, "softcap 30, fwd three consumers" },
        { sc, { "ATTNLAB_FLASH_SM90_CONSUMERS", "split" }, "softcap 30, fwd split grid forced" },
        { nil, C3, "plain, fwd three consumers" },
        { sc, { VD, "AL_SM90_LEAN_MOD=0" }, "softcap 30, sliced backward" },
        { sc, { FG, "0" }, "softcap 30, bwd logit unfolded" },
        { sc, { VD, "AL_SM90_BWD_EARLY_DP=1" }, "softcap 30, bwd dP^T under P" },
        { sc, { VD, "AL_SM90_BWD_EARLY_DP=0" }, "softcap 30, bwd mode 0 (old order)" },
        { sc, { VD, "AL_SM90_BWD_EARLY_DP=3" }, "softcap 30, bwd FA3 order" } }
    end
    for _, x in ipairs(extra) do
      local c = with(a, { score_mod = x[1] })
      ENV[c] = x[2]
      configs[#configs + 1], names[#names + 1] = c, x[3]
    end
    local m = measure(unpack(configs))
    local rf, rb = m[1][1], m[1][2]
    for i, name in ipairs(names) do row(name, b, s, flops, m[i][1], m[i][2], rf, rb, m[i].paired) end
  end
end

if section(2) then
  print("== 2. causal via mask_mod + block mask vs built-in causal (target <= 1.10)")
  local causal = function(_, _, q_idx, kv_idx) return al.ge(q_idx, kv_idx) end
  for _, b in ipairs(BATCHES) do
    local s = 8192
    local a = inputs(b, H, s, D)
    local flops = 2 * b * H * s * s * D
    local bm = al.attention.block_mask(causal, 1, 1, s, s, { block = 128 })
    local m = measure(with(a, { attn_mask_type = "causal" }),
      with(a, { attn_mask_type = "no_mask", mask_mod = causal, block_mask = bm }),
      with(a, { attn_mask_type = "no_mask", mask_mod = causal }))
    local rf, rb = m[1][1], m[1][2]
    row("built-in causal (reference)", b, s, flops, rf, rb, rf, rb)
    row("mask_mod causal + block mask", b, s, flops, m[2][1], m[2][2], rf, rb)
    row("mask_mod causal, no block mask", b, s, flops, m[3][1], m[3][2], rf, rb)
  end
end

if section(3) then
  print("== 3. sliding window 1024 at s = 16384 vs full attention (target: speed-up >= 5)")
  for _, b in ipairs(quick and { 1 } or { 1, 2 }) do
    local s, W = 16384, 1024
    local a = with(inputs(b, H, s, D), { attn_mask_type = "no_mask" })
    local flops = 4 * b * H * s * s * D
    local win = function(_, _, q_idx, kv_idx) return al.land(al.ge(q_idx, kv_idx), al.le(q_idx - kv_idx, W)) end
    local t0 = clock()
    local bm = al.attention.block_mask(win, 1, 1, s, s, { block = 128 })
    local tbm = clock() - t0
    local m = measure(a, with(a, { mask_mod = win, block_mask = bm }))
    local rf, rb, tf, tb = m[1][1], m[1][2], m[2][1], m[2][2]
    row("full attention (reference)", b, s, flops, rf, rb, rf, rb)
    row("sliding window 1024 + block mask", b, s, flops, tf, tb, rf, rb)
    print(string.format("  speed-up fwd %.2fx bwd %.2fx; %s; block_mask built in %.0f ms",
      rf / tf, rb / tb, tostring(bm), tbm * 1000))
  end
end

if section(4) then
  print("== 4. compile cost of a new variant (targets: NVRTC compile <= 1 s, cached load <= 10 ms)")
  do
    local tag = math.floor((os.time() % 100000) + clock() * 1000) % 100000
    local a = with(inputs(1, 16, 1024, 128), { attn_mask_type = "no_mask" })
    al.attention.forward(a)
    local first, warm = call_times(with(a, { score_mod = fresh_softcap(tag) }))
    print(string.format("  this process: first call %.1f ms, warm call %.2f ms -> compile ~%.1f ms", first * 1000,
      warm * 1000, (first - warm) * 1000))
    local exe = arg and arg[-1] or "luajit"
    local p = io.popen("ATTNLAB_VARIANT_TAG=" .. tag .. " " .. exe .. " bench/variants.lua --child-compile 2>&1")
    local outp = p:read("*a")
    p:close()
    local f2, w2 = outp:match("CHILD ([%d%.]+) ([%d%.]+)")
    if f2 then
      f2, w2 = tonumber(f2), tonumber(w2)
      print(string.format("  fresh process: first call %.2f ms, warm call %.2f ms -> cached load ~%.2f ms", f2 * 1000,
        w2 * 1000, (f2 - w2) * 1000))
    else
      print("  fresh process: no result: " .. outp)
    end
  end
end
