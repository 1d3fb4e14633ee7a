-- scripts/flash_ab.lua — A/B of two versions of the flash kernels (a kernel edit, a -D default
-- flipped), one process per kernel folder, on a GPU:
--   for k in /tmp/k_a /tmp/k_b; do ATTNLAB_KERNEL_DIR=$k luajit scripts/flash_ab.lua > $k.log; done
--   diff <(grep '^C ' /tmp/k_a.log) <(grep '^C ' /tmp/k_b.log)     # empty: bit-identical results
--   grep '^T ' /tmp/k_*.log                                         # times
-- "C" lines: a 32-bit multiply-add hash of the exact f32 bits of the output and of dq, dk, dv (the backward
-- of a fixed random gradient), and the output's absolute sum, for small cases: one tile, several tiles with a
-- partial last one, d = 64 / 128 / 256, no mask and causal, with and without a tanh soft-capping score_mod,
-- and where fast and slow paths of a tile divide: GQA with sliding windows (both corners), thd with padded
-- gaps, a document mask_mod. A schedule-only change must leave them identical. "T" lines: best-of-5 mean time
-- of the forward and of the backward (10 calls each, host clock around a synchronise) at b = 2, s = 4096,
-- h = 16, d = 128, bf16, plain and soft-capped, no mask and causal, with TFLOP/s (forward 4 b h s^2 d,
-- halved for causal; backward 2.5x that).
-- PROBE_CPU=1 runs the checksum half on the CPU backend (a dry run of the script without a GPU).
-- Kernel folders are read at run time (src/cuda/nvrtc_cache.cu): run it from the repository root after
-- `make`; XDG_CACHE_HOME at a fresh folder keeps the two runs' compile caches apart from older ones.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
io.stdout:setvbuf("line")   -- lines reach a log file as they come (a device call cut short keeps them)
local ffi = require "ffi"
local clock = require("attnlab.progress").clock
local dev = os.getenv("PROBE_CPU") and "cpu" or "cuda"
local back = dev == "cpu" and "cpu" or "flash"
local softcap = function(score) return 30 * al.tanh(score / 30) end

local function rnd(shape) return al.randn(shape, { dtype = "bf16", device = dev }) end
local function i32(list) return al.tensor(list, { dtype = "i32" }):to(dev) end
local function inputs(b, s, h, d, seed)
  al.manual_seed(seed)
  return { query_layer = rnd({ b, s, h, d }), key_layer = rnd({ b, s, h, d }), value_layer = rnd({ b, s, h, d }),
    qkv_format = "bshd", backend = back }
end
local function with(a, e) local t = {} for k, v in pairs(a) do t[k] = v end for k, v in pairs(e) do t[k] = v end return t end

local u = ffi.new("union { float f; uint32_t u; }")
local function hash(x)
  local v = x:float():cpu():flat_values()
  local h, sum = 2166136261ULL, 0
  for i = 1, #v do
    u.f = v[i]
    h = (h * 16777619ULL + u.u) % 4294967296ULL
    sum = sum + math.abs(v[i])
  end
  return tostring(h):gsub("ULL", ""), sum
end

local function line_of(name, args)
  local out, ctx = al.attention.forward(args)
  al.manual_seed(8)
  local g = al.attention.backward(ctx, rnd(out:size()))
  local ho, so = hash(out)
  local line = string.format("C %s out %s %.10g", name, ho, so)
  for _, k in ipairs { "query_layer", "key_layer", "value_layer" } do line = line .. " " .. (hash(g[k])) end
  return line
end

-- the cases where the switches' fast and slow paths divide: GQA with a band (sliding window, both corners),
-- thd with padded gaps (sequence lengths that end inside a tile), a mask_mod (the dK/dV kernel's keep bits)
al.manual_seed(9)
local gqa = { query_layer = rnd({ 2, 333, 4, 128 }), key_layer = rnd({ 2, 333, 2, 128 }), value_layer = rnd({ 2, 333, 2, 128 }),
  qkv_format = "bshd", backend = back }
print(line_of("gqa causal d128 s333", with(gqa, { attn_mask_type = "causal" })))
print(line_of("gqa window(100,0) d128 s333", with(gqa, { attn_mask_type = "causal", window_size = { 100, 0 } })))
print(line_of("gqa window(64,64) br d128 s333", with(gqa, { attn_mask_type = "no_mask", window_size = { 64, 64 },
  bottom_right_diagonal = true })))
local thd = { query_layer = rnd({ 300, 4, 128 }), key_layer = rnd({ 330, 2, 128 }), value_layer = rnd({ 330, 2, 128 }),
  qkv_format = "thd", attn_mask_type = "padding", cu_seqlens_q = i32({ 0, 77, 277 }), cu_seqlens_kv = i32({ 0, 90, 300 }),
  cu_seqlens_q_padded = i32({ 0, 96, 300 }), cu_seqlens_kv_padded = i32({ 0, 100, 330 }), backend = back }
print(line_of("thd padding gaps d128", thd))
print(line_of("thd padding_causal gaps d128", with(thd, { attn_mask_type = "padding_causal" })))
local ids = {}
for i = 1, 384 do ids[i] = math.floor((i - 1) * 3 / 384) end   -- three documents of 128 tokens
local doc = al.tensor({ ids }, { dtype = "i32" })
local same_doc = function(b, _, q, k) return al.eq(doc[b][q], doc[b][k]) end
print(line_of("mask_mod documents d128 s384", with(gqa, {
  query_layer = rnd({ 1, 384, 4, 128 }), key_layer = rnd({ 1, 384, 2, 128 }), value_layer = rnd({ 1, 384, 2, 128 }),
  attn_mask_type = "no_mask", mask_mod = same_doc })))
-- documents of 300-1000 tokens with a block mask, causal (empty tiles skipped, full ones without mask_mod): 256
-- dK/dV and 512 dQ work items, more than an H200's SMs, so persistent CTAs walk several items' tile lists (GPU only:
-- the CPU oracle of this size takes minutes)
if dev == "cuda" then
  local ids2 = {}
  for b = 1, 4 do
    ids2[b] = {}
    local d, left = 0, 300 + 97 * b
    for i = 1, 4096 do
      if left == 0 then d, left = d + 1, 300 + (d * 389 + 211 * b) % 700 end
      ids2[b][i], left = d, left - 1
    end
  end
  local doc2 = al.tensor(ids2, { dtype = "i32" })
  local docs = function(b, _, q, k) return al.eq(doc2[b][q], doc2[b][k]) end
  print(line_of("mask_mod documents + block mask causal 4x4096 d128", with(gqa, {
    query_layer = rnd({ 4, 4096, 4, 128 }), key_layer = rnd({ 4, 4096, 2, 128 }), value_layer = rnd({ 4, 4096, 2, 128 }),
    attn_mask_type = "causal", mask_mod = docs, block_mask = al.attention.block_mask(docs, 4, 1, 4096, 4096, { block = 128 }) })))
end

for _, c in ipairs { { 1, 300, 4, 128 }, { 1, 100, 4, 128 }, { 2, 1000, 2, 64 }, { 1, 300, 2, 256 } } do
  local a = inputs(c[1], c[2], c[3], c[4], 7)
  -- d = 256's backward is the stage-1 kernel, whose dQ adds up with f32 atomics: only its deterministic mode
  -- (split dQ accumulators summed in a fixed order) gives the same bits twice. The Hopper kernels ignore it.
  a.deterministic = true
  for _, m in ipairs { "no_mask", "causal" } do
    for _, v in ipairs(c[4] == 128 and { "plain", "softcap" } or { "plain" }) do
      local args = with(a, { attn_mask_type = m })
      if v == "softcap" then args.score_mod = softcap end
      print(line_of(string.format("%s %s d%d s%d", v, m, c[4], c[2]), args))
    end
  end
end
if dev == "cpu" then os.exit(0) end

local function best_of(f)
  for _ = 1, 3 do f() end
  al.cuda.synchronize()
  local best = math.huge
  for _ = 1, 5 do
    local t0 = clock()
    for _ = 1, 10 do f() end
    al.cuda.synchronize()
    best = math.min(best, (clock() - t0) / 10)
  end
  return best
end

local b, s, h, d = 2, 4096, 16, 128
local a = inputs(b, s, h, d, 1)
local dout = rnd({ b, s, h * d })
for _, cfg in ipairs { { "plain-nomask", "no_mask", nil, 1 }, { "softcap-nomask", "no_mask", softcap, 1 },
                       { "plain-causal", "causal", nil, 0.5 }, { "softcap-causal", "causal", softcap, 0.5 } } do
  local args = with(a, { attn_mask_type = cfg[2], score_mod = cfg[3] })
  local fl = 4 * b * h * s * s * d * cfg[4]
  local tf = best_of(function() al.attention.forward(args) end)
  local _, ctx = al.attention.forward(args)
  local tb = best_of(function() al.attention.backward(ctx, dout) end)
  print(string.format("T %-15s fwd %7.1f us %6.1f TFLOP/s   bwd %7.1f us %6.1f TFLOP/s", cfg[1], tf * 1e6,
    fl / tf / 1e12, tb * 1e6, 2.5 * fl / tb / 1e12))
end
