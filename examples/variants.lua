-- examples/variants.lua — attention variants as short Lua functions (FlexAttention-style score_mod /
-- mask_mod, docs/VARIANTS.md): ALiBi, tanh soft-capping, a learnable relative position bias, sliding
-- window, document masking from a tensor of document ids and prefix-LM. Each one runs on the CPU
-- (the Lua oracle) and is checked against the built-in feature that computes the same thing.
--   scripts/attnlab examples/variants.lua
-- The definitions are also a small library: with VARIANTS_EXAMPLE_LIB set, dofile returns
-- make(al, S, H) -> {name = {score_mod=, mask_mod=, reference = function(args) ... end}} (the #gpu
-- specs in tests/spec/variants_spec.lua reuse them).
local al = rawget(_G, "al") or require "attnlab"

-- Indices are 1-based like the whole Lua API: h = 1 is the first head, q_idx = 1 the first query.
local function make(S, H, B)
  B = B or 1
  local V = {}

  -- ALiBi (TE's slopes): the built-in equivalent is core_attention_bias_type = "alibi"
  local slopes = al.tensor(al.attention.default_alibi_slopes(H))
  V.alibi = {
    score_mod = function(score, b, h, q_idx, kv_idx) return score - slopes[h] * al.abs(kv_idx - q_idx) end,
    reference = { core_attention_bias_type = "alibi", alibi_slopes = slopes, attn_mask_type = "no_mask" },
  }

  -- tanh soft-capping (Gemma 2 / Grok): cap * tanh(score / cap); checked against the formula
  local cap = 2.0
  V.softcap = {
    score_mod = function(score) return cap * al.tanh(score / cap) end,
    cap = cap,
  }

  -- a learnable relative position bias (T5-style table per head, one entry per distance), marked as a
  -- parameter: the backward returns its gradient. Built-in equivalent: a post-scale bias [1,H,S,S].
  local rel = al.attention.param(al.randn({ H, 2 * S - 1 }, { dtype = "f64" }) * 0.5)
  local r, fb = rel:totable(), {}
  for h = 1, H do
    fb[h] = {}
    for i = 1, S do fb[h][i] = {} for j = 1, S do fb[h][i][j] = r[h][j - i + S] end end
  end
  local full = al.tensor({ fb }, { dtype = "f64" })
  V.relative_bias = {
    score_mod = function(score, b, h, q_idx, kv_idx) return score + rel[h][kv_idx - q_idx + S] end,
    param = rel,
    reference = { core_attention_bias_type = "post_scale_bias", core_attention_bias = full, attn_mask_type = "no_mask" },
  }

  -- sliding window (causal, 8 tokens back): attn_mask_type = causal with window_size = {8, 0}
  local W = 8
  V.sliding_window = {
    mask_mod = function(b, h, q_idx, kv_idx) return al.land(al.ge(q_idx, kv_idx), al.le(q_idx - kv_idx, W)) end,
    reference = { attn_mask_type = "causal", window_size = { W, 0 } },
  }

  -- document masking: tokens attend within their document only (ids from a tensor [B, S])
  local ids = {}
  for b = 1, B do
    ids[b] = {}
    for i = 1, S do ids[b][i] = math.floor((i - 1) * 3 / S) + (b - 1) end   -- 3 documents per row
  end
  local doc = al.tensor(ids, { dtype = "i32" })
  V.document = {
    mask_mod = function(b, h, q_idx, kv_idx) return al.eq(doc[b][q_idx], doc[b][kv_idx]) end,
    doc = doc,
  }

  -- prefix-LM: the first P tokens see each other (bidirectional), the rest is causal
  local P = math.floor(S / 4)
  local mb = {}   -- TE's arbitrary mask: True = masked out
  for i = 1, S do mb[i] = {} for j = 1, S do mb[i][j] = (j <= P or i >= j) and 0 or 1 end end
  local am = al.tensor({ { mb } }, { dtype = "u8" })
  V.prefix_lm = {
    mask_mod = function(b, h, q_idx, kv_idx) return al.lor(al.le(kv_idx, P), al.ge(q_idx, kv_idx)) end,
    reference = { attn_mask_type = "arbitrary", attention_mask = am },
  }
  return V
end

if rawget(_G, "VARIANTS_EXAMPLE_LIB") then return make end

al.manual_seed(7)
local B, S, H, D = 1, 48, 4, 16
local V = make(S, H, B)
local q = al.randn({ B, S, H, D }, { dtype = "f64" })
local k = al.randn({ B, S, H, D }, { dtype = "f64" })
local v = al.randn({ B, S, H, D }, { dtype = "f64" })
local function call(extra)
  local a = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = "no_mask",
    compute_dtype = "f64" }
  for key, x in pairs(extra) do a[key] = x end
  return al.attention.forward(a)
end
local function check(name, got, want, tol)
  local d = al.max_abs_diff(got, want)
  print(string.format("  %-15s max |variant - reference| = %.2e  %s", name, d, d <= (tol or 1e-10) and "ok" or "MISMATCH"))
  assert(d <= (tol or 1e-10), name .. ": variant and reference differ")
end

print("== each variant on the CPU against its built-in equivalent")
for _, name in ipairs({ "alibi", "relative_bias", "sliding_window", "prefix_lm" }) do
  local x = V[name]
  local out = call({ score_mod = x.score_mod, mask_mod = x.mask_mod })
  local ref = call(x.reference)
  check(name, out, ref)
end

-- soft-capping against the formula softmax(cap * tanh(scale * q k^T / cap)) v
do
  local x = V.softcap
  local out = call({ score_mod = x.score_mod })
  local qh, kh, vh = q:permute(1, 3, 2, 4), k:permute(1, 3, 2, 4), v:permute(1, 3, 2, 4)
  local s = al.matmul(qh, kh:transpose(3, 4)) * (1 / math.sqrt(D))
  local p = (al.tanh(s * (1 / x.cap)) * x.cap):softmax(-1)
  local ref = al.matmul(p, vh):permute(1, 3, 2, 4):contiguous():view(B, S, H * D)
  check("softcap", out, ref)
end

-- document masking against the same tokens packed as thd sequences (one per document)
do
  local x = V.document
  local out = call({ mask_mod = x.mask_mod })
  local ids, cu = x.doc:totable()[1], { 0 }
  for i = 2, S + 1 do if i == S + 1 or ids[i] ~= ids[i - 1] then cu[#cu + 1] = i - 1 end end
  local cut = al.tensor(cu, { dtype = "i32" })
  local ref = al.attention.forward({ query_layer = q:select(1, 1), key_layer = k:select(1, 1), value_layer = v:select(1, 1), qkv_format = "thd",
    attn_mask_type = "padding", cu_seqlens_q = cut, cu_seqlens_kv = cut, compute_dtype = "f64" })
  check("document", out:view(S, H * D), ref)
end

print("== the learnable relative bias gets a gradient (equal to the built-in dbias summed per distance)")
do
  local x = V.relative_bias
  local out, ctx = call({ score_mod = x.score_mod })
  local dout = al.randn(out:size(), { dtype = "f64" })
  local g = al.attention.backward(ctx, dout)
  local _, rctx = call(x.reference)
  local db = al.attention.backward(rctx, dout).core_attention_bias:totable()[1]
  local want = al.zeros({ H, 2 * S - 1 }, { dtype = "f64" })
  local w = {}
  for h = 1, H do
    w[h] = {}
    for r = 1, 2 * S - 1 do w[h][r] = 0 end
    for i = 1, S do for j = 1, S do w[h][j - i + S] = w[h][j - i + S] + db[h][i][j] end end
  end
  want:copy_(al.tensor(w, { dtype = "f64" }))
  check("d rel", g.captures[x.param]:to("f64"), want, 1e-5)
end

print("== a block mask for a sliding window of 1024 at s = 16384 (tiles of 128)")
local clock = require("attnlab.progress").clock
local t0 = clock()
local bm = al.attention.block_mask(function(b, h, q_idx, kv_idx)
  return al.land(al.ge(q_idx, kv_idx), al.le(q_idx - kv_idx, 1024))
end, 1, 1, 16384, 16384, { block = 128 })
print(string.format("  %s  (%.0f ms)", tostring(bm), (clock() - t0) * 1000))
print("  and for the prefix-LM above at its small size:")
print("  " .. tostring(al.attention.block_mask(V.prefix_lm.mask_mod, 1, 1, S, S, { block = 8 })):gsub("\n", "\n  "))

print("== the CUDA C the GPU compiles for soft-capping (NVRTC, cached on disk)")
print(al.attention.variant({ score_mod = V.softcap.score_mod }))
