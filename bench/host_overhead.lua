--[[
host_overhead.lua — where the host time of one attention call goes, phase by phase (issue 5's target:
one cached fused call from Lua <= 5 us; PyTorch's SDPA call measured 15-18.5 us).

  (a) front end   the Lua work before the C call: argument parsing, packed-input views, the params and
                  inputs structs (al.attention._prepare, the part of forward before al_attn_forward)
  (b) check       al_attn_check on those structs: C validation and plan building (no backend)
  (c) cpu call    a full al.attention.forward on the cpu backend at a tiny shape: (a) + (b) + backend
                  choice + output allocation + the (tiny) CPU kernel + the ctx; an upper bound of the
                  host path that every backend shares
  (d) gpu call    with a usable GPU: (a), (b) and the full cached call on cuda tensors for the fused
                  and flash backends (bf16, 1x64x2x64 bs3hd causal, as attention_gpu_bench.lua), wall
                  clock per call while issuing (the GPU queue absorbs the kernels) and including a
                  final synchronize; and the flash call with a soft-capping score_mod
  (v) variant     al.attention.variant{...}: the Lua work every score_mod / mask_mod call does before C
                  (trace; derivation and code generation are cached per traced form), soft-capping and
                  a document mask_mod
Each phase runs for N calls (default 10,000), best of 3 rounds, after a warm-up; the functional
call (al.attention.forward with one argument table reused, as a training loop does) and the module
call (al.DotProductAttention:forward) are both timed.

Run: ATTNLAB_LIBDIR=lib LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/host_overhead.lua [N]
With ATTNLAB_BENCH_OUT=/path the figures are also appended as JSON lines (kind = "host_phase").
With ATTNLAB_HOST_PROFILE=1 (or the older ATTNLAB_FUSED_PROFILE=1) the backends time their own stages
and the run ends with their means per call (al.cuda.backend_info): the fused forward's outputs, key, plan
lookup, aux + workspace, variant pack, cuDNN's execute, rest (of the binding), tail; the flash forward's begin, outputs,
params, tmaps (TMA descriptors), lookup (kernel function), launch, tail.
A floor for comparison: "one kernel" times t:fill_(x) on a 16-element cuda tensor, the cheapest Lua call
that launches one kernel.
]]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
local C = require("attnlab.ffi").C

local N = tonumber(arg and arg[1]) or 10000
local clock = al.clock

-- best of 3 rounds of N calls of fn(n) (fn runs its own loop: the loop is what gets compiled); returns
-- wall-clock and process-CPU (os.clock) microseconds per call: on a shared, loaded machine the CPU
-- time is the steadier figure (it excludes time spent waiting for a core)
local function time(fn, sync)
  fn(math.max(50, math.floor(N / 20)))
  if sync then sync() end
  collectgarbage()
  local best, best_cpu = math.huge, math.huge
  for _ = 1, 3 do
    local t0, c0 = clock(), os.clock()
    fn(N)
    if sync then sync() end
    local dt, dc = clock() - t0, os.clock() - c0
    if dt < best then best = dt end
    if dc < best_cpu then best_cpu = dc end
  end
  return best / N * 1e6, best_cpu / N * 1e6
end

local function row(device, phase, what, us, cpu_us)
  print(string.format("  %-5s %-14s %-44s %8.3f us/call wall %8.3f us/call cpu", device, phase, what, us, cpu_us))
  al.results.bench_emit({ kind = "host_phase", device = device, phase = phase, what = what, us_per_call = us,
    cpu_us_per_call = cpu_us, calls = N })
end

-- phases (a), (b) and the full call for one argument table; returns nothing (prints rows)
local function phases(device, label, args, module_cfg, sync)
  local prepare, forward = al.attention._prepare, al.attention.forward
  row(device, "(a) front end", label, time(function(n)
    for _ = 1, n do prepare(args) end
  end))
  local p, inp, refs = prepare(args)
  row(device, "(b) check", label, time(function(n)
    for _ = 1, n do C.al_attn_check(p, inp) end
  end))
  assert(refs)
  local ok, err = pcall(forward, args)
  if not ok then
    print(string.format("  %-5s %-14s %-44s %s", device, "full call", label, tostring(err):sub(1, 120)))
    return
  end
  row(device, "full call", label, time(function(n)
    for _ = 1, n do forward(args) end
  end, sync))
  if module_cfg then
    local dpa = al.DotProductAttention(module_cfg)
    local margs = {}
    for k, v in pairs(args) do
      if k ~= "qkv_format" and k ~= "attn_mask_type" and k ~= "backend" then margs[k] = v end
    end
    dpa:evaluate()
    row(device, "full call", "module  " .. label, time(function(n)
      for _ = 1, n do dpa:forward(margs) end
    end, sync))
  end
end

print(string.format("host_overhead: %d calls per round, best of 3 (wall clock, al.clock)", N))

-- CPU: the tiniest shapes; separate tensors and one packed buffer
do
  al.manual_seed(1)
  local b, s, h, d = 1, 4, 2, 8
  local q, k, v = al.randn({ b, s, h, d }), al.randn({ b, s, h, d }), al.randn({ b, s, h, d })
  local qkv = al.randn({ b, s, 3, h, d })
  local cfg = { num_attention_heads = h, kv_channels = d, qkv_format = "bshd", attn_mask_type = "causal", backend = "cpu" }
  phases("cpu", "bshd separate 1x4x2x8 causal",
    { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = "causal", backend = "cpu" }, cfg)
  phases("cpu", "bs3hd packed 1x4x2x8 causal",
    { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal", backend = "cpu" }, cfg)
end

-- variants: the Lua work of a score_mod / mask_mod call before C (every call traces its functions again; the
-- derivation and the generated code are cached per traced form, attnlab.variants.variant), for soft-capping and
-- a document mask; on the GPU below, the whole flash call with soft-capping
local softcap = function(score) return 30 * al.tanh(score / 30) end
do
  local docs = al.tensor({ 1, 1, 2, 2 }, { dtype = "i32" })
  local document = function(b, h, q, kv) return al.eq(docs[q], docs[kv]) end
  local variant = al.attention.variant
  for _, c in ipairs({ { "soft-capping (score_mod)", { score_mod = softcap } },
    { "document ids (mask_mod, one capture)", { mask_mod = document } } }) do
    local a = c[2]
    row("cpu", "(v) variant", c[1], time(function(n)
      for _ = 1, n do variant(a) end
    end))
  end
end

-- GPU: the cached fused and flash calls (and the CPU-side phases on cuda tensors)
if al.cuda and al.cuda.available() then
  local sync = function() al.cuda.synchronize() end
  local opts = { dtype = "bf16", device = "cuda" }
  local qkv = al.randn({ 1, 64, 3, 2, 64 }, opts)
  for _, be in ipairs({ "fused", "flash" }) do
    local args = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal", backend = be }
    local ok, err = pcall(al.attention.forward, args)
    if ok then
      phases("cuda", be .. " bs3hd 1x64x2x64 causal", args,
        { num_attention_heads = 2, kv_channels = 64, qkv_format = "bshd", attn_mask_type = "causal", backend = be }, sync)
      local forward = al.attention.forward
      row("cuda", "issue only", be .. " bs3hd 1x64x2x64 causal", time(function(n)
        for _ = 1, n do forward(args) end
      end))
    else
      print(string.format("  %-5s %-14s %-44s %s", "cuda", "full call", be, tostring(err):sub(1, 120)))
    end
  end
  do   -- a soft-capped flash call: the variant's Lua work, its C path (kernel lookup by the snippets' hash), the launch
    local args = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal",
      score_mod = softcap }
    local ok, err = pcall(al.attention.forward, args)
    if ok then
      local forward = al.attention.forward
      row("cuda", "full call", "flash soft-capping bs3hd 1x64x2x64 causal", time(function(n)
        for _ = 1, n do forward(args) end
      end, sync))
    else
      print(string.format("  %-5s %-14s %-44s %s", "cuda", "full call", "flash soft-capping", tostring(err):sub(1, 120)))
    end
  end
  local small = al.randn({ 16 }, { device = "cuda" })
  row("cuda", "one kernel", "t:fill_(x), 16 f32 elements (a floor)", time(function(n)
    for i = 1, n do small:fill_(i) end
  end))
  local function env_on(name) local e = os.getenv(name); return e and e ~= "" and e ~= "0" end
  if env_on("ATTNLAB_HOST_PROFILE") or env_on("ATTNLAB_FUSED_PROFILE") then
    for _, be in ipairs({ "fused", "flash" }) do
      for line in (al.cuda.backend_info(be) or ""):gmatch("[^\n]+") do
        if line:match("^host profile") then print(be .. ": " .. line) end
      end
    end
  end
else
  print("  (no usable GPU: phase (d), the cached fused/flash call, is skipped)")
end
