-- bench/variants_cpu.lua — what attention variants (score_mod / mask_mod, docs/VARIANTS.md) cost on the CPU,
-- where the Lua oracle serves them (generated Lua compiled by LuaJIT, f64; lua/attnlab/variants/oracle.lua):
--   1. building a variant for the example variants: new (trace, derivatives, CUDA C) and again (trace; the rest
--      from the generation cache, lua/attnlab/variants/variant.lua)
--   2. the oracle's forward and backward against the built-in CPU backend at compute_dtype f64 (the peer: the
--      same exact arithmetic without a hook), for soft-capping (score_mod) and causal through mask_mod, with
--      GFLOP/s (forward 4*b*h*s*s*d, halved for causal; backward 2.5x) and the ratio oracle / built-in
--   3. al.attention.block_mask build times: sliding window 1024 and causal documents (ids from a tensor) at
--      s = 8192 and 32768, block 128, with the tiles the intervals could not decide (evaluated element-wise)
-- Times are the best of 3 after a warm-up (1 with --quick). Usage: luajit bench/variants_cpu.lua [--quick]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
local wall = al.clock

local quick = false
for _, a in ipairs(arg or {}) do
  if a == "--quick" then quick = true else error("variants_cpu: unknown argument " .. a .. " (expected --quick)") end
end
local REPS = quick and 1 or 3

local function best_of(fn)
  fn()
  collectgarbage()   -- (examples/variants.lua's make leaves a large table of Lua numbers behind: its collection
  collectgarbage()   -- would otherwise land inside whatever is timed next)
  local best = math.huge
  for _ = 1, REPS do
    local t0 = wall()
    fn()
    best = math.min(best, wall() - t0)
  end
  return best
end

-- 1. building a variant
_G.VARIANTS_EXAMPLE_LIB = true
local make = dofile("examples/variants.lua")
_G.VARIANTS_EXAMPLE_LIB = nil
local EX = make(1024, 8, 2)
local V = require "attnlab.variants"
print("1. building a variant: new (trace + derivatives + CUDA C, the generation cache emptied first), ms; again (the")
print("   trace alone, derivation and C from the cache: what every later call costs), mean of 1000 calls, ms")
for _, name in ipairs({ "softcap", "alibi", "relative_bias", "sliding_window", "document", "prefix_lm" }) do
  local x = EX[name]
  local a = { score_mod = x.score_mod, mask_mod = x.mask_mod }
  local t = best_of(function() V.gen_cache_clear() al.attention.variant(a) end)
  local t2 = best_of(function() for _ = 1, 1000 do al.attention.variant(a) end end) / 1000
  print(string.format("   %-16s new %7.3f   again %7.4f", name, t * 1e3, t2 * 1e3))
end

-- 2. the oracle against the built-in CPU backend
print("\n2. oracle (f64) vs built-in CPU backend (compute_dtype f64), b = 2, h = 8, d = 64")
print(string.format("   %-28s %6s %9s %9s %9s %9s %7s %7s", "variant", "s", "fwd ms", "bwd ms", "fwd GF/s", "bwd GF/s",
  "fwd x", "bwd x"))
local softcap = function(score) return 30 * al.tanh(score / 30) end
local causal = function(b, h, q_idx, kv_idx) return al.ge(q_idx, kv_idx) end
for _, s in ipairs(quick and { 512 } or { 512, 1024 }) do
  al.manual_seed(1)
  local b, h, d = 2, 8, 64
  local base = { query_layer = al.randn({ b, s, h, d }), key_layer = al.randn({ b, s, h, d }),
    value_layer = al.randn({ b, s, h, d }), qkv_format = "bshd", compute_dtype = "f64" }
  local dout = al.randn({ b, s, h * d })
  local function with(extra)
    local t = {}
    for k, v in pairs(base) do t[k] = v end
    for k, v in pairs(extra) do t[k] = v end
    return t
  end
  local function times(a)
    local ctx
    local tf = best_of(function() ctx = select(2, al.attention.forward(a)) end)
    local tb = best_of(function() al.attention.backward(ctx, dout) end)
    return tf, tb
  end
  for _, c in ipairs({
    { "softcap 30 (score_mod)", with({ attn_mask_type = "no_mask", score_mod = softcap }), with({ attn_mask_type = "no_mask" }), 1 },
    { "causal (mask_mod)", with({ attn_mask_type = "no_mask", mask_mod = causal }), with({ attn_mask_type = "causal" }), 0.5 },
  }) do
    local vf, vb = times(c[2])
    local rf, rb = times(c[3])
    local flops = 4 * b * h * s * s * d * c[4]
    print(string.format("   %-28s %6d %9.1f %9.1f %9.2f %9.2f %7.2f %7.2f", c[1], s, vf * 1e3, vb * 1e3,
      flops / vf / 1e9, 2.5 * flops / vb / 1e9, vf / rf, vb / rb))
  end
end

-- 3. block masks
print("\n3. al.attention.block_mask, block 128: build ms, tiles evaluated element-wise, empty tiles")
for _, s in ipairs(quick and { 8192 } or { 8192, 32768 }) do
  local window = function(b, h, q_idx, kv_idx) return al.land(al.ge(q_idx, kv_idx), al.le(q_idx - kv_idx, 1024)) end
  local ids, d, left = {}, 0, 0
  local rng = 12345
  for i = 1, s do   -- documents of 200-3000 tokens (a fixed LCG, so every run builds the same mask)
    if left == 0 then
      rng = (rng * 1103515245 + 12345) % 2147483648
      d, left = d + 1, 200 + rng % 2801
    end
    ids[i], left = d, left - 1
  end
  local doc = al.tensor({ ids }, { dtype = "i32" })
  local docs = al.attention.and_masks(causal, function(b, h, q_idx, kv_idx) return al.eq(doc[b][q_idx], doc[b][kv_idx]) end)
  for _, c in ipairs({ { "sliding window 1024", window }, { "causal documents", docs } }) do
    local bm
    local t = best_of(function() bm = al.attention.block_mask(c[2], 1, 1, s, s, { block = 128 }) end)
    print(string.format("   %-20s s = %5d %9.1f ms %6d brute %6.1f%% empty", c[1], s, t * 1e3, bm.brute_tiles,
      100 * bm:sparsity()))
  end
end
