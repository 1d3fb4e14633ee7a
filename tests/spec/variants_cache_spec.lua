-- variants_cache_spec.lua — the generated code of a variant is cached per traced form (attnlab.variants.variant):
-- every call traces score_mod / mask_mod again, so a changed constant, a capture of another shape, a param
-- capture or a changed generation switch gives new code, while an unchanged form reuses its code with this
-- call's captured tensors (their current contents: checked against the built-in CPU backend and against a
-- build from an empty cache).
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"
local V = require "attnlab.variants"

local function rnd(shape) return al.randn(shape, { dtype = "f64" }) end
local function copy(a, extra)
  local t = {}
  for k, v in pairs(a) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end
local function inputs(h, s)
  return { query_layer = rnd({ 2, s, h, 8 }), key_layer = rnd({ 2, s, h, 8 }), value_layer = rnd({ 2, s, h, 6 }),
    qkv_format = "bshd", attn_mask_type = "no_mask", compute_dtype = "f64" }
end
local function build(sm, mm) return V.build(al, sm, mm, "variants_cache_spec") end

describe("variants: generated code cached per traced form", function()
  before_each(function() V.gen_cache_clear() end)

  it("the same form twice: one cached form, the same code, a new variant with this call's captures", function()
    local slopes1, slopes2 = rnd({ 4 }), rnd({ 4 })
    local cur = slopes1
    local f = function(s, b, h, q, kv) return s - cur[h] * al.abs(kv - q) end
    local v1 = build(f)
    assert.equal(1, V.gen_cache_size())
    cur = slopes2
    local v2 = build(f)
    assert.equal(1, V.gen_cache_size())
    assert.are_not.equal(v1, v2)
    assert.are.same(v1:source(), v2:source())
    assert.equal(slopes1, v1.captures[1].tensor)
    assert.equal(slopes2, v2.captures[1].tensor)
    -- another function with the same expression is the same form
    local g = function(s, b, h, q, kv) return s - cur[h] * al.abs(kv - q) end
    assert.are.same(v1:source(), build(g):source())
    assert.equal(1, V.gen_cache_size())
  end)

  it("a changed upvalue constant gives new code", function()
    local cap = 30
    local f = function(s) return cap * al.tanh(s / cap) end
    local s30 = build(f):source()
    cap = 50
    local s50 = build(f):source()
    assert.equal(2, V.gen_cache_size())
    assert.truthy(s30.score_mod:find("30", 1, true), s30.score_mod)
    assert.truthy(s50.score_mod:find("50", 1, true), s50.score_mod)
    assert.falsy(s50.score_mod:find("30", 1, true), s50.score_mod)
    cap = 30
    assert.are.same(s30, build(f):source())
    assert.equal(2, V.gen_cache_size())
  end)

  it("a capture of another shape gives new strides; of another dtype kind, another C type", function()
    local bias = rnd({ 4, 13 })
    local f = function(s, b, h, q, kv) return s + bias[h][kv - q + 7] end
    local a = build(f):source().score_mod
    assert.truthy(a:find("h * 13", 1, true), a)
    bias = rnd({ 4, 15 })
    local b = build(f):source().score_mod
    assert.truthy(b:find("h * 15", 1, true), b)
    bias = al.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "i32" })
    local c = build(f):source().score_mod
    assert.truthy(c:find("const int *", 1, true), c)
    assert.equal(3, V.gen_cache_size())
  end)

  it("a param capture has a capture gradient, the same form without param none; gradients land in this call's tensor",
    function()
      al.manual_seed(21)
      local S, H = 6, 4
      local a = inputs(H, S)
      local rel = rnd({ H, 2 * S - 1 })
      local f = function(s, b, h, q, kv) return s + rel[h][kv - q + S] end
      assert.is_nil(build(f):source().capture_grad)
      rel = al.attention.param(rnd({ H, 2 * S - 1 }))
      assert.truthy(build(f):source().capture_grad)
      assert.equal(2, V.gen_cache_size())
      -- two calls of the cached param form, each with its own tensor: each gradient equals a build from an empty
      -- cache, and is keyed by its own tensor
      local dout = rnd({ 2, S, H * 6 })
      local grads = {}
      for i = 1, 2 do
        rel = al.attention.param(rnd({ H, 2 * S - 1 }))
        local mine = rel
        local _, ctx = al.attention.forward(copy(a, { score_mod = f }))
        local g = al.attention.backward(ctx, dout)
        assert.truthy(g.captures[mine], "the gradient is keyed by this call's tensor")
        V.gen_cache_clear()
        local _, ctx2 = al.attention.forward(copy(a, { score_mod = f }))
        local g2 = al.attention.backward(ctx2, dout)
        assert.equal(0, al.max_abs_diff(g.captures[mine], g2.captures[mine]))
        assert.equal(0, al.max_abs_diff(g.query_layer, g2.query_layer))
        grads[i] = g.captures[mine]
      end
      assert(al.max_abs_diff(grads[1], grads[2]) > 0, "two different biases gave the same gradient")
    end)

  it("a captured tensor changed in place between two calls: the second call reads the new values", function()
    al.manual_seed(5)
    local H = 4
    local a = inputs(H, 7)
    local slopes = al.rand({ H }) + 0.05   -- (f32: what alibi_slopes takes)
    local f = function(s, b, h, q, kv) return s - slopes[h] * al.abs(kv - q) end
    for round = 1, 2 do
      if round == 2 then slopes:copy_(slopes * 3) end   -- in place: the same tensor, the same form
      local out = al.attention.forward(copy(a, { score_mod = f }))
      local want = al.attention.forward(copy(a, { core_attention_bias_type = "alibi", alibi_slopes = slopes }))
      local d = al.max_abs_diff(out, want)
      assert(d <= 1e-12, string.format("round %d: %g from the built-in ALiBi", round, d))
    end
    assert.equal(1, V.gen_cache_size())
  end)

  it("a generation switch (ATTNLAB_VARIANT_FOLD, ATTNLAB_VARIANT_DEFINES) changed after a call gives new code", function()
    local f = function(s) return 30 * al.tanh(s / 30) end
    local s1 = build(f):source()
    assert.truthy(s1.score_pre)
    with_env("ATTNLAB_VARIANT_FOLD", "0", function() assert.is_nil(build(f):source().score_pre) end)
    with_env("ATTNLAB_VARIANT_DEFINES", "AL_SM90_PIPE=0", function()
      assert.truthy(build(f):source().prelude:find("#define AL_SM90_PIPE 0", 1, true))
    end)
    assert.are.same(s1, build(f):source())
    assert.equal(3, V.gen_cache_size())
  end)

  it("a mask_mod form, and score_mod + mask_mod: cached and right (block mask and oracle against brute force)", function()
    local doc = al.tensor({ 1, 1, 1, 2, 2, 3, 3 }, { dtype = "i32" })
    local mm = function(b, h, q, kv) return al.land(al.eq(doc[q], doc[kv]), al.ge(q, kv)) end
    local sm = function(s) return 20 * al.tanh(s / 20) end
    local a = inputs(2, 7)
    local first = al.attention.forward(copy(a, { mask_mod = mm, score_mod = sm }))
    local n = V.gen_cache_size()
    local second = al.attention.forward(copy(a, { mask_mod = mm, score_mod = sm }))
    assert.equal(n, V.gen_cache_size())
    assert.equal(0, al.max_abs_diff(first, second))
    -- the cached mask against the same mask as a boolean tensor, by hand
    local d = doc:totable()
    local keep = {}
    for i = 1, 7 do keep[i] = {} for j = 1, 7 do keep[i][j] = d[i] == d[j] and i >= j end end
    local bm = al.attention.block_mask(mm, 1, 1, 7, 7, { block = 1 })
    local t = bm.mask:to("f64"):totable()
    for i = 1, 7 do
      for j = 1, 7 do
        assert.equal(keep[i][j], t[1][1][i][j] ~= 0, string.format("(%d, %d)", i, j))
      end
    end
  end)

  it("the same function prints the same C whatever was traced before (nodes of earlier traces do not reorder it)",
    function()
      local doc = al.tensor({ 1, 1, 2, 2 }, { dtype = "i32" })
      local f = function(b, h, q, kv) return al.land(al.eq(doc[q], doc[kv]), al.ge(q, kv)) end
      local first = build(nil, f):source().mask_mod
      assert.equal("((((const int *)AL_CAP(0))[q_idx] == ((const int *)AL_CAP(0))[kv_idx]) && (q_idx >= kv_idx))", first)
      -- a later trace holds one operand's node; the rest of f's nodes are collected: traced again, f must not
      -- find that older node and put it first
      local keep = build(nil, function(b, h, q, kv) return al.ge(q, kv) end)
      V.gen_cache_clear()
      collectgarbage()
      collectgarbage()
      assert.equal(first, build(nil, f):source().mask_mod)
      assert.truthy(keep)
    end)

  it("a build nested in a trace (score_mod calling al.attention.variant) leaves the outer trace whole", function()
    local bias = rnd({ 4, 13 })
    local plain = function(s, b, h, q, kv) return 30 * al.tanh(s / 30) + bias[h][kv - q + 7] end
    local want = build(plain):source()
    V.gen_cache_clear()
    local inner_src
    local nested = function(s, b, h, q, kv)
      local t = 30 * al.tanh(s / 30)
      inner_src = al.attention.variant({ mask_mod = function(_, _, qi, ki) return al.ge(qi, ki) end }):source()
      return t + bias[h][kv - q + 7]
    end
    assert.are.same(want, build(nested):source())
    assert.equal("(q_idx >= kv_idx)", inner_src.mask_mod)
    -- and an error inside a nested build does not leave the next outermost build without its fresh table
    assert.has_error(function() build(function(s) return al.attention.variant({ mask_mod = 1 }) and s end) end)
    V.gen_cache_clear()
    assert.are.same(want, build(plain):source())
  end)

  it("keeps no captured tensor alive", function()
    local weak = setmetatable({}, { __mode = "k" })
    do
      local rel = al.attention.param(rnd({ 4, 11 }))
      local plain = rnd({ 4 })
      weak[rel], weak[plain] = true, true
      build(function(s, b, h, q, kv) return s * plain[h] + rel[h][kv - q + 6] end)
      assert.equal(1, V.gen_cache_size())
    end
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(weak), "the cache holds a captured tensor")
    assert.equal(1, V.gen_cache_size())
  end)

  it("a trace puts math.* back as it found it, a user's own replacement included, and math.* still explains itself",
    function()
      local orig_tanh, orig_floor = math.tanh, math.floor
      local mine = function(x) return orig_floor(x) end
      math.floor = mine   -- luacheck: ignore 122
      local ok, err = pcall(function()
        local k = math.floor(2.5)   -- (a number: the user's function runs during the trace)
        build(function(s) return s * k end)
        assert.equal(mine, math.floor)
        assert.equal(orig_tanh, math.tanh)
        local e = select(2, pcall(build, function(s) return math.tanh(s) end))
        assert.truthy(tostring(e):find("math.tanh cannot take a symbolic value", 1, true), tostring(e))
        assert.equal(orig_tanh, math.tanh)
      end)
      math.floor = orig_floor   -- luacheck: ignore 122
      assert(ok, err)
    end)

  it("holds at most 256 forms", function()
    for i = 1, 300 do build(function(s) return s * (i + 0.5) end) end
    assert(V.gen_cache_size() <= 256, V.gen_cache_size())
    assert(V.gen_cache_size() >= 1)
  end)
end)
