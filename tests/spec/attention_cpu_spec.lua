-- DotProductAttention on the CPU backend: every feature against the naive Lua oracle
-- (tests/spec/attention_oracle.lua), every gradient by central finite differences in f64, the three
-- ways of passing packed QKV bit-identical, padding proofs, dropout reproducibility, error cases.
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"
local oracle = require "attention_oracle"

local function rnd(shape, dtype) return al.randn(shape, { dtype = dtype or "f64" }) end
local function i32(list) return al.tensor(list, { dtype = "i32" }) end

local function copy_args(a, extra)
  local t = {}
  for k, v in pairs(a) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

local maxdiff = require("nn_check").maxdiff   -- max |a[i] - b[i]| over two lists, NaN as +inf

-- C forward (unflattened out) vs oracle; returns the C out values.
local function check_oracle(a, tol, name)
  local _, ctx = al.attention.forward(a)
  local got = ctx.out:flat_values()
  local want = oracle.run(al, a)
  local d = maxdiff(got, want)
  assert(d <= tol, string.format("%s: max |cpu - oracle| = %.3g > %.3g", name or "", d, tol))
  for _, x in ipairs(got) do assert(x == x, (name or "") .. ": NaN in output") end
  return got, ctx
end

-- every multi-index of a shape (1-based)
local function indices(shape)
  local list, idx = {}, {}
  local function rec(d)
    if d > #shape then list[#list + 1] = { unpack(idx) } return end
    for i = 1, shape[d] do idx[d] = i; rec(d + 1) end
  end
  rec(1)
  return list
end
local function elem(t, idx)
  local e = t
  for d = #idx, 1, -1 do e = e:select(d, idx[d]) end
  return e
end

-- Central finite differences of L = sum(out * W) against the analytic gradients, for the named
-- tensors of args (each must be an f64 tensor in args; `grad_key` maps names to grads keys).
local function fd_check(a, names, opts)
  opts = opts or {}
  a = copy_args(a, { compute_dtype = "f64" })
  local out, ctx = al.attention.forward(a)
  local W = rnd(out:size())
  local w = W:flat_values()
  local grads = al.attention.backward(ctx, W)
  local function loss()
    local o = al.attention.forward(a)
    local v = o:flat_values()
    local s = 0
    for i = 1, #v do s = s + v[i] * w[i] end
    return s
  end
  local eps = 1e-6
  local checked = 0
  for _, name in ipairs(names) do
    local t = a[name]
    local g = grads[name]
    assert(g, "no gradient returned for " .. name)
    assert.are.same(t:size(), g:size())
    local all = indices(t:size())
    local step = opts.stride or 1
    for n = 1, #all, step do
      local idx = all[n]
      local e = elem(t, idx)
      local x0 = e:item()
      e:fill_(x0 + eps)
      local lp = loss()
      e:fill_(x0 - eps)
      local lm = loss()
      e:fill_(x0)
      local fd = (lp - lm) / (2 * eps)
      local an = elem(g, idx):item()
      local err = math.abs(fd - an)
      assert(err <= 1e-6 + 1e-5 * math.abs(fd),
        string.format("d%s%s: analytic %.10g vs finite difference %.10g", name, table.concat(idx, ","), an, fd))
      checked = checked + 1
    end
  end
  return checked
end

-- a small base problem: b=2, sq=5, skv=7, h=4, hg=2, d_qk=8, d_v=6
local function base(fmt, o)
  o = o or {}
  local b, sq, skv, h, hg, dqk, dv = o.b or 2, o.sq or 5, o.skv or 7, o.h or 4, o.hg or 2, o.dqk or 8, o.dv or 6
  local dt = o.dtype or "f64"
  local function shp(s, hh, d)
    if fmt == "bshd" then return { b, s, hh, d } else return { s, b, hh, d } end
  end
  return { query_layer = rnd(shp(sq, h, dqk), dt), key_layer = rnd(shp(skv, hg, dqk), dt),
    value_layer = rnd(shp(skv, hg, dv), dt), qkv_format = fmt, compute_dtype = "f64" }, b, sq, skv, h
end

describe("attention cpu vs the Lua oracle", function()
  before_each(function() al.manual_seed(1234) end)

  it("every mask type without padding, bshd and sbhd, self and cross", function()
    local n = 0
    for _, fmt in ipairs({ "bshd", "sbhd" }) do
      for _, dims in ipairs({ { sq = 5, skv = 7 }, { sq = 6, skv = 6 }, { sq = 7, skv = 4 } }) do
        for _, mask in ipairs({ "no_mask", "causal", "causal_bottom_right" }) do
          local a = base(fmt, dims)
          a.attn_mask_type = mask
          check_oracle(a, 1e-12, fmt .. " " .. mask .. " " .. dims.sq .. "/" .. dims.skv)
          n = n + 1
        end
      end
    end
    assert.equal(18, n)
  end)

  it("padding masks from cu_seqlens (bshd) and from attention_mask tensors (self and cross)", function()
    for _, mask in ipairs({ "padding", "padding_causal", "padding_causal_bottom_right" }) do
      local a = base("bshd")
      a.attn_mask_type = mask
      a.cu_seqlens_q, a.cu_seqlens_kv = i32({ 0, 3, 8 }), i32({ 0, 6, 10 })
      check_oracle(a, 1e-12, mask .. " cu_seqlens")
      -- attention_mask tuple (cross-attention), trailing padding
      local a2 = base("bshd")
      a2.attn_mask_type = mask
      local mq = al.tensor({ { { { 0, 0, 0, 1, 1 } } }, { { { 0, 0, 0, 0, 0 } } } }, { dtype = "bool" })
      local mk = al.tensor({ { { { 0, 0, 0, 0, 0, 0, 1 } } }, { { { 0, 0, 0, 0, 1, 1, 1 } } } }, { dtype = "bool" })
      a2.attention_mask = { mq, mk }
      check_oracle(a2, 1e-12, mask .. " attention_mask")
      -- self-attention: one mask for both sides
      local a3 = base("sbhd", { sq = 6, skv = 6 })
      a3.attn_mask_type = mask
      a3.attention_mask = al.tensor({ { { { 0, 0, 0, 0, 1, 1 } } }, { { { 0, 0, 0, 0, 0, 0 } } } }, { dtype = "u8" })
      check_oracle(a3, 1e-12, mask .. " self mask")
    end
  end)

  it("thd with cu_seqlens and cu_seqlens_padded (gaps stay zero)", function()
    for _, mask in ipairs({ "padding", "padding_causal", "padding_causal_bottom_right" }) do
      local q, k, v = rnd({ 13, 4, 8 }), rnd({ 15, 2, 8 }), rnd({ 15, 2, 6 })
      local a = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "thd", attn_mask_type = mask,
        cu_seqlens_q = i32({ 0, 3, 5, 9 }), cu_seqlens_q_padded = i32({ 0, 4, 8, 13 }),
        cu_seqlens_kv = i32({ 0, 4, 9, 12 }), cu_seqlens_kv_padded = i32({ 0, 5, 10, 15 }), compute_dtype = "f64" }
      local got = check_oracle(a, 1e-12, "thd " .. mask)
      -- rows 3 (gap after seq 0), 7 (gap after seq 1) and 12 are zero
      for _, r in ipairs({ 3, 7, 12 }) do
        for c = 1, 4 * 6 do assert.equal(0, got[r * 24 + c]) end
      end
      -- without padded offsets
      local a2 = copy_args(a, { cu_seqlens_q_padded = false, cu_seqlens_kv_padded = false })
      a2.cu_seqlens_q_padded, a2.cu_seqlens_kv_padded = nil, nil
      check_oracle(a2, 1e-12, "thd packed " .. mask)
    end
  end)

  it("sliding windows, top-left and bottom-right aligned, on every mask class", function()
    local cases = {
      { "no_mask", { 2, 1 } }, { "no_mask", { 0, 0 } }, { "no_mask", { 2, 1 }, false }, { "causal", { 2, 0 } },
      { "causal_bottom_right", { 1, 0 } }, { "padding", { 1, 2 } }, { "padding_causal", { 3, 0 } },
      { "padding_causal_bottom_right", { 2, 0 } },
    }
    for _, c in ipairs(cases) do
      for _, dims in ipairs({ { sq = 5, skv = 7 }, { sq = 7, skv = 5 } }) do
        local a = base("bshd", dims)
        a.attn_mask_type, a.window_size = c[1], c[2]
        if c[3] ~= nil then a.bottom_right_diagonal = c[3] end
        if c[1]:find("padding") then a.cu_seqlens_q, a.cu_seqlens_kv = i32({ 0, dims.sq - 2, 2 * dims.sq - 2 }), i32({ 0, dims.skv, 2 * dims.skv - 1 }) end
        check_oracle(a, 1e-12, c[1] .. " window " .. c[2][1] .. "," .. c[2][2])
      end
    end
  end)

  it("arbitrary masks broadcast from [b,h,sq,skv], [b,1,sq,skv] and [sq,skv]", function()
    for _, shape in ipairs({ { 2, 4, 5, 7 }, { 2, 1, 5, 7 }, { 5, 7 } }) do
      local a = base("bshd")
      a.attn_mask_type = "arbitrary"
      a.attention_mask = al.rand(shape):gt(0.6)
      check_oracle(a, 1e-12, "arbitrary " .. table.concat(shape, "x"))
    end
  end)

  it("pre- and post-scale bias of every TE shape", function()
    for _, bt in ipairs({ "pre_scale_bias", "post_scale_bias" }) do
      for _, shape in ipairs({ { 2, 4, 5, 7 }, { 1, 4, 5, 7 }, { 2, 1, 5, 7 }, { 1, 1, 5, 7 }, { 1, 1, 1, 7 } }) do
        local a = base("sbhd")
        a.attn_mask_type = "causal_bottom_right"
        a.core_attention_bias_type, a.core_attention_bias = bt, rnd(shape)
        check_oracle(a, 1e-12, bt .. " " .. table.concat(shape, "x"))
      end
    end
  end)

  it("ALiBi: TE default slopes (power of 2 and not), custom [h] and [b,h], symmetric abs form", function()
    local s6 = al.attention.default_alibi_slopes(6)
    local o6 = oracle.default_slopes(6)
    for i = 1, 6 do assert.near(o6[i], s6[i], 1e-7) end
    assert.near(2 ^ -4, al.attention.default_alibi_slopes(2)[1], 0)    -- 2^(-8/2)
    for _, h in ipairs({ 4, 6 }) do
      for _, mask in ipairs({ "no_mask", "causal", "causal_bottom_right", "padding_causal" }) do
        local a = base("bshd", { h = h, hg = h == 6 and 3 or 2 })
        a.attn_mask_type = mask
        a.core_attention_bias_type = "alibi"
        if mask:find("padding") then a.cu_seqlens_q, a.cu_seqlens_kv = i32({ 0, 4, 9 }), i32({ 0, 5, 12 }) end
        check_oracle(a, 1e-12, "alibi h" .. h .. " " .. mask)
        a.alibi_slopes = al.rand({ h }, { dtype = "f32" })
        check_oracle(a, 1e-12, "alibi custom [h]")
        a.alibi_slopes = al.rand({ 2, h }, { dtype = "f32" })
        check_oracle(a, 1e-12, "alibi custom [b,h]")
      end
    end
  end)

  it("softmax off-by-one and learnable sinks, with max_logit", function()
    for _, st in ipairs({ "off-by-one", "learnable" }) do
      for _, mask in ipairs({ "no_mask", "causal", "padding_causal" }) do
        local a = base("bshd")
        a.attn_mask_type, a.softmax_type = mask, st
        if st == "learnable" then a.softmax_offset = rnd({ 4 }) end
        if mask:find("padding") then a.cu_seqlens_q, a.cu_seqlens_kv = i32({ 0, 4, 9 }), i32({ 0, 5, 12 }) end
        check_oracle(a, 1e-12, st .. " " .. mask)
      end
    end
    local a = base("bshd")
    a.attn_mask_type, a.return_max_logit = "causal", true
    a.core_attention_bias_type, a.core_attention_bias = "post_scale_bias", rnd({ 1, 4, 5, 7 })
    local _, ml = al.attention.forward(a)
    local _, _, want = oracle.run(al, a)
    assert.are.same({ 4 }, ml:size())
    local got = ml:flat_values()
    for h = 1, 4 do assert.near(want[h], got[h], 1e-5) end
  end)

  it("GQA, MQA, d_qk ~= d_v, decode (sq = 1), fully masked rows are zero", function()
    check_oracle(copy_args(base("bshd", { h = 4, hg = 1 }), { attn_mask_type = "causal" }), 1e-12, "MQA")
    check_oracle(copy_args(base("sbhd", { h = 4, hg = 4, dqk = 12, dv = 3 }), { attn_mask_type = "no_mask" }), 1e-12, "MHA mla")
    check_oracle(copy_args(base("bshd", { sq = 1, skv = 9 }), { attn_mask_type = "causal_bottom_right" }), 1e-12, "decode")
    check_oracle(copy_args(base("bshd", { sq = 1, skv = 9 }), { attn_mask_type = "padding_causal_bottom_right",
      cu_seqlens_q = i32({ 0, 1, 2 }), cu_seqlens_kv = i32({ 0, 4, 13 }) }), 1e-12, "decode padding")
    -- sq > skv with bottom-right causal: the first sq - skv rows see nothing -> zero, finite lse
    local a = copy_args(base("bshd", { sq = 7, skv = 4 }), { attn_mask_type = "causal_bottom_right" })
    local got, ctx = check_oracle(a, 1e-12, "empty rows")
    local zeros = 0
    for i = 1, 4 * 6 * 3 do if got[i] == 0 then zeros = zeros + 1 end end
    assert.equal(72, zeros)
    local g = al.attention.backward(ctx, rnd(ctx.out:size()))
    for _, x in ipairs(g.query_layer:flat_values()) do assert(x == x, "NaN in dq") end
  end)

  it("dropout matches the oracle fed with the documented Philox keep rule", function()
    local a = base("bshd")
    a.attn_mask_type, a.attention_dropout = "causal", 0.3
    a.dropout_seed, a.dropout_offset = 42, 7
    check_oracle(a, 1e-12, "dropout")
  end)

  it("f32 compute and f32/f16/bf16 inputs stay within TE's tolerances of the f64 oracle", function()
    local a = base("bshd")
    a.attn_mask_type, a.compute_dtype = "causal", "f32"
    check_oracle(a, 1e-5, "f32 compute")
    for _, dt in ipairs({ { "f32", 1e-5 }, { "f16", 1e-3 }, { "bf16", 1.5e-2 } }) do
      local b = base("sbhd")
      local q, k, v = b.query_layer:to(dt[1]), b.key_layer:to(dt[1]), b.value_layer:to(dt[1])
      local out = al.attention.forward{ query_layer = q, key_layer = k, value_layer = v, qkv_format = "sbhd",
        attn_mask_type = "causal" }
      assert.equal(dt[1], out:dtype())
      local want = oracle.run(al, { query_layer = q:to("f64"), key_layer = k:to("f64"), value_layer = v:to("f64"),
        qkv_format = "sbhd", attn_mask_type = "causal" })
      local d = maxdiff(out:to("f64"):flat_values(), want)
      assert(d <= dt[2] * 4, dt[1] .. " inputs: " .. d)
    end
  end)
end)

describe("attention cpu gradients by finite differences (f64)", function()
  before_each(function() al.manual_seed(99) end)
  local QKV = { "query_layer", "key_layer", "value_layer" }

  it("dq, dk, dv: causal GQA, no_mask cross, SWA, d_qk ~= d_v", function()
    local n = 0
    n = n + fd_check(copy_args(base("bshd", { b = 1, sq = 4, skv = 5, h = 2, hg = 1, dqk = 3, dv = 2 }), { attn_mask_type = "causal" }), QKV)
    n = n + fd_check(copy_args(base("sbhd", { b = 2, sq = 3, skv = 4, h = 2, hg = 2, dqk = 2, dv = 3 }), { attn_mask_type = "no_mask" }), QKV)
    n = n + fd_check(copy_args(base("bshd", { b = 1, sq = 5, skv = 5, h = 2, hg = 1, dqk = 2, dv = 2 }),
      { attn_mask_type = "no_mask", window_size = { 1, 1 } }), QKV)
    assert(n > 100)
  end)

  it("thd with gaps and padding_causal_bottom_right: gradients, zeros in gaps", function()
    local q, k, v = rnd({ 7, 2, 2 }), rnd({ 8, 1, 2 }), rnd({ 8, 1, 3 })
    local a = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "thd",
      attn_mask_type = "padding_causal_bottom_right", cu_seqlens_q = i32({ 0, 2, 5 }), cu_seqlens_q_padded = i32({ 0, 3, 7 }),
      cu_seqlens_kv = i32({ 0, 3, 6 }), cu_seqlens_kv_padded = i32({ 0, 4, 8 }) }
    fd_check(a, QKV)
    local _, ctx = al.attention.forward(a)
    local g = al.attention.backward(ctx, rnd(ctx.out:size()))
    for c = 1, 4 do assert.equal(0, g.query_layer:flat_values()[2 * 4 + c]) end  -- q row 2 is a gap
    for c = 1, 2 do assert.equal(0, g.key_layer:flat_values()[3 * 2 + c]) end    -- k row 3 is a gap
  end)

  it("dbias for pre/post-scale bias, reduced over broadcast dims (bhss, 1hss, b1ss, 11ss, 111s)", function()
    for _, bt in ipairs({ "post_scale_bias", "pre_scale_bias" }) do
      for _, shape in ipairs({ { 2, 2, 3, 4 }, { 1, 2, 3, 4 }, { 2, 1, 3, 4 }, { 1, 1, 3, 4 }, { 1, 1, 1, 4 } }) do
        local a = base("bshd", { b = 2, sq = 3, skv = 4, h = 2, hg = 1, dqk = 2, dv = 2 })
        a.attn_mask_type, a.core_attention_bias_type, a.core_attention_bias = "causal_bottom_right", bt, rnd(shape)
        fd_check(a, { "core_attention_bias", "query_layer" })
      end
    end
  end)

  it("learnable softmax offset, off-by-one, ALiBi, padding masks", function()
    local a = base("bshd", { b = 2, sq = 3, skv = 4, h = 2, hg = 2, dqk = 2, dv = 2 })
    a.attn_mask_type, a.softmax_type, a.softmax_offset = "causal", "learnable", rnd({ 2 })
    fd_check(a, { "softmax_offset", "query_layer", "key_layer", "value_layer" })
    local b = base("bshd", { b = 2, sq = 3, skv = 4, h = 2, hg = 1, dqk = 2, dv = 2 })
    b.attn_mask_type, b.softmax_type = "no_mask", "off-by-one"
    fd_check(b, QKV)
    local c = base("sbhd", { b = 2, sq = 3, skv = 4, h = 3, hg = 1, dqk = 2, dv = 2 })
    c.attn_mask_type, c.core_attention_bias_type = "padding_causal", "alibi"
    c.cu_seqlens_q, c.cu_seqlens_kv = i32({ 0, 2, 5 }), i32({ 0, 4, 7 })
    fd_check(c, QKV)
    local d = base("bshd", { b = 2, sq = 3, skv = 4, h = 2, hg = 1, dqk = 2, dv = 2 })
    d.attn_mask_type = "padding"
    d.attention_mask = { al.tensor({ { { { 0, 0, 1 } } }, { { { 0, 0, 0 } } } }, { dtype = "bool" }),
      al.tensor({ { { { 0, 0, 0, 1 } } }, { { { 0, 1, 1, 1 } } } }, { dtype = "bool" }) }
    fd_check(d, QKV)
  end)

  it("dropout at a fixed seed: the backward uses the forward's mask", function()
    local a = base("bshd", { b = 1, sq = 4, skv = 5, h = 2, hg = 1, dqk = 3, dv = 2 })
    a.attn_mask_type, a.attention_dropout, a.dropout_seed, a.dropout_offset = "no_mask", 0.4, 5, 11
    fd_check(a, QKV)
  end)
end)

describe("attention cpu: packed inputs, padding proofs, dropout reproducibility", function()
  before_each(function() al.manual_seed(7) end)

  local function same(a, b, what)
    assert.are.same(a:size(), b:size())
    assert.equal(0, al.max_abs_diff(a, b), what .. " differ")
  end

  it("declared qkv_layer, detected views and separate tensors are bit-identical (out and grads)", function()
    for _, case in ipairs({ { "bshd", -3, { 2, 6, 3, 4, 8 } }, { "bshd", -2, { 2, 6, 4, 3, 8 } },
      { "sbhd", -3, { 6, 2, 3, 4, 8 } }, { "sbhd", -2, { 6, 2, 4, 3, 8 } } }) do
      local fmt, dim, shape = case[1], case[2], case[3]
      local qkv = al.randn(shape)
      local common = { qkv_format = fmt, attn_mask_type = "causal", compute_dtype = "f32" }
      local o1, c1 = al.attention.forward(copy_args(common, { qkv_layer = qkv, qkv_interleave_dim = dim }))
      local q, k, v = qkv:select(dim, 1), qkv:select(dim, 2), qkv:select(dim, 3)
      local warns, o2, c2 = al.warnings.capture(al.attention.forward, copy_args(common, { query_layer = q, key_layer = k,
        value_layer = v }))
      assert.equal(1, #warns)
      assert.equal("DeprecationWarning", warns[1].category)
      local o3, c3 = al.attention.forward(copy_args(common, { query_layer = q:contiguous(), key_layer = k:contiguous(),
        value_layer = v:contiguous() }))
      same(o1, o2, "declared vs detected")
      same(o1, o3, "declared vs separate")
      local dout = al.randn(o1:size())
      local g1 = al.attention.backward(c1, dout)
      local g2 = al.attention.backward(c2, dout)
      local g3 = al.attention.backward(c3, dout)
      assert.are.same(shape, g1.qkv_layer:size())
      local names = { "query_layer", "key_layer", "value_layer" }
      for i = 1, 3 do
        same(g1.qkv_layer:select(dim, i), g2[names[i]], "packed grad vs detected " .. names[i])
        same(g1.qkv_layer:select(dim, i), g3[names[i]], "packed grad vs separate " .. names[i])
      end
    end
  end)

  it("kv_layer with a separate query (GQA), and a strided packed buffer", function()
    local q = al.randn({ 2, 5, 4, 8 })
    local kv = al.randn({ 2, 7, 2, 2, 8 })
    local common = { qkv_format = "bshd", attn_mask_type = "no_mask" }
    local o1, c1 = al.attention.forward(copy_args(common, { query_layer = q, kv_layer = kv, qkv_interleave_dim = -3 }))
    local o2, c2 = al.attention.forward(copy_args(common, { query_layer = q, key_layer = kv:select(-3, 1):contiguous(),
      value_layer = kv:select(-3, 2):contiguous() }))
    same(o1, o2, "kv_layer")
    local dout = al.randn(o1:size())
    local g1, g2 = al.attention.backward(c1, dout), al.attention.backward(c2, dout)
    same(g1.kv_layer:select(-3, 1), g2.key_layer, "dk")
    same(g1.kv_layer:select(-3, 2), g2.value_layer, "dv")
    same(g1.query_layer, g2.query_layer, "dq")
    -- a packed buffer that is itself strided in an outer dim (TE's hazard H1): real strides are read
    local big = al.randn({ 2, 12, 3, 4, 8 })
    local qkv = big:narrow(2, 1, 12):as_strided({ 2, 6, 3, 4, 8 }, { 12 * 96, 2 * 96, 32, 8, 1 }, 0)
    local o3 = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal" }
    local o4 = al.attention.forward{ query_layer = qkv:select(3, 1):contiguous(), key_layer = qkv:select(3, 2):contiguous(),
      value_layer = qkv:select(3, 3):contiguous(), qkv_format = "bshd", attn_mask_type = "causal" }
    same(o3, o4, "strided packed")
  end)

  it("values in padded positions change no valid output (bshd padding and thd gaps)", function()
    local a = base("bshd", { dtype = "f32" })
    a.attn_mask_type, a.cu_seqlens_q, a.cu_seqlens_kv = "padding_causal", i32({ 0, 3, 8 }), i32({ 0, 5, 12 })
    local o1 = al.attention.forward(a):clone()
    -- batch 0: q rows 4,5 and kv rows 6,7 are padding
    a.query_layer:narrow(1, 1, 1):narrow(2, 4, 2):fill_(1e4)
    a.key_layer:narrow(1, 1, 1):narrow(2, 6, 2):fill_(-1e4)
    a.value_layer:narrow(1, 1, 1):narrow(2, 6, 2):fill_(1e4)
    local o2 = al.attention.forward(a)
    same(o1, o2, "padding changed the output")
    local v1 = o1:flat_values()
    for i = 3 * 24 + 1, 5 * 24 do assert.equal(0, v1[i]) end
    -- thd gaps
    local q, k, v = rnd({ 9, 2, 4 }, "f32"), rnd({ 9, 2, 4 }, "f32"), rnd({ 9, 2, 4 }, "f32")
    local t = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "thd", attn_mask_type = "padding",
      cu_seqlens_q = i32({ 0, 3, 7 }), cu_seqlens_kv = i32({ 0, 3, 7 }), cu_seqlens_q_padded = i32({ 0, 4, 9 }),
      cu_seqlens_kv_padded = i32({ 0, 4, 9 }) }
    local t1 = al.attention.forward(t):clone()
    for _, x in ipairs({ q, k, v }) do x:narrow(1, 4, 1):fill_(1e4); x:narrow(1, 9, 1):fill_(-1e4) end
    same(t1, al.attention.forward(t), "thd gaps changed the output")
  end)

  it("dropout: same seed same output, a new seed another, manual_seed reproduces", function()
    local a = base("bshd", { dtype = "f32" })
    a.attn_mask_type, a.attention_dropout = "causal", 0.5
    al.manual_seed(3)
    local o1 = al.attention.forward(a):clone()
    local o2 = al.attention.forward(a)
    assert(al.max_abs_diff(o1, o2) > 0, "the generator did not advance")
    al.manual_seed(3)
    same(o1, al.attention.forward(a), "manual_seed")
    local b = copy_args(a, { dropout_seed = 11, dropout_offset = 0 })
    same(al.attention.forward(b), al.attention.forward(b), "explicit seed")
    -- about half the probabilities are dropped: output differs from the no-dropout one
    local c = copy_args(a, { attention_dropout = 0 })
    assert(al.max_abs_diff(al.attention.forward(c), o1) > 1e-3)
  end)
end)

describe("attention cpu: errors before any work", function()
  -- frag: a fragment of the message, or a list of acceptable fragments (the layout checks of
  -- detect_layout may speak first for separate tensors)
  local function fails(a, frag)
    local ok, err = pcall(al.attention.forward, a)
    local frags = type(frag) == "table" and frag or { frag }
    assert.is_false(ok, "expected an error containing: " .. frags[1])
    local hit = false
    for _, f in ipairs(frags) do hit = hit or tostring(err):find(f, 1, true) ~= nil end
    assert(hit, "message '" .. tostring(err) .. "' lacks '" .. frags[1] .. "'")
  end
  local function good() return base("bshd") end

  it("rejects inconsistent shapes, masks, windows, bias, cu_seqlens and dropout", function()
    local n = 0
    local function F(extra, frag) fails(copy_args(good(), extra), frag); n = n + 1 end
    F({ key_layer = rnd({ 2, 7, 3, 8 }) }, { "same head count", "must have the same shape" })
    F({ key_layer = rnd({ 2, 7, 2, 5 }), value_layer = rnd({ 2, 7, 2, 6 }) }, "same head dim")
    F({ key_layer = rnd({ 2, 7, 3, 8 }), value_layer = rnd({ 2, 7, 3, 6 }) }, "multiple of num_gqa_groups")
    F({ attention_dropout = 1.0 }, "attention_dropout")
    F({ attn_mask_type = "causal", window_size = { -1, 3 } }, "window_size should be")
    F({ attn_mask_type = "no_mask", window_size = { 2, -1 } }, "window_size should be")
    F({ attn_mask_type = "weird" }, "attn_mask_type")
    F({ core_attention_bias_type = "post_scale_bias" }, "needs core_attention_bias")
    F({ core_attention_bias_type = "post_scale_bias", core_attention_bias = rnd({ 2, 4, 5, 6 }) }, "core_attention_bias must be")
    F({ core_attention_bias_type = "post_scale_bias", core_attention_bias = rnd({ 2, 1, 1, 7 }) }, "111s")
    F({ attn_mask_type = "padding", cu_seqlens_q = al.tensor({ 0, 3, 8 }, { dtype = "i64" }), cu_seqlens_kv = i32({ 0, 3, 8 }) }, "must be i32")
    F({ attn_mask_type = "padding", cu_seqlens_q = i32({ 0, 4, 3 }), cu_seqlens_kv = i32({ 0, 3, 8 }) }, "non-decreasing")
    F({ attn_mask_type = "padding", cu_seqlens_q = i32({ 0, 3 }), cu_seqlens_kv = i32({ 0, 3, 8 }) }, "batch + 1")
    F({ attn_mask_type = "padding", cu_seqlens_q = i32({ 0, 3, 11 }), cu_seqlens_kv = i32({ 0, 3, 8 }) }, "beyond")
    F({ attn_mask_type = "causal", cu_seqlens_q = i32({ 0, 3, 8 }), cu_seqlens_kv = i32({ 0, 3, 8 }) }, "has no padding")
    F({ attn_mask_type = "arbitrary" }, "needs attention_mask")
    F({ attn_mask_type = "arbitrary", attention_mask = al.zeros({ 3, 5, 7 }, { dtype = "bool" }) }, "not broadcastable")
    F({ attn_mask_type = "padding", attention_mask = al.zeros({ 2, 1, 1, 5 }, { dtype = "bool" }) }, "needs the key-side mask")
    F({ softmax_type = "learnable" }, "needs softmax_offset")
    F({ core_attention_bias_type = "alibi", alibi_slopes = al.ones({ 3 }) }, "alibi_slopes must be")
    F({ backend = "magic" }, "not one of")
    F({ value_layer = rnd({ 2, 7, 2, 6 }, "f32") }, "one dtype")
    -- thd
    local q, k, v = rnd({ 8, 4, 8 }), rnd({ 8, 2, 8 }), rnd({ 8, 2, 8 })
    local function T(extra, frag)
      fails(copy_args({ query_layer = q, key_layer = k, value_layer = v, qkv_format = "thd", attn_mask_type = "padding",
        cu_seqlens_q = i32({ 0, 3, 8 }), cu_seqlens_kv = i32({ 0, 3, 8 }) }, extra), frag)
      n = n + 1
    end
    T({ attn_mask_type = "causal" }, "needs a padding mask type")
    T({ cu_seqlens_kv = i32({ 0, 3, 9 }) }, "beyond")
    T({ cu_seqlens_q_padded = i32({ 0, 2, 8 }) }, "slots")
    T({ max_seqlen_q = 2 }, "below the longest")
    T({ query_layer = rnd({ 8, 4, 4, 8 }) }, "3D")
    assert.equal(27, n)
    -- packed-input rules come from unpack_qkv
    local ok = pcall(al.attention.forward, { qkv_layer = al.randn({ 2, 5, 4, 4, 8 }), qkv_format = "bshd" })
    assert.is_false(ok)
  end)

  it("a forced backend that cannot serve is an error naming it; explain lists every backend", function()
    local a = copy_args(good(), { backend = "fused" })
    fails(a, "forced backend 'fused'")
    local text, chosen = al.attention.explain(good())
    assert.equal("cpu", chosen)
    for _, n in ipairs({ "fused", "flash", "unfused", "cpu" }) do assert(text:find(n, 1, true), n) end
    assert(text:find("bshd_bshd_bshd", 1, true))
  end)
end)

describe("al.DotProductAttention module", function()
  before_each(function() al.manual_seed(21) end)

  it("TE's constructor defaults and checks", function()
    local dpa = al.DotProductAttention{ num_attention_heads = 4, kv_channels = 8 }
    assert.equal("sbhd", dpa.qkv_format)
    assert.equal("causal", dpa.attn_mask_type)
    assert.equal(4, dpa.num_gqa_groups)
    assert.near(1 / math.sqrt(8), dpa.softmax_scale, 1e-15)
    local p = dpa:parameters()
    assert.equal(0, #p)
    assert.has_error(function() al.DotProductAttention{ num_attention_heads = 6, kv_channels = 8, num_gqa_groups = 4 } end)
    assert.has_error(function() al.DotProductAttention{ num_attention_heads = 4, kv_channels = 8, softmax_type = "nope" } end)
    assert.has_error(function() al.DotProductAttention{ num_attention_heads = 4, kv_channels = 8, attention_dropout = 1 } end)
  end)

  it("forward/backward with qkv_layer equal the functional form; learnable offset gets gradients", function()
    local dpa = al.DotProductAttention{ num_attention_heads = 4, kv_channels = 8, qkv_format = "bshd",
      softmax_type = "learnable", return_max_logit = true, compute_dtype = "f64" }
    local params, gparams = dpa:parameters()
    assert.equal(1, #params)
    assert.are.same({ 4 }, params[1]:size())
    assert.equal(0, al.max_abs_diff(params[1], al.zeros({ 4 })))
    params[1]:copy_(al.randn({ 4 }))
    local qkv = al.randn({ 2, 6, 3, 4, 8 }, { dtype = "f64" })
    local input = { qkv_layer = qkv, qkv_interleave_dim = -3 }
    local out, ml = dpa:forward(input)
    assert.are.same({ 2, 6, 32 }, out:size())
    assert.are.same({ 4 }, ml:size())
    local fout = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal", softmax_type = "learnable",
      softmax_offset = params[1], compute_dtype = "f64" }
    assert.equal(0, al.max_abs_diff(out, fout))
    local dout = al.randn(out:size(), { dtype = "f64" })
    local g = dpa:backward(input, dout)
    assert.are.same({ 2, 6, 3, 4, 8 }, g.qkv_layer:size())
    assert(dpa.gradients == g)
    assert(al.max_abs_diff(gparams[1], al.zeros({ 4 })) > 0, "no offset gradient accumulated")
    assert.equal(0, al.max_abs_diff(gparams[1], g.softmax_offset))
    dpa:backward(input, dout)
    assert(al.max_abs_diff(gparams[1], g.softmax_offset:to("f64"):mul(2)) < 1e-6)
    dpa:zeroGradParameters()
    assert.equal(0, al.max_abs_diff(gparams[1], al.zeros({ 4 })))
    -- module checks against its configuration
    assert.has_error(function() dpa:forward{ qkv_layer = al.randn({ 2, 6, 3, 2, 8 }) } end)
    -- dropout off in evaluate mode
    local d2 = al.DotProductAttention{ num_attention_heads = 4, kv_channels = 8, qkv_format = "bshd", attention_dropout = 0.5 }
    d2:evaluate()
    local o1 = d2:forward(input)
    local o2 = d2:forward(input)
    assert.equal(0, al.max_abs_diff(o1, o2))
  end)
end)

describe("attention.forward with a KV cache", function()
  it("rejects packed inputs together with inference_params, as TE does", function()
    local qkv = al.randn({2, 8, 3, 2, 4})
    local ok, err = pcall(al.attention.forward, {qkv_layer = qkv, qkv_format = "bshd", inference_params = {}})
    assert.is_false(ok)
    assert.matches("not supported with KV caching %(inference_params%)", err)
    -- the same inputs without a cache are fine
    assert.is_true(pcall(al.attention.forward, {qkv_layer = qkv, qkv_format = "bshd"}))
  end)
end)
