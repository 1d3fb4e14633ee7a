-- variants_spec.lua — attention variants (lua/attnlab/variants.lua): the tracer and its error
-- messages, simplification and CUDA code generation, symbolic derivatives against finite
-- differences, the CPU oracle against the built-in CPU backend where an equivalent exists (forward
-- and every gradient, fresh random inputs), block masks against brute force, the attention /
-- module integration, and (#gpu) the flash backend against the CPU oracle for every example variant.
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"
local ffi = require "ffi"

local function rnd(shape, dtype) return al.randn(shape, { dtype = dtype or "f64" }) end
local function copy(a, extra)
  local t = {}
  for k, v in pairs(a) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end
local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end
local function src(args) return al.attention.variant(args):source() end

-- bshd inputs b, s, h (hg), d
local function inputs(o)
  o = o or {}
  local b, sq, skv, h, hg, d, dv = o.b or 2, o.sq or 7, o.skv or o.sq or 7, o.h or 4, o.hg or o.h or 4, o.d or 8, o.dv or 6
  return { query_layer = rnd({ b, sq, h, d }), key_layer = rnd({ b, skv, hg, d }), value_layer = rnd({ b, skv, hg, dv }),
    qkv_format = "bshd", attn_mask_type = "no_mask", compute_dtype = "f64" }
end

-- forward + backward of two calls with the same dout: every output and gradient must agree
local function same(a1, a2, tol, keys)
  tol = tol or 1e-12
  local o1, c1 = al.attention.forward(a1)
  local o2, c2 = al.attention.forward(a2)
  assert(al.max_abs_diff(o1, o2) <= tol, "outputs differ: " .. al.max_abs_diff(o1, o2))
  local l1, l2 = c1.lse:flat_values(), c2.lse:flat_values()
  for i = 1, #l1 do
    assert(l1[i] == l2[i] or math.abs(l1[i] - l2[i]) <= tol, "lse differs at " .. i .. ": " .. l1[i] .. " vs " .. l2[i])
  end
  local dout = rnd(o1:size())
  local g1, g2 = al.attention.backward(c1, dout), al.attention.backward(c2, dout)
  for _, k in ipairs(keys or { "query_layer", "key_layer", "value_layer" }) do
    assert(g1[k] and g2[k], "missing gradient " .. k)
    local d = al.max_abs_diff(g1[k], g2[k])
    assert(d <= tol, k .. " differs by " .. d)
  end
  return o1, g1, g2, c1, c2
end

describe("variants: tracer and code generation", function()
  it("prints score_mod / mask_mod as CUDA C with 0-based indices", function()
    local slopes = al.tensor({ 0.5, 0.25, 0.125, 0.0625 })
    local s = src({ score_mod = function(score, b, h, q, kv) return score - slopes[h] * al.abs(kv - q) end,
      mask_mod = function(b, h, q, kv) return al.ge(q, kv) end })
    assert.equal("(score - (((const float *)AL_CAP(0))[h] * al_v_iabs((kv_idx - q_idx))))", s.score_mod)
    assert.is_nil(s.score_grad)                 -- additive: NULL = grad
    assert.equal("(q_idx >= kv_idx)", s.mask_mod)  -- (q + 1) >= (kv + 1) normalised
    assert.truthy(s.prelude:find("al_v_iabs", 1, true))
    assert.is_nil(s.capture_grad)
  end)

  it("folds constants and keeps integer index arithmetic integer", function()
    local bias = al.randn({ 3, 4, 5 })
    local s = src({ score_mod = function(score, b, h, q, kv) return score * 1 + 2 * 3 + 0 * kv + bias[b][h][kv - q + 2] end })
    assert.equal("((score + ((const float *)AL_CAP(0))[(((((b * 20) + (h * 5)) + kv_idx) - q_idx) + 1)]) + 6)", s.score_mod)
    local s2 = src({ score_mod = function(score, b, h, q, kv) return score + (h + 1) - 1 - h end })
    assert.is_nil(s2.score_mod)   -- the identity: no hook
    local s3 = src({ score_mod = function(score, b, h, q, kv) return score / 4 + q / 2 end })
    -- division by a constant is a multiplication by its reciprocal; by anything else __fdividef
    assert.equal("((score * 0.25f) + ((float)(q_idx + 1) * 0.5f))", s3.score_mod)
    local s4 = src({ score_mod = function(score, b, h, q, kv) return score / (kv + 1) end })
    assert.equal("__fdividef(score, (float)(kv_idx + 2))", s4.score_mod)
    -- a constant whose reciprocal is not a normal f32 keeps a real division (1 / 1e-40 overflows)
    local s5 = src({ score_mod = function(score) return score / 1e-40 end })
    assert.truthy(s5.score_mod:find("__fdividef(score, ", 1, true), s5.score_mod)
    local s6 = src({ score_mod = function(score) return score / 0 end })
    assert.truthy(s6.score_mod:find("__fdividef(score, ", 1, true), s6.score_mod)
  end)

  it("integer captures are read as int, float ones as float; strides are contiguous", function()
    local doc = al.tensor({ { 1, 1, 2 }, { 3, 3, 3 } }, { dtype = "i64" })
    local s = src({ mask_mod = function(b, h, q, kv) return al.eq(doc[b][q], doc[b][kv]) end })
    assert.equal("(((const int *)AL_CAP(0))[((b * 3) + q_idx)] == ((const int *)AL_CAP(0))[((b * 3) + kv_idx)])", s.mask_mod)
  end)

  it("derives score_grad for non-additive mods and capture_grad for parameters", function()
    local s = src({ score_mod = function(score) return 30 * al.tanh(score / 30) end })
    assert.equal("(grad * (1.0f - (al_v_tanh((score * 0.0333333333f)) * al_v_tanh((score * 0.0333333333f)))))", s.score_grad)
    -- the fast tanh comes with the variant's prelude
    assert.truthy(s.prelude and s.prelude:find("float al_v_tanh(float x)", 1, true), tostring(s.prelude))
    local w = al.attention.param(al.randn({ 4 }))
    local s2 = src({ score_mod = function(score, b, h) return score * w[h] end })
    assert.equal("(grad * ((const float *)AL_CAP(0))[h])", s2.score_grad)
    assert.equal("{ atomicAdd(AL_CAP_GRAD(0) + h, (score * grad)); }", s2.capture_grad)
  end)

  it("writes the folded form: constant factors on score into scale, a positive outer factor as score_post", function()
    -- soft-capping: tanh(acc * (scale / 30)) * 30, so the kernel spends one FMUL and a tanh per score
    local s = src({ score_mod = function(score) return 30 * al.tanh(score / 30) end })
    assert.equal("al_v_tanh((acc * (scale * 0.0333333333f)))", s.score_pre)
    assert.equal(30, s.score_post)
    -- and its gradient in the same terms, so that the backward's logit and gradient share the tanh in their folded
    -- form (the default since session 24); ATTNLAB_VARIANT_FOLD_GRAD=0 leaves it out
    assert.equal("(grad * (1.0f - (al_v_tanh((acc * (scale * 0.0333333333f))) * al_v_tanh((acc * (scale * " ..
      "0.0333333333f))))))", s.score_grad_pre)
    with_env("ATTNLAB_VARIANT_FOLD_GRAD", "0", function()
      local f = src({ score_mod = function(score) return 30 * al.tanh(score / 30) end })
      assert.is_nil(f.score_grad_pre)
      assert.equal(s.score_pre, f.score_pre)
      assert.equal(s.score_grad, f.score_grad)
    end)
    -- a score_mod with its own MUFU operation moves an eighth of the forward's exponentials to the FMA pipe
    assert.truthy(s.prelude:find("#define AL_EX2_FMA_EVERY 8", 1, true), s.prelude)
    -- a negative outer factor stays inside (the kernels take the row max before score_post)
    local s2 = src({ score_mod = function(score) return -2 * score end })
    assert.equal("(-(acc * (scale * 2.0f)))", s2.score_pre)
    assert.equal(1, s2.score_post)
    -- a bare score is acc * scale; other terms are untouched
    local sl = al.randn({ 4 })
    local s3 = src({ score_mod = function(score, b, h, q, kv) return score + sl[h] * (kv - q) end })
    assert.equal("((acc * scale) + (((const float *)AL_CAP(0))[h] * (kv_idx - q_idx)))", s3.score_pre)
    assert.equal(1, s3.score_post)
    assert.is_nil(s3.score_grad_pre)   -- an additive score_mod has no score_grad: nothing to fold
    assert.is_nil(s3.prelude)   -- no MUFU operation of its own: all exponentials stay on the MUFU
    local s4 = src({ score_mod = function(score, b, h, q, kv) return 2 * al.where(al.gt(q, kv), score, score / 4) end })
    assert.equal("((q_idx > kv_idx) ? (acc * scale) : (acc * (scale * 0.25f)))", s4.score_pre)
    assert.equal(2, s4.score_post)
    -- no score left in it: the same text as score_grad, and the backward still takes the folded logit
    assert.equal("(grad * (2 * ((q_idx > kv_idx) ? 1.0f : 0.25f)))", s4.score_grad_pre)
    -- a constant that cannot fold (1 / 1e-40 is not an f32 number) is left as a division
    local s5 = src({ score_mod = function(score) return score / 1e-40 end })
    assert.truthy(s5.score_pre:find("__fdividef((acc * scale), ", 1, true), s5.score_pre)
    -- no score_mod, no folded form
    local s6 = src({ mask_mod = function(b, h, q, kv) return al.ge(q, kv) end })
    assert.is_nil(s6.score_pre)
    assert.is_nil(s6.score_post)
  end)

  it("proves the new logit's bounds by interval arithmetic (the flash forward's fixed softmax max)", function()
    local s = src({ score_mod = function(score) return 30 * al.tanh(score / 30) end })
    assert.equal(-30, s.score_lo)
    assert.equal(30, s.score_hi)
    local s2 = src({ score_mod = function(score, b, h, q, kv) return al.where(al.ge(q, kv), 2 * al.tanh(score) + 1, -1) end })
    assert.equal(-1, s2.score_lo)
    assert.equal(3, s2.score_hi)
    -- unbounded: the score itself, exp of it, a capture read (data, which may change after the build)
    local bias = al.randn({ 4 })
    for _, f in ipairs({ function(score) return 2 * score end, function(score) return al.exp(al.tanh(score)) + score end,
      function(score, b, h) return al.tanh(score) + bias[h] end }) do
      local x = src({ score_mod = f })
      assert.is_nil(x.score_lo)
      assert.is_nil(x.score_hi)
    end
    assert.is_nil(src({ mask_mod = function(b, h, q, kv) return al.ge(q, kv) end }).score_hi)
  end)

  it("says whether score_mod itself uses the MUFU (al_attn_variant.score_mufu: the Hopper forward's consumers)", function()
    local slopes = al.tensor({ 0.5, 0.25, 0.125, 0.0625 })
    -- tanh / exp / log / sqrt in score_mod count, wherever they sit in the expression
    for _, f in ipairs({ function(score) return 30 * al.tanh(score / 30) end, function(score) return score + al.exp(-score) end,
      function(score, b, h, q, kv) return score - al.log(1 + al.abs(q - kv)) end,
      function(score, b, h, q, kv) return al.where(al.ge(q, kv), score, al.sqrt(al.abs(score))) end }) do
      local v = al.attention.variant({ score_mod = f })
      assert.is_true(v:source().score_mufu)
      assert.truthy(tostring(v):find("mufu         score_mod uses the MUFU", 1, true), tostring(v))
    end
    -- arithmetic, min / max / abs, capture reads do not; nor a mask_mod's math beside them
    for _, a in ipairs({ { score_mod = function(score, b, h, q, kv) return score - slopes[h] * al.abs(kv - q) end },
      { score_mod = function(score) return al.min(al.max(score, -5), 5) * 2 end },
      { score_mod = function(score) return score * 2 end,
        mask_mod = function(b, h, q, kv) return al.ge(al.sqrt(q), al.sqrt(kv)) end },
      { mask_mod = function(b, h, q, kv) return al.ge(q, kv) end } }) do
      local v = al.attention.variant(a)
      assert.is_false(v:source().score_mufu)
      assert.falsy(tostring(v):find("mufu", 1, true), tostring(v))
    end
  end)

  it("ATTNLAB_VARIANT_DEFINES puts the allowed build switches in the prelude and names what it rejects", function()
    local sc = { score_mod = function(score) return 30 * al.tanh(score / 30) end }
    local plain = src(sc).prelude
    with_env("ATTNLAB_VARIANT_DEFINES", "AL_SM90_LEAN_MOD=0, AL_SM90_PINGPONG=0", function()
      local p = src(sc).prelude
      assert.truthy(p:find("#define AL_SM90_LEAN_MOD 0\n", 1, true), p)
      assert.truthy(p:find("#define AL_SM90_PINGPONG 0\n", 1, true), p)
      assert.truthy(p:find(plain, 1, true))     -- the rest unchanged
      -- a mask_mod-only variant (no prelude of its own) gets one
      assert.truthy(src({ mask_mod = function(b, h, q, kv) return al.ge(q, kv) end }).prelude:find("AL_SM90_PINGPONG", 1, true))
      assert.falsy(p:find("al_tanh_fma", 1, true))
    end)
    -- the FMA-pipe tanh: defined first, then the macro that picks it where the forward asks
    with_env("ATTNLAB_VARIANT_DEFINES", "AL_TANH_FMA_EVERY=4", function()
      local p = src(sc).prelude
      local d, m = p:find("#define AL_TANH_FMA_EVERY 4", 1, true), p:find("#define al_v_tanh(x) (al_tanh_fma_now ?", 1, true)
      assert.truthy(d and m and d < m and p:find("float al_v_tanh(float x)", 1, true) < m, p)
    end)
    for _, bad in ipairs({ "AL_SM90_BN=64", "AL_SM90_PIPE=x", "AL_SM90_PIPE", "AL_SM90_PIPE=-1" }) do
      with_env("ATTNLAB_VARIANT_DEFINES", bad, function()
        local e = err_of(src, sc)
        assert.truthy(e:find("ATTNLAB_VARIANT_DEFINES", 1, true) and e:find("'" .. bad .. "'", 1, true), e)
        assert.truthy(e:find("AL_BWD_EX2_FMA_EVERY, AL_SM90_BWD_CONSUMER_REGS, AL_SM90_BWD_DQ_ONE_PASS, " ..
          "AL_SM90_BWD_EARLY_DP, AL_SM90_BWD_PINGPONG, AL_SM90_LEAN_MOD, AL_SM90_PINGPONG, AL_SM90_PIPE, " ..
          "AL_TANH_FMA_EVERY", 1, true), e)
      end)
    end
  end)

  it("where / land / lor / lnot / min / max / sqrt / exp / log / % / ^ generate C", function()
    local s = src({ score_mod = function(score, b, h, q, kv)
      return al.where(al.lor(al.lnot(al.lt(q, kv)), al.eq(q % 2, 0)), al.max(score, -5) ^ 2 + al.sqrt(al.exp(score)),
        al.min(score, al.log(2 + kv)))
    end })
    for _, want in ipairs({ "?", "||", "!", "al_v_imod", "fmaxf", "sqrtf", "expf", "fminf", "logf" }) do
      assert.truthy(s.score_mod:find(want, 1, true), want .. " missing in " .. s.score_mod)
    end
    assert.truthy(s.score_grad)
  end)

  it("explains unsupported constructs", function()
    -- GLOBAL_T: a deliberate global (set and cleared below), read by a score_mod as a global, not an upvalue
    -- luacheck: globals GLOBAL_T
    local t = al.randn({ 4 })
    local cases = {
      { function(s, b, h, q, kv) if al.lt(q, kv) then return s end return -math.huge end, "al.where" },
      { function(s, b, h, q, kv) if q < kv then return s end return s end, "al.lt" },
      { function(s, b, h, q, kv) return s + (q == kv and 1 or 0) end, nil },   -- == on sym vs sym raises
      { function(s) return math.exp(s) end, "use al.exp" },
      { function(s) return 2 ^ s + s ^ s end, "exponent" },
      { function(s, b, h, q, kv) return t[q / 2] end, "integer expressions" },
      { function(s) return s:exp() end, "al.exp(x)" },
      { function(s, b, h) return t[h][h] end, "cannot be indexed" },
      { function(s) end, "returned nothing" },
      { function(s, b, h, q, kv) return al.lt(q, kv) and s or 0 end, "al.where" },
      { function(s, b, h) return t[9] end, "outside 1..4" },
      { function(s, b, h) return s + GLOBAL_T.deep.t[h] end, "al.attention.capture" },   -- too deep to scan
      { function(s, b, h, q, kv) return al.ge(q, kv) end, "is a mask_mod" },   -- a mask given as score_mod
      { function() return true end, "returned a condition" },
    }
    _G.GLOBAL_T = { deep = { t = al.randn({ 4 }) } }
    for i, c in ipairs(cases) do
      local e = err_of(al.attention.variant, { score_mod = c[1] })
      assert.truthy(e:find("score_mod", 1, true), "case " .. i .. ": " .. e)
      if c[2] then assert.truthy(e:find(c[2], 1, true), "case " .. i .. ": " .. e) end
    end
    _G.GLOBAL_T = nil
    assert.truthy(err_of(al.attention.variant, { mask_mod = 3 }):find("mask_mod: expected a function", 1, true))
    -- the explicit wrapper reaches what the upvalue scan cannot
    local holder = { deep = { t = al.randn({ 4 }) } }
    local w = al.attention.capture(holder.deep.t)
    local s = src({ score_mod = function(score, b, h) return score + w[h] end })
    assert.truthy(s.score_mod:find("AL_CAP(0)", 1, true))
  end)

  it("leaves the tensor functions of the same names working", function()
    local x = al.tensor({ 0.5, -1, 2 }, { dtype = "f64" })
    assert.are.same({ math.exp(0.5), math.exp(-1), math.exp(2) }, al.exp(x):flat_values())
    assert.equal(math.exp(1), al.exp(1))
    assert.equal(2, al.abs(-2))
    assert.are.same({ 0, 1, 0 }, al.lt(x, 0):to("f64"):flat_values())
    assert.is_true(al.lt(1, 2))
    assert.are.same({ 0, -1, 0 }, al.min(x, al.zeros({ 3 }, { dtype = "f64" })):flat_values())
    assert.equal(3, al.max(1, 3))
    assert.are.same({ 0.5, 0, 2 }, al.where(al.gt(x, 0), x, 0):flat_values())
    assert.equal(1, al.where(true, 1, 2))
    assert.is_false(al.land(true, false))
    assert.is_true(al.lor(0, 1))
    assert.equal(math.sqrt(2), al.sqrt(2))
  end)
end)

describe("variants: derivatives against finite differences (f64, CPU oracle)", function()
  -- L = sum(out * W); central differences on q, k, v and every parameter capture
  local function fd(args, params, stride)
    local out, ctx = al.attention.forward(args)
    local W = rnd(out:size())
    local w = W:flat_values()
    local g = al.attention.backward(ctx, W)
    local function loss()
      local o = al.attention.forward(args):flat_values()
      local s = 0
      for i = 1, #o do s = s + o[i] * w[i] end
      return s
    end
    local n = 0
    local function check(t, gt, name)
      local flat = t:view(t:numel())
      local gf = gt:to("f64"):contiguous():view(t:numel()):flat_values()
      for i = 1, t:numel(), stride or 7 do
        local e = flat:narrow(1, i, 1)
        local x0 = e:item()
        e:fill_(x0 + 1e-6)
        local lp = loss()
        e:fill_(x0 - 1e-6)
        local lm = loss()
        e:fill_(x0)
        local f = (lp - lm) / 2e-6
        assert(math.abs(f - gf[i]) <= 1e-6 + 1e-5 * math.abs(f),
          string.format("%s[%d]: analytic %.10g vs finite difference %.10g", name, i, gf[i], f))
        n = n + 1
      end
    end
    check(args.query_layer, g.query_layer, "dq")
    check(args.key_layer, g.key_layer, "dk")
    check(args.value_layer, g.value_layer, "dv")
    for _, p in ipairs(params or {}) do if g.captures[p] then check(p, g.captures[p], "dcapture") end end
    return n
  end

  it("soft-capping, a multiplicative per-head temperature, exp/log/sqrt/min/max/where mixes", function()
    al.manual_seed(11)
    local temp = al.attention.param(rnd({ 4 }) * 0.3 + 1)
    local bias = al.attention.param(rnd({ 4, 7 }))
    local mods = {
      function(s) return 3 * al.tanh(s / 3) end,
      function(s, b, h) return s * temp[h] end,
      function(s, b, h, q, kv) return al.where(al.ge(q, kv), al.max(s, -1) + al.sqrt(al.exp(s * 0.5) + 1), al.min(s, 0.5) * 2) end,
      function(s, b, h, q, kv) return s + al.log(1 + bias[h][kv] * bias[h][kv]) - 0.1 * (s - bias[h][q]) ^ 2 end,
      function(s, b, h, q, kv) return (s + 3) / (2 + al.abs(bias[h][kv])) end,
    }
    local n = 0
    for _, m in ipairs(mods) do
      local a = inputs({ b = 1, sq = 5, skv = 7, h = 4, hg = 2, d = 4, dv = 3 })
      a.score_mod = m
      n = n + fd(a, { temp, bias }, 5)
    end
    assert(n > 150, n)
  end)
end)

describe("variants: the CPU oracle against the built-in CPU backend", function()
  it("mask_mod causal == attn_mask_type causal (and bottom-right), with GQA and sq ~= skv", function()
    al.manual_seed(1)
    local a = inputs({ sq = 6, skv = 9, h = 6, hg = 2 })
    same(copy(a, { attn_mask_type = "causal" }), copy(a, { mask_mod = function(b, h, q, kv) return al.ge(q, kv) end }))
    same(copy(a, { attn_mask_type = "causal_bottom_right" }),
      copy(a, { mask_mod = function(b, h, q, kv) return al.ge(q + 3, kv) end }))
    -- mask_mod composes with the built-in causal mask (both must keep)
    same(copy(a, { attn_mask_type = "causal", window_size = { 2, 0 } }),
      copy(a, { attn_mask_type = "causal", mask_mod = function(b, h, q, kv) return al.le(q - kv, 2) end }))
  end)

  it("score_mod ALiBi == core_attention_bias_type alibi", function()
    al.manual_seed(2)
    local a = inputs({ h = 4 })
    local slopes = al.tensor({ 0.3, 0.7, 1.1, 0.05 })
    same(copy(a, { core_attention_bias_type = "alibi", alibi_slopes = slopes }),
      copy(a, { score_mod = function(s, b, h, q, kv) return s - slopes[h] * al.abs(kv - q) end }))
  end)

  it("a tensor held in a global (as in the REPL) is captured too, and the function's environment is restored", function()
    al.manual_seed(9)
    local a = inputs({ h = 4 })
    local slopes = al.rand({ 4 }) + 0.05
    rawset(_G, "__variants_spec_slopes", slopes)
    local f = load("local al = ... return function(s, b, h, q, kv) return s - __variants_spec_slopes[h] * al.abs(kv - q) end")(al)
    local env_before = getfenv(f)
    local ok, err = pcall(same, copy(a, { core_attention_bias_type = "alibi", alibi_slopes = slopes }),
      copy(a, { score_mod = f }))
    rawset(_G, "__variants_spec_slopes", nil)
    assert(ok, err)
    assert.equal(env_before, getfenv(f))
  end)

  it("a learnable relative bias == post_scale_bias, and its gradient == dbias summed per distance", function()
    al.manual_seed(3)
    local S, H = 7, 4
    local a = inputs({ sq = S, h = H })
    local rel = al.attention.param(rnd({ H, 2 * S - 1 }))
    local r, fb = rel:totable(), {}
    for h = 1, H do fb[h] = {} for i = 1, S do fb[h][i] = {} for j = 1, S do fb[h][i][j] = r[h][j - i + S] end end end
    local full = al.tensor({ fb }, { dtype = "f64" })
    local _, g1, g2 = same(copy(a, { core_attention_bias_type = "post_scale_bias", core_attention_bias = full }),
      copy(a, { score_mod = function(s, b, h, q, kv) return s + rel[h][kv - q + S] end }))
    local db = g1.core_attention_bias:totable()[1]
    local got = g2.captures[1]:totable()
    assert.equal(g2.captures[1], g2.captures[rel])
    for h = 1, H do
      for d = 1, 2 * S - 1 do
        local want = 0
        for i = 1, S do local j = d - S + i if j >= 1 and j <= S then want = want + db[h][i][j] end end
        assert(math.abs(got[h][d] - want) < 1e-12, string.format("drel[%d][%d] %g vs %g", h, d, got[h][d], want))
      end
    end
  end)

  it("sliding window mask_mod == window_size", function()
    al.manual_seed(4)
    local a = inputs({ sq = 12 })
    same(copy(a, { attn_mask_type = "causal", window_size = { 3, 0 } }),
      copy(a, { mask_mod = function(b, h, q, kv) return al.land(al.ge(q, kv), al.le(q - kv, 3)) end }))
    same(copy(a, { window_size = { 2, 1 } }),
      copy(a, { mask_mod = function(b, h, q, kv) return al.land(al.le(q - kv, 2), al.le(kv - q, 1)) end }))
  end)

  it("and_masks / or_masks / noop_mask (FlexAttention's combinators) == the masks written out and built in", function()
    al.manual_seed(41)
    local A = al.attention
    local causal = function(b, h, q, kv) return al.ge(q, kv) end
    local back3 = function(b, h, q, kv) return al.le(q - kv, 3) end
    local prefix = function(b, h, q, kv) return al.le(kv, 4) end
    -- the traced tree is the written-out one, so the generated C is too
    assert.equal(src({ mask_mod = function(b, h, q, kv) return al.land(causal(b, h, q, kv), back3(b, h, q, kv)) end }).mask_mod,
      src({ mask_mod = A.and_masks(causal, back3) }).mask_mod)
    assert.equal(src({ mask_mod = function(b, h, q, kv) return al.lor(prefix(b, h, q, kv), causal(b, h, q, kv)) end }).mask_mod,
      src({ mask_mod = A.or_masks(prefix, causal) }).mask_mod)
    local a = inputs({ sq = 12 })
    same(copy(a, { attn_mask_type = "causal", window_size = { 3, 0 } }), copy(a, { mask_mod = A.and_masks(causal, back3) }))
    same(a, copy(a, { mask_mod = A.noop_mask }))
    same(a, copy(a, { mask_mod = A.and_masks() }))          -- no mask: everything kept
    assert.is_true(A.and_masks(causal)(0, 0, 2, 1) and not A.and_masks(causal)(0, 0, 1, 2))   -- on numbers: Lua booleans
    -- or_masks() keeps nothing: zero output, lse -inf
    local out, ctx = al.attention.forward(copy(a, { mask_mod = A.or_masks() }))
    assert.equal(0, out:abs():amax():item())
    assert.equal(-math.huge, ctx.lse:amax():item())
    -- a mask's captures are found through the combinators' closures, seven masks deep
    local doc = al.tensor({ { 1, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4 }, { 1, 2, 2, 2, 2, 2, 3, 3, 4, 4, 4, 4 } }, { dtype = "i32" })
    local same_doc = function(b, h, q, kv) return al.eq(doc[b][q], doc[b][kv]) end
    local many = A.and_masks(causal, A.noop_mask, back3, causal, A.or_masks(same_doc), back3, causal)
    local v = A.variant({ mask_mod = many })
    assert.equal(1, #v.captures)
    same(copy(a, { mask_mod = function(b, h, q, kv) return al.land(al.land(causal(b, h, q, kv), back3(b, h, q, kv)),
      same_doc(b, h, q, kv)) end }), copy(a, { mask_mod = many }))
    local bm1 = A.block_mask(many, 2, 1, 12, 12, { block = 2 })
    local bm2 = A.block_mask(function(b, h, q, kv) return al.land(al.land(causal(b, h, q, kv), back3(b, h, q, kv)),
      same_doc(b, h, q, kv)) end, 2, 1, 12, 12, { block = 2 })
    assert.are.same(bm2.mask:flat_values(), bm1.mask:flat_values())
    local e = err_of(A.and_masks, causal, 3)
    assert.truthy(e:find("attention.and_masks: argument 2: expected a mask_mod function(b, h, q_idx, kv_idx), got number",
      1, true), e)
    e = err_of(A.or_masks, "causal")
    assert.truthy(e:find("attention.or_masks: argument 1:", 1, true), e)
  end)

  it("a mask_mod that keeps al.land / al.ge in locals traces (attnlab's own functions are never scanned for captures)", function()
    -- the upvalue scan used to walk into al.land's upvalues and swap the tensor ctype inside al.is_tensor for a
    -- capture proxy: "tensor.lua: attempt to index field 'raw'" instead of a variant
    local land, ge, le = al.land, al.ge, al.le
    local a = inputs({ sq = 9 })
    same(copy(a, { attn_mask_type = "causal", window_size = { 2, 0 } }),
      copy(a, { mask_mod = function(b, h, q, kv) return land(ge(q, kv), le(q - kv, 2)) end }))
    local slopes = rnd({ 4 })
    local sub, abs = function(x, y) return x - y end, al.abs
    same(copy(a, { score_mod = function(s, b, h, q, kv) return s - slopes[h] * al.abs(kv - q) end }),
      copy(a, { score_mod = function(s, b, h, q, kv) return sub(s, slopes[h] * abs(kv - q)) end }))
  end)

  it("soft-capping == the naive formula (forward)", function()
    al.manual_seed(5)
    local a = inputs({ b = 1, sq = 6, skv = 8, h = 2, d = 8, dv = 8 })
    local out = al.attention.forward(copy(a, { score_mod = function(s) return 1.5 * al.tanh(s / 1.5) end }))
    local q, k, v = a.query_layer:permute(1, 3, 2, 4), a.key_layer:permute(1, 3, 2, 4), a.value_layer:permute(1, 3, 2, 4)
    local s = al.matmul(q, k:transpose(3, 4)) * (1 / math.sqrt(8))
    local ref = al.matmul((al.tanh(s * (1 / 1.5)) * 1.5):softmax(-1), v):permute(1, 3, 2, 4):contiguous():view(1, 6, 16)
    assert(al.max_abs_diff(out, ref) < 1e-12)
  end)

  it("fully masked rows give zero output, lse -inf and zero gradients", function()
    al.manual_seed(6)
    local a = inputs({ sq = 5 })
    local out, ctx = al.attention.forward(copy(a, { mask_mod = function(b, h, q, kv) return al.ne(q, 3) end }))
    local o = out:view(2, 5, -1)
    assert.equal(0, al.max_abs_diff(o:select(2, 3), al.zeros({ 2, o:size(3) }, { dtype = "f64" })))
    assert.equal(-math.huge, ctx.lse:select(3, 3):flat_values()[1])
    local g = al.attention.backward(ctx, rnd(out:size()))
    assert.equal(0, g.query_layer:select(2, 3):abs():sum():item())
  end)

  it("sbhd, thd (cu_seqlens, padded offsets) and packed qkv_layer / kv_layer inputs", function()
    al.manual_seed(7)
    local causal = function(b, h, q, kv) return al.ge(q, kv) end
    -- sbhd
    local a = { query_layer = rnd({ 6, 2, 4, 8 }), key_layer = rnd({ 6, 2, 2, 8 }), value_layer = rnd({ 6, 2, 2, 8 }),
      qkv_format = "sbhd", compute_dtype = "f64" }
    same(copy(a, { attn_mask_type = "causal" }), copy(a, { attn_mask_type = "no_mask", mask_mod = causal }))
    -- thd with gaps: 3 sequences of 3, 5, 2 tokens in slots of 4, 6, 3
    local cu, cup = al.tensor({ 0, 3, 8, 10 }, { dtype = "i32" }), al.tensor({ 0, 4, 10, 13 }, { dtype = "i32" })
    local t = { query_layer = rnd({ 13, 4, 8 }), key_layer = rnd({ 13, 4, 8 }), value_layer = rnd({ 13, 4, 8 }),
      qkv_format = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = cup, cu_seqlens_kv_padded = cup,
      compute_dtype = "f64" }
    same(copy(t, { attn_mask_type = "padding_causal" }), copy(t, { attn_mask_type = "padding", mask_mod = causal }))
    -- bshd padding from cu_seqlens
    local p = copy(inputs({ sq = 6 }), { cu_seqlens_q = al.tensor({ 0, 4, 10 }, { dtype = "i32" }),
      cu_seqlens_kv = al.tensor({ 0, 5, 11 }, { dtype = "i32" }) })
    same(copy(p, { attn_mask_type = "padding_causal" }), copy(p, { attn_mask_type = "padding", mask_mod = causal }))
    -- packed qkv_layer: one packed gradient
    local qkv = rnd({ 2, 6, 3, 4, 8 })
    local pa = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", compute_dtype = "f64" }
    same(copy(pa, { attn_mask_type = "causal" }), copy(pa, { attn_mask_type = "no_mask", mask_mod = causal }), 1e-12,
      { "qkv_layer" })
    local kv = rnd({ 2, 6, 2, 2, 8 })
    local ka = { query_layer = rnd({ 2, 6, 4, 8 }), kv_layer = kv, qkv_interleave_dim = -3, qkv_format = "bshd", compute_dtype = "f64" }
    same(copy(ka, { attn_mask_type = "causal" }), copy(ka, { attn_mask_type = "no_mask", mask_mod = causal }), 1e-12,
      { "query_layer", "kv_layer" })
  end)

  it("f32 and bf16 inputs give outputs in their dtype, close to f64", function()
    al.manual_seed(8)
    local a = inputs({})
    local f = function(s, b, h, q, kv) return s - 0.1 * al.abs(kv - q) end
    local ref = al.attention.forward(copy(a, { score_mod = f }))
    for _, dt in ipairs({ "f32", "bf16" }) do
      local o = al.attention.forward(copy(a, { score_mod = f, compute_dtype = "f32", query_layer = a.query_layer:to(dt),
        key_layer = a.key_layer:to(dt), value_layer = a.value_layer:to(dt) }))
      assert.equal(dt, o:dtype())
      assert(al.max_abs_diff(o, ref) < (dt == "bf16" and 0.05 or 1e-5))
    end
  end)

  it("errors name the argument: dropout, bias, softmax_type, arbitrary mask, padding mask, OOB capture reads", function()
    local a = inputs({})
    local f = function(s) return s * 2 end
    local function e(extra) return err_of(al.attention.forward, copy(a, copy({ score_mod = f }, extra))) end
    assert.truthy(e({ attention_dropout = 0.1 }):find("attention_dropout", 1, true))
    assert.truthy(e({ core_attention_bias_type = "alibi" }):find("core_attention_bias_type", 1, true))
    assert.truthy(e({ softmax_type = "off-by-one" }):find("softmax_type", 1, true))
    assert.truthy(e({ attn_mask_type = "arbitrary", attention_mask = al.zeros({ 1, 1, 7, 7 }, { dtype = "u8" }) })
      :find("attn_mask_type", 1, true))
    assert.truthy(e({ attn_mask_type = "padding", attention_mask = al.zeros({ 2, 1, 1, 7 }, { dtype = "u8" }) })
      :find("attention_mask", 1, true))
    assert.truthy(e({ return_max_logit = true }):find("return_max_logit", 1, true))
    local small = al.randn({ 5 })
    local msg = e({ score_mod = function(s, b, h, q, kv) return s + small[kv] end })
    assert.truthy(msg:find("captured tensor 1 (shape 5) read at index 6 on dim 1, outside 1..5", 1, true), msg)
    assert.truthy(msg:find("kv_idx=6", 1, true), msg)
    -- reads at masked positions are never evaluated on the CPU
    al.attention.forward(copy(a, { score_mod = function(s, b, h, q, kv) return s + small[kv] end,
      mask_mod = function(b, h, q, kv) return al.le(kv, 5) end }))
  end)
end)

describe("variants: block masks", function()
  -- brute force with the user's function on plain numbers (al.ge & co. compute on numbers)
  local function brute(mm, B, H, Sq, Skv, bm, bn)
    local out = {}
    local mask = function(b, h, i, j)
      local r = mm(b, h, i, j)
      if type(r) == "boolean" then return r end
      return r ~= 0
    end
    for b = 1, B do for h = 1, H do
      for ti = 1, math.ceil(Sq / bm) do for tj = 1, math.ceil(Skv / bn) do
        local keep, drop = false, false
        for i = (ti - 1) * bm + 1, math.min(Sq, ti * bm) do
          for j = (tj - 1) * bn + 1, math.min(Skv, tj * bn) do
            if mask(b, h, i, j) then keep = true else drop = true end
          end
        end
        out[#out + 1] = (keep and drop) and 1 or (keep and 2 or 0)
      end end
    end end
    return out
  end
  local docs = { {}, {} }
  for i = 1, 40 do docs[1][i] = math.floor((i - 1) / 9); docs[2][i] = math.floor((i - 1) / 13) + 5 end
  local doc = al.tensor(docs, { dtype = "i32" })
  local doc_t = doc:totable()
  local masks = {
    causal = { function(b, h, q, kv) return al.ge(q, kv) end, false, false },
    window = { function(b, h, q, kv) return al.land(al.ge(q, kv), al.le(q - kv, 5)) end, false, false },
    prefix = { function(b, h, q, kv) return al.lor(al.le(kv, 6), al.ge(q, kv)) end, false, false },
    head = { function(b, h, q, kv) return al.ge(q + h * 4, kv) end, false, true },
    -- the document mask reads the tensor through symbolic indices; brute force reads the Lua table
    doc = { function(b, h, q, kv) return al.eq(doc[b][q], doc[b][kv]) end, true, false,
      function(b, h, q, kv) return doc_t[b][q] == doc_t[b][kv] end },
  }
  for name, m in pairs(masks) do
    it(name .. ": every tile class equals brute force (odd sizes, broadcast dims)", function()
      for _, cfg in ipairs({ { 2, 3, 40, 37, 8, 8 }, { 2, 3, 40, 40, 16, 4 }, { 2, 2, 33, 40, 5, 7 } }) do
        local B, H, Sq, Skv, bm, bn = unpack(cfg)
        if name == "doc" and Skv > 40 then Skv = 40 end
        local bmask = al.attention.block_mask(m[1], B, H, Sq, Skv, { block_m = bm, block_n = bn })
        assert.equal(m[2] and B or 1, bmask.mask:size(1))
        assert.equal(m[3] and H or 1, bmask.mask:size(2))
        local want = brute(m[4] or m[1], m[2] and B or 1, m[3] and H or 1, Sq, Skv, bm, bn)
        assert.are.same(want, bmask.mask:to("f64"):flat_values())
        assert.truthy(tostring(bmask):find("BlockMask", 1, true))
        local c = bmask.counts
        assert.equal(c[0] / bmask.ntiles, bmask:sparsity())
      end
    end)
  end

  it("s = 16384 at block 128: causal, sliding window and documents in well under a second each", function()
    local clock = require("attnlab.progress").clock
    local ids = {}
    for i = 1, 16384 do ids[i] = math.floor((i - 1) / 1500) end
    local d = al.tensor({ ids }, { dtype = "i32" })
    for _, mm in ipairs({ function(b, h, q, kv) return al.ge(q, kv) end,
      function(b, h, q, kv) return al.land(al.ge(q, kv), al.le(q - kv, 1024)) end,
      function(b, h, q, kv) return al.land(al.ge(q, kv), al.eq(d[b][q], d[b][kv])) end }) do
      local t0 = clock()
      local bmask = al.attention.block_mask(mm, 1, 16, 16384, 16384, { block = 128 })
      local dt = clock() - t0
      assert(dt < 2.0, string.format("block_mask took %.2f s", dt))
      assert.equal(128, bmask.nm)
      assert(bmask:sparsity() > 0.45)
    end
  end)

  it("the oracle honours a block mask exactly as the kernels do (empty tiles masked, full tiles kept)", function()
    al.manual_seed(9)
    local a = inputs({ sq = 16 })
    local causal = function(b, h, q, kv) return al.ge(q, kv) end
    local bm = al.attention.block_mask(causal, 2, 4, 16, 16, { block = 4 })
    same(copy(a, { mask_mod = causal }), copy(a, { mask_mod = causal, block_mask = bm }))
    -- a block mask alone (no mask_mod): partial tiles keep everything, so block-causal attention
    local bm2 = al.attention.block_mask(causal, 1, 1, 16, 16, { block = 4 })
    same(copy(a, { mask_mod = function(b, h, q, kv) return al.le(kv - (kv - 1) % 4, q + 3 - (q - 1) % 4) end }),
      copy(a, { block_mask = bm2 }))
    local e = err_of(al.attention.forward, copy(a, { mask_mod = causal,
      block_mask = al.attention.block_mask(causal, 1, 1, 12, 16, { block = 4 }) }))
    assert.truthy(e:find("block_mask: built for", 1, true), e)
  end)

  it("notes whether later query blocks hold more tiles (the flash forward then starts them first)", function()
    local mk = function(f) return al.attention.block_mask(f, 1, 2, 1024, 1024, { block = 128 }) end
    assert.is_true(mk(function(b, h, q, kv) return al.ge(q, kv) end).heavy_last)           -- causal
    assert.is_true(mk(function(b, h, q, kv) return al.lor(al.le(kv, 256), al.ge(q, kv)) end).heavy_last)   -- prefix-LM
    assert.is_false(mk(function(b, h, q, kv) return al.le(q, kv) end).heavy_last)           -- anti-causal
    assert.is_false(mk(function(b, h, q, kv) return al.ge(kv, 1) end).heavy_last)           -- every tile: no tilt
  end)
end)

describe("variants: integration", function()
  it("explain mentions the variant and the oracle", function()
    local a = inputs({})
    local text, name = al.attention.explain(copy(a, { score_mod = function(s) return s * 0.5 end }))
    assert.equal("variants-oracle", name)
    assert.truthy(text:find("score_mod", 1, true))
    assert.truthy(text:find("Lua oracle", 1, true))
  end)

  it("DotProductAttention takes score_mod / mask_mod as module and per-call arguments", function()
    al.manual_seed(10)
    local a = inputs({})
    local rel = al.attention.param(rnd({ 4, 13 }))
    local dpa = al.DotProductAttention({ num_attention_heads = 4, kv_channels = { 8, 6 }, qkv_format = "bshd",
      attn_mask_type = "no_mask", compute_dtype = "f64",
      score_mod = function(s, b, h, q, kv) return s + rel[h][kv - q + 7] end,
      mask_mod = function(b, h, q, kv) return al.ge(q, kv) end })
    local input = { query_layer = a.query_layer, key_layer = a.key_layer, value_layer = a.value_layer }
    local out = dpa:forward(input)
    local want = al.attention.forward(copy(a, { score_mod = dpa.score_mod, mask_mod = dpa.mask_mod }))
    assert.equal(0, al.max_abs_diff(out, want))
    local g = dpa:backward(input, rnd(out:size()))
    assert.are.same({ 4, 13 }, g.captures[rel]:size())
    -- per call: switch the module's score_mod off
    local out2 = dpa:forward(copy(input, { score_mod = false }))
    local want2 = al.attention.forward(copy(a, { attn_mask_type = "causal" }))
    assert(al.max_abs_diff(out2, want2) < 1e-12)
    assert.truthy(err_of(al.DotProductAttention, { num_attention_heads = 4, kv_channels = 8, score_mod = 1 })
      :find("score_mod", 1, true))
  end)
end)

-- The flash backend (bf16, NVRTC-compiled hooks) against the CPU oracle for every example variant,
-- forward and backward (dq, dk, dv, capture gradients), with and without block masks.
describe("variants on the GPU #gpu", function()
  _G.VARIANTS_EXAMPLE_LIB = true
  local make = dofile("examples/variants.lua")
  _G.VARIANTS_EXAMPLE_LIB = nil
  local B, S, H, HG, D = 2, 200, 4, 2, 64
  local EX = make(S, H, B)
  local function run(args, dev)
    local a = copy(args)
    for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do a[k] = args[k]:to(dev) end
    local out, ctx = al.attention.forward(a)
    local g = al.attention.backward(ctx, args.dout:to(dev))
    return out:cpu():to("f64"), g, ctx
  end
  -- each case twice: as chosen by default (on sm_90 the Hopper forward serves variants), and with
  -- ATTNLAB_FLASH_SM90_VARIANTS=0 (the stage-1 forward serves them)
  for _, name in ipairs({ "alibi", "softcap", "relative_bias", "sliding_window", "document", "prefix_lm" }) do
    for _, with_bm in ipairs(EX[name].mask_mod and { false, true } or { false }) do
     for _, sm90v in ipairs({ false, true }) do
      it(name .. (with_bm and " with a block mask" or "") .. ": flash (bf16) == CPU oracle, forward and backward" ..
         (sm90v and "" or " [ATTNLAB_FLASH_SM90_VARIANTS=0]"), function()
        if not HAS_GPU then pending("no GPU") return end
       with_env("ATTNLAB_FLASH_SM90_VARIANTS", not sm90v and "0" or nil, function()
        al.manual_seed(21)
        local x = EX[name]
        local a = { query_layer = rnd({ B, S, H, D }, "bf16"), key_layer = rnd({ B, S, HG, D }, "bf16"),
          value_layer = rnd({ B, S, HG, D }, "bf16"), qkv_format = "bshd", attn_mask_type = "no_mask",
          score_mod = x.score_mod, mask_mod = x.mask_mod }
        a.dout = rnd({ B, S, H * D }, "bf16")
        if with_bm then
          a.block_mask = al.attention.block_mask(x.mask_mod, B, H, S, S, { block = 128 })
        end
        local oc, gc = run(a, "cpu")
        a.backend = "flash"
        local og, gg, ctx = run(a, "cuda")
        assert.truthy(ctx.cvariant ~= nil)
        assert(al.max_abs_diff(og, oc) < 2e-2, name .. " out: " .. al.max_abs_diff(og, oc))
        for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do
          local d = al.max_abs_diff(gg[k]:cpu():to("f64"), gc[k]:to("f64"))
          assert(d < 5e-2, name .. " " .. k .. ": " .. d)
        end
        if x.param then
          local want = gc.captures[x.param]:to("f64")
          local d = al.max_abs_diff(gg.captures[x.param]:cpu():to("f64"), want)
          local scale = want:abs():amax():item()
          assert(d < 2e-2 * math.max(1, scale), name .. " capture grad: " .. d)
        end
       end)
      end)
     end
    end
  end

  -- A new variant's first backward on sm_90: the dK/dV and dQ kernels compile at once (al_nvrtc_prefetch),
  -- and the pre pass comes from the default module, so no stage-1 variant module is compiled; the result
  -- still matches the CPU oracle.
  it("a new variant's first backward compiles its two Hopper kernels in parallel, no stage-1 module", function()
    if not HAS_GPU then pending("no GPU") return end
    local dev = al.cuda.device_info(0)
    if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
    -- a constant no earlier process used, so the kernels are new to the disk cache too
    local c = 20 + (os.time() % 100000) / 7919 + math.random()
    local softcap = function(score) return al.tanh(score / c) * c end
    al.manual_seed(23)
    local a = { query_layer = rnd({ 1, 192, 2, 64 }, "bf16"), key_layer = rnd({ 1, 192, 2, 64 }, "bf16"),
      value_layer = rnd({ 1, 192, 2, 64 }, "bf16"), qkv_format = "bshd", attn_mask_type = "causal",
      score_mod = softcap }
    a.dout = rnd({ 1, 192, 128 }, "bf16")
    local oc, gc = run(a, "cpu")
    local before = {}
    for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do before[line] = true end
    a.backend = "flash"
    local og, gg = run(a, "cuda")
    local new = {}
    for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do
      if not before[line] then new[#new + 1] = line end
    end
    local text = table.concat(new, "\n")
    assert(text:find("bwd%-sm90%-dkdv d64 bf16 causal%-tl variant %x+: compiled by NVRTC in %d+ ms in parallel"), text)
    assert(text:find("bwd%-sm90%-dq d64 bf16 causal%-tl variant %x+: compiled by NVRTC in %d+ ms in parallel"), text)
    assert.falsy(text:find("\nbwd d64 bf16 causal%-tl variant") or text:find("^bwd d64 bf16 causal%-tl variant"), text)
    assert(al.max_abs_diff(og, oc) < 2e-2)
    for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do
      local d = al.max_abs_diff(gg[k]:cpu():to("f64"), gc[k]:to("f64"))
      assert(d < 5e-2, k .. ": " .. d)
    end
  end)

  -- f16 kernels take the exact per-lane tanh (al_v_tanh's exp form) where bf16 ones pack two into
  -- tanh.approx.f16x2; the folded form (score_pre / score_post) and its pair form run in both, and with
  -- ATTNLAB_VARIANT_FOLD=0 the kernels get score_mod alone (the A/B switch): all against the CPU oracle
  for _, case in ipairs({ { "f16", nil }, { "bf16", "0" } }) do
    it("soft-capping in " .. case[1] .. (case[2] and " [ATTNLAB_VARIANT_FOLD=0]" or "") ..
       ": flash == CPU oracle, forward and backward", function()
      if not HAS_GPU then pending("no GPU") return end
      with_env("ATTNLAB_VARIANT_FOLD", case[2], function()
        al.manual_seed(23)
        local cap = 5
        local a = { query_layer = rnd({ 2, 200, 4, 64 }, case[1]), key_layer = rnd({ 2, 200, 4, 64 }, case[1]),
          value_layer = rnd({ 2, 200, 4, 64 }, case[1]), qkv_format = "bshd", attn_mask_type = "causal",
          score_mod = function(score) return cap * al.tanh(score / cap) end }
        local dout = rnd({ 2, 200, 256 }, case[1])
        local oc, gc, cctx = run(copy(a, { dout = dout }), "cpu")
        local og, gg, ctx = run(copy(a, { dout = dout, backend = "flash" }), "cuda")
        assert.equal(case[2] == nil, ctx.cvariant.score_pre ~= nil)
        local tol = case[1] == "f16" and 5e-3 or 2e-2
        assert(al.max_abs_diff(og, oc) < tol, "out: " .. al.max_abs_diff(og, oc))
        -- the LSE (f32 sums of exponentials, an eighth of them al_ex2_fma's): exact tanh in f16 kernels,
        -- tanh.approx.f32 (2^-11 relative, times the cap) in bf16 ones
        local dl = al.max_abs_diff(ctx.lse:cpu():to("f64"), cctx.lse:to("f64"))
        assert(dl < (case[1] == "f16" and 2e-4 or 5e-3), "lse: " .. dl)
        for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do
          local d = al.max_abs_diff(gg[k]:cpu():to("f64"), gc[k]:to("f64"))
          assert(d < 5 * tol, k .. ": " .. d)
        end
      end)
    end)
  end

  -- soft-capping's logit lies in [-cap, cap]: the bf16 Hopper forward takes cap as every row's softmax max
  -- (kernels/flash_fwd_sm90.cu, AL_FL_FIXED_MAX). Rows whose every logit sits at the floor (exponentials near e^-60)
  -- and rows that mask_mod masks entirely, against the CPU oracle, the running max (ATTNLAB_FLASH_SM90_FIXED_MAX=0)
  -- and f16 (which keeps the running max)
  it("soft-capping's fixed softmax max: rows at the cap's floor and fully masked rows, forward and backward", function()
    if not HAS_GPU then pending("no GPU") return end
    al.manual_seed(29)
    local FB, FS, FH, FD, cap = 2, 300, 4, 128, 30   -- this test's shape (not the describe's B, S, H, D)
    local q, k, v = rnd({ FB, FS, FH, FD }), rnd({ FB, FS, FH, FD }), rnd({ FB, FS, FH, FD })
    -- keys u + noise; query row 6 (1-based) is -8 u: all its logits near -cap. The others: logits of std ~2.5
    local u = rnd({ FD })
    local qp, kp, up = ffi.cast("double *", q:data_ptr()), ffi.cast("double *", k:data_ptr()), ffi.cast("double *", u:data_ptr())
    for b = 0, FB - 1 do
      for i = 0, FS - 1 do
        for h = 0, FH - 1 do
          local o = ((b * FS + i) * FH + h) * FD
          for d = 0, FD - 1 do
            kp[o + d] = up[d] + 0.3 * kp[o + d]
            qp[o + d] = i == 5 and -8 * up[d] or 2.5 * qp[o + d] / math.sqrt(FD)
          end
        end
      end
    end
    local function args(dt)
      return { query_layer = q:to(dt), key_layer = k:to(dt), value_layer = v:to(dt), qkv_format = "bshd",
        attn_mask_type = "no_mask", score_mod = function(score) return cap * al.tanh(score / cap) end,
        mask_mod = function(b, h, qi, kv) return al.ne(qi, 10) end, dout = rnd({ FB, FS, FH * FD }, dt) }
    end
    for _, dt in ipairs({ "bf16", "f16" }) do
      local a = args(dt)
      local oc, gc, cctx = run(a, "cpu")
      local outs = {}
      for _, fixed in ipairs({ "1", "0" }) do
        with_env("ATTNLAB_FLASH_SM90_FIXED_MAX", fixed, function()
          local og, gg, ctx = run(copy(a, { backend = "flash" }), "cuda")
          assert.equal(1, ctx.cvariant.score_bounded)
          assert.equal(30, ctx.cvariant.score_hi)
          local tol = dt == "f16" and 5e-3 or 2e-2
          local what = dt .. " fixed max " .. fixed
          assert(al.max_abs_diff(og, oc) < tol, what .. " out: " .. al.max_abs_diff(og, oc))
          -- row 10: every key masked, zero output and lse -inf; row 6: every logit at the floor, lse near -cap + log FS
          assert.equal(0, og:view(FB, FS, FH * FD):select(2, 10):abs():amax():item())
          local lse = ctx.lse:cpu():to("f64")
          assert.equal(-math.huge, lse:select(3, 10):amax():item())
          local l6, c6 = lse:select(3, 6), cctx.lse:to("f64"):select(3, 6)
          assert(c6:amax():item() < -cap + math.log(FS) + 1, "row 6's logits are not at the floor")
          assert(al.max_abs_diff(l6, c6) < 5e-3, what .. " row 6 lse: " .. al.max_abs_diff(l6, c6))
          local lm = lse:narrow(3, 1, 9)
          assert(al.max_abs_diff(lm, cctx.lse:to("f64"):narrow(3, 1, 9)) < 5e-3, what .. " lse")
          for _, kk in ipairs({ "query_layer", "key_layer", "value_layer" }) do
            local d = al.max_abs_diff(gg[kk]:cpu():to("f64"), gc[kk]:to("f64"))
            assert(d < 5 * tol * math.max(1, gc[kk]:to("f64"):abs():amax():item()), what .. " " .. kk .. ": " .. d)
          end
          outs[fixed] = og
        end)
      end
      -- the fixed and the running max: the same softmax, up to rounding
      assert(al.max_abs_diff(outs["1"], outs["0"]) < (dt == "f16" and 2e-3 or 1e-2))
    end
  end)

  -- The Hopper backward runs persistent (one CTA per SM walking the work items; with a block mask the producer
  -- compacts each item's tile list): with more items than SMs (here 256 dK/dV and 512 dQ items) its gradients
  -- must be bit-identical to one CTA per item (ATTNLAB_FLASH_SM90_PERSIST=0), for a block-masked document mask
  -- (lists that differ from item to item) and for soft-capping (the sliced path)
  it("the persistent backward == one CTA per item, bit for bit: documents with a block mask, soft-capping", function()
    if not HAS_GPU then pending("no GPU") return end
    local dev = al.cuda.device_info(0)
    if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
    al.manual_seed(31)
    local PB, PS, PH, PHG, PD = 4, 4096, 4, 2, 128   -- this test's shape (not the describe's B, S, H, HG, D)
    local ids = {}
    for b = 1, PB do
      ids[b] = {}
      local d, left = 0, 300 + 97 * b
      for i = 1, PS do
        if left == 0 then d, left = d + 1, 300 + (d * 389 + 211 * b) % 700 end
        ids[b][i], left = d, left - 1
      end
    end
    local doc = al.tensor(ids, { dtype = "i32" })
    local docs = function(b, _, q, k) return al.eq(doc[b][q], doc[b][k]) end
    local o = { dtype = "bf16", device = "cuda" }
    local base = { query_layer = al.randn({ PB, PS, PH, PD }, o), key_layer = al.randn({ PB, PS, PHG, PD }, o),
      value_layer = al.randn({ PB, PS, PHG, PD }, o), qkv_format = "bshd", backend = "flash" }
    local dout = al.randn({ PB, PS, PH * PD }, o)
    for _, extra in ipairs({
      { attn_mask_type = "causal", mask_mod = docs, block_mask = al.attention.block_mask(docs, PB, 1, PS, PS, { block = 128 }) },
      { attn_mask_type = "causal", score_mod = function(score) return 30 * al.tanh(score / 30) end } }) do
      local g = {}
      for _, pz in ipairs({ "0", "1" }) do
        with_env("ATTNLAB_FLASH_SM90_PERSIST", pz ~= "1" and pz or nil, function()
          local _, ctx = al.attention.forward(copy(base, extra))
          g[pz] = al.attention.backward(ctx, dout)
        end)
      end
      for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do
        local a, b = g["0"][k]:cpu():to("f64"), g["1"][k]:cpu():to("f64")
        assert(a:abs():amax():item() > 0, k .. " is all zeros")
        assert.equal(0, al.max_abs_diff(a, b))
      end
    end
  end)

  -- One bf16 case (a: the arguments, without backend) on the CPU oracle and on flash, forward and backward with a
  -- fresh dout: LSE and output within 2e-2, the three input gradients within 5e-2, and the gradient of capture `cap`
  -- (if given) within 2e-2 of its scale. The LSE bound: soft-capping at 30 makes a tanh error of e an error of 30 e
  -- in the logit (tanh.approx.f32: up to ~4.9e-4 near +-1; al_tanh_fma: 1.0e-4). Returns flash's ctx.
  local function flash_vs_oracle(what, a, d, cap)
    a.dout = rnd({ B, S, H * d }, "bf16")
    local oc, gc, cctx = run(a, "cpu")
    a.backend = "flash"
    local og, gg, ctx = run(a, "cuda")
    local dl = al.max_abs_diff(ctx.lse:cpu():to("f64"), cctx.lse:to("f64"))
    assert(dl < 2e-2, what .. " lse: " .. dl)
    assert(al.max_abs_diff(og, oc) < 2e-2, what .. " out: " .. al.max_abs_diff(og, oc))
    for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do
      local dd = al.max_abs_diff(gg[k]:cpu():to("f64"), gc[k]:to("f64"))
      assert(dd < 5e-2, what .. " " .. k .. ": " .. dd)
    end
    if cap then
      local want = gc.captures[cap]:to("f64")
      local dd = al.max_abs_diff(gg.captures[cap]:cpu():to("f64"), want)
      assert(dd < 2e-2 * math.max(1, want:abs():amax():item()), what .. " capture grad: " .. dd)
    end
    return ctx
  end

  -- Each case { name, score_mod, mask_mod (with a 128 x 128 block mask), capture index } at d = 64 and 128, causal
  -- bshd with GQA, through flash_vs_oracle; check(ctx, case) adds the caller's assertions
  local SOFTCAP30 = function(score) return 30 * al.tanh(score / 30) end
  local function causal_cases_vs_oracle(cases, check)
    for _, d in ipairs({ 64, 128 }) do
      for _, c in ipairs(cases) do
        local a = { query_layer = rnd({ B, S, H, d }, "bf16"), key_layer = rnd({ B, S, HG, d }, "bf16"),
          value_layer = rnd({ B, S, HG, d }, "bf16"), qkv_format = "bshd", attn_mask_type = "causal",
          score_mod = c[2], mask_mod = c[3] }
        if c[3] then a.block_mask = al.attention.block_mask(c[3], B, H, S, S, { block = 128 }) end
        check(flash_vs_oracle(c[1] .. " d=" .. d, a, d, c[4]), c)
      end
    end
  end

  -- The kernels' build switches under measurement (ATTNLAB_VARIANT_DEFINES): the sliced score_mod backward
  -- (AL_SM90_LEAN_MOD=0; the lean one is the default, checked by the default rows above: soft-capping, ALiBi through
  -- a capture read, soft-capping beside a block-masked document mask_mod, GQA, d = 64 and 128; a capture gradient
  -- keeps the sliced path), the forward without ping-pong or without the S / O overlap, its FMA-pipe tanh in every
  -- other column group, the lean backward's FMA-pipe exponentials in every fourth, and the dK/dV kernel's dP^T issued
  -- beside S^T (AL_SM90_BWD_EARLY_DP 1 and 3, 3 with the consumers' 232 registers: session 24's first split of those
  -- hung; 2 is the default since session 28, and 0, the order before it, is checked here)
  -- and, with 2, the dQ kernel's one element pass (AL_SM90_BWD_DQ_ONE_PASS), and the dQ kernel's consumers taking
  -- turns (AL_SM90_BWD_PINGPONG, alone and with the one pass), each against the CPU oracle
  for _, defs in ipairs({ "AL_SM90_LEAN_MOD=0", "AL_BWD_EX2_FMA_EVERY=4", "AL_SM90_PINGPONG=0", "AL_SM90_PIPE=0",
    "AL_TANH_FMA_EVERY=2", "AL_SM90_BWD_EARLY_DP=1", "AL_SM90_BWD_EARLY_DP=0",
    "AL_SM90_BWD_EARLY_DP=3, AL_SM90_BWD_CONSUMER_REGS=232",
    "AL_SM90_BWD_EARLY_DP=2, AL_SM90_BWD_DQ_ONE_PASS=1, AL_SM90_BWD_CONSUMER_REGS=232",
    "AL_SM90_BWD_PINGPONG=1", "AL_SM90_BWD_PINGPONG=1, AL_SM90_BWD_DQ_ONE_PASS=1" }) do
    it("[ATTNLAB_VARIANT_DEFINES=" .. defs .. "] score_mod variants: flash (bf16) == CPU oracle, forward and backward",
       function()
      if not HAS_GPU then pending("no GPU") return end
      local dev = al.cuda.device_info(0)
      if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
      with_env("ATTNLAB_VARIANT_DEFINES", defs, function()
        al.manual_seed(37)
        local doc = EX.document.mask_mod
        causal_cases_vs_oracle({
          { "softcap", SOFTCAP30, nil }, { "alibi", EX.alibi.score_mod, nil },
          { "relative_bias", EX.relative_bias.score_mod, nil, EX.relative_bias.param },
          { "softcap + document + block mask", SOFTCAP30, doc },
        }, function(ctx)
          assert.truthy(ctx.cvariant.prelude ~= nil)
          local prelude = ffi.string(ctx.cvariant.prelude)
          for def in defs:gmatch("[^,%s]+") do assert.truthy(prelude:find(def:gsub("=", " "), 1, true), def) end
        end)
      end)
    end)
  end

  -- The unfolded backward (ATTNLAB_VARIANT_FOLD_GRAD=0: no score_grad_pre, so the backward's logit is score_mod of
  -- acc * scale and score_grad reads the same terms; the folded form, kernels/flash_common.cuh's AL_FL_SCORE_GRAD,
  -- is the default since session 24 and every other GPU test runs it) on each backward path: the Hopper lean path
  -- (the default for bf16 without capture gradients), the sliced one (AL_SM90_LEAN_MOD=0, and any capture gradient),
  -- and the stage-1 kernels (ATTNLAB_FLASH_SM90_BWD=0); each against the CPU oracle
  for _, path in ipairs({ { "lean" }, { "sliced", "ATTNLAB_VARIANT_DEFINES", "AL_SM90_LEAN_MOD=0" },
    { "stage-1", "ATTNLAB_FLASH_SM90_BWD", "0" } }) do
    it("[ATTNLAB_VARIANT_FOLD_GRAD=0, " .. path[1] .. " backward] score_mod variants: flash (bf16) == CPU oracle",
       function()
      if not HAS_GPU then pending("no GPU") return end
      local dev = al.cuda.device_info(0)
      if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
      with_env("ATTNLAB_VARIANT_FOLD_GRAD", "0", function()
        local function on_path(fn) if path[2] then with_env(path[2], path[3], fn) else fn() end end
        on_path(function()
          al.manual_seed(41)
          causal_cases_vs_oracle({
            { "softcap", SOFTCAP30, nil }, { "relative_bias", EX.relative_bias.score_mod, nil, EX.relative_bias.param },
            { "softcap + document + block mask", SOFTCAP30, EX.document.mask_mod },
          }, function(ctx, c)
            if c[2] == SOFTCAP30 then assert.truthy(ctx.cvariant.score_grad_pre == nil) end
          end)
        end)
      end)
    end)
  end

  -- The three-consumer Hopper forward (ATTNLAB_FLASH_SM90_CONSUMERS=3, an experiment for MUFU-heavy score_mods:
  -- BM = 192, 64-key tiles, d = 64 / 128; src/cuda/flash_sm90_specs.h) against the CPU oracle: soft-capping (causal
  -- and not), ALiBi through a capture read, relative bias with its capture gradient, soft-capping beside a document
  -- mask_mod with block masks of 128 x 128 and 64 x 64 blocks (a 192-row tile spans two or three block rows:
  -- AL_SM90_BM_SPAN), GQA, s not a multiple of the tiles; the backward is the usual one
  it("[ATTNLAB_FLASH_SM90_CONSUMERS=3] score_mod / mask_mod variants: flash (bf16) == CPU oracle", function()
    if not HAS_GPU then pending("no GPU") return end
    local dev = al.cuda.device_info(0)
    if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
    with_env("ATTNLAB_FLASH_SM90_CONSUMERS", "3", function()
      al.manual_seed(41)
      local softcap = function(score) return 30 * al.tanh(score / 30) end
      local doc = EX.document.mask_mod
      local cases = {
        { "softcap causal", softcap, nil, nil, "causal" }, { "softcap no_mask", softcap, nil, nil, "no_mask" },
        { "alibi", EX.alibi.score_mod, nil, nil, "causal" },
        { "relative_bias", EX.relative_bias.score_mod, nil, EX.relative_bias.param, "causal" },
        { "softcap + document + 128 x 128 block mask", softcap, doc, nil, "causal", 128 },
        { "document + 64 x 64 block mask", nil, doc, nil, "no_mask", 64 },
      }
      for _, d in ipairs({ 64, 128 }) do for _, c in ipairs(cases) do
        local a = { query_layer = rnd({ B, S, H, d }, "bf16"), key_layer = rnd({ B, S, HG, d }, "bf16"),
          value_layer = rnd({ B, S, HG, d }, "bf16"), qkv_format = "bshd", attn_mask_type = c[5],
          score_mod = c[2], mask_mod = c[3] }
        if c[3] then a.block_mask = al.attention.block_mask(c[3], B, H, S, S, { block = c[6] }) end
        flash_vs_oracle(c[1] .. " d=" .. d, a, d, c[4])
      end end
    end)
    local text = al.cuda.backend_info("flash")
    local n = 0
    for _ in text:gmatch("fwd%-sm90 d%d+ bf16 %S+ c3 variant %x+") do n = n + 1 end
    assert(n >= 12, "expected twelve three-consumer variant forwards in the NVRTC log, found " .. n .. ":\n" .. text)
  end)

  -- Without ATTNLAB_FLASH_SM90_CONSUMERS the host picks the forward's consumers (attn_flash_sm90.cu, sm90_fwd_spec):
  -- three for a score_mod that uses the MUFU where the grid fills many waves (10 x 16 heads x 3072: 3840 tiles of
  -- 128 rows, over 24 waves on any H100 or H200, where al_flash_sm90_c3_pays holds whatever the SM count), two where
  -- one wave holds the grid (1 x 2 heads x 384, no split either), and two for a score_mod without MUFU math at the
  -- large shape. Read off the flash log's new lines (a constant no earlier process used makes every kernel new to
  -- it); the small call against the CPU oracle, the large ones against the same call with two consumers forced.
  it("the forward's consumers follow score_mufu and the grid (no ATTNLAB_FLASH_SM90_CONSUMERS)", function()
    if not HAS_GPU then pending("no GPU") return end
    local dev = al.cuda.device_info(0)
    if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
    local c = 20 + (os.time() % 100000) / 7919 + math.random()
    local softcap = function(score) return c * al.tanh(score / c) end
    local slope = function(score, b, h, q, kv) return score - (c / 1000) * al.abs(kv - q) end
    -- the forward's output and the Hopper forward lines it added to the flash log
    local function fwd_lines(a)
      local before = {}
      for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do before[line] = true end
      local out = al.attention.forward(a)
      local new = {}
      for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do
        if not before[line] and line:find("^fwd%-sm90 ") then new[#new + 1] = line end
      end
      return out, table.concat(new, "\n")
    end
    -- (where = "cuda" draws the large inputs on the GPU: 63 M elements each, seconds on the host)
    local function args(b, s, h, f, where)
      local function r() return al.randn({ b, s, h, 128 }, { dtype = "bf16", device = where }) end
      return { query_layer = r(), key_layer = r(), value_layer = r(), qkv_format = "bshd", attn_mask_type = "no_mask",
        score_mod = f }
    end
    local function on_gpu(a, extra)
      local g = copy(a, extra)
      for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do g[k] = a[k]:cuda() end
      g.backend = "flash"
      return g
    end
    with_env("ATTNLAB_FLASH_SM90_CONSUMERS", nil, function()
      al.manual_seed(43)
      local small = args(1, 384, 2, softcap)
      local o, text = fwd_lines(on_gpu(small))
      assert(text:find("fwd%-sm90 d128 bf16 nomask variant %x+"), text)
      assert.falsy(text:find(" c3 ", 1, true), text)
      local want = al.attention.forward(small)
      assert(al.max_abs_diff(o:cpu():to("f64"), want:to("f64")) < 2e-2)
      for _, f in ipairs({ softcap, slope }) do
        local big = on_gpu(args(10, 3072, 16, f, "cuda"))
        local o3, t3 = fwd_lines(big)
        if f == softcap then
          assert(t3:find("fwd%-sm90 d128 bf16 nomask c3 variant %x+"), t3)
          assert.falsy(t3:find(" row0 ", 1, true), t3)   -- three consumers throughout pay: one launch, no split
        else
          assert(t3:find("fwd%-sm90 d128 bf16 nomask variant %x+"), t3)
          assert.falsy(t3:find(" c3 ", 1, true), t3)
        end
        local o2
        with_env("ATTNLAB_FLASH_SM90_CONSUMERS", "2", function() o2 = al.attention.forward(big) end)
        assert(al.max_abs_diff(o3, o2) < 2e-2, "three consumers against two: " .. al.max_abs_diff(o3, o2))
      end
    end)
  end)

  -- The split grid (the default for a MUFU score_mod where three consumers throughout do not pay; forced by
  -- ATTNLAB_FLASH_SM90_CONSUMERS=split): three consumers over each (batch, head) pair's first rows, two over the rest
  -- from p.m_row0 (kernels/flash_fwd_sm90.cu's AL_SM90_ROW0); at 1 x 16 heads x 4096 the host splits on an H100 or
  -- H200 (al_flash_sm90_split_rows: 3072 rows on 132 SMs, 2304 on 114; some other SM counts run one grid: the wave
  -- model is worked out here again from the device's SM count, and the flash log must show the kernels it implies).
  -- Output and LSE against the same call with two consumers forced, and the backward from each against the other.
  it("soft-capping's forward splits its grid by default (1 x 16 x 4096) == two consumers, output, LSE and gradients",
     function()
    if not HAS_GPU then pending("no GPU") return end
    local dev = al.cuda.device_info(0)
    if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
    local c = 20 + (os.time() % 100000) / 7919 + math.random()
    al.manual_seed(47)
    local function grnd(shape) return al.randn(shape, { dtype = "bf16", device = "cuda" }) end
    local a = { query_layer = grnd({ 1, 4096, 16, 128 }), key_layer = grnd({ 1, 4096, 16, 128 }),
      value_layer = grnd({ 1, 4096, 16, 128 }), qkv_format = "bshd", attn_mask_type = "no_mask",
      score_mod = function(score) return c * al.tanh(score / c) end, backend = "flash" }
    local dout = grnd({ 1, 4096, 16 * 128 })
    local before = {}
    for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do before[line] = true end
    local o_s, ctx_s, o_2, ctx_2
    with_env("ATTNLAB_FLASH_SM90_CONSUMERS", nil, function() o_s, ctx_s = al.attention.forward(a) end)
    local new = {}
    for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do
      if not before[line] and line:find("^fwd%-sm90 ") then new[#new + 1] = line end
    end
    local text = table.concat(new, "\n")
    -- the wave model (flash_sm90_specs.h): a wave of 128-row blocks costs 128, of 192-row blocks 192 x 0.94
    local function waves(blocks) return math.ceil(blocks / dev.multiprocessors) end
    local sq, hb = 4096, 16
    local best, r3 = waves(math.ceil(sq / 128) * hb) * 128, 0
    local all3 = waves(math.ceil(sq / 192) * hb) * 192 * 0.94
    if all3 < best then best, r3 = all3, sq end
    for k = 1, math.ceil(sq / 192) - 1 do
      local cost = waves(k * hb) * 192 * 0.94 + waves(math.ceil((sq - 192 * k) / 128) * hb) * 128
      if cost < best then best, r3 = cost, 192 * k end
    end
    local split = r3 > 0 and r3 < sq and all3 >= waves(math.ceil(sq / 128) * hb) * 128   -- not where three pay
    if dev.name:find("H100", 1, true) or dev.name:find("H200", 1, true) then assert.is_true(split) end
    if split then
      assert(text:find("fwd%-sm90 d128 bf16 nomask c3 variant %x+") and text:find("fwd%-sm90 d128 bf16 nomask row0 variant %x+"),
        dev.name .. " (" .. dev.multiprocessors .. " SMs, r3 = " .. r3 .. "):\n" .. text)
    else
      assert.falsy(text:find(" row0 ", 1, true), text)
    end
    with_env("ATTNLAB_FLASH_SM90_CONSUMERS", "2", function() o_2, ctx_2 = al.attention.forward(a) end)
    assert(al.max_abs_diff(o_s, o_2) < 2e-2, "output: " .. al.max_abs_diff(o_s, o_2))
    local dl = al.max_abs_diff(ctx_s.lse:cpu():to("f64"), ctx_2.lse:cpu():to("f64"))
    assert(dl < 1e-3, "lse: " .. dl)
    local g_s, g_2 = al.attention.backward(ctx_s, dout), al.attention.backward(ctx_2, dout)
    for _, k in ipairs({ "query_layer", "key_layer", "value_layer" }) do
      local d, m = al.max_abs_diff(g_s[k], g_2[k]), g_2[k]:cpu():to("f64"):abs():amax():item()
      assert(d < 2e-2 * math.max(1, m), k .. ": " .. d .. " (largest " .. m .. ")")
    end
  end)

  it("[ATTNLAB_FLASH_SM90_FWD_PDL=1] the split forward's second launch beside the first's end: output and LSE " ..
     "bit-identical to without, and what follows on the stream sees all of them", function()
    if not HAS_GPU then pending("no GPU") return end
    local dev = al.cuda.device_info(0)
    if not (dev.capability[1] == 9 and dev.capability[2] == 0) then pending("not sm_90") return end
    local c = 20 + (os.time() % 100000) / 7919 + math.random()
    al.manual_seed(53)
    local function grnd(shape) return al.randn(shape, { dtype = "bf16", device = "cuda" }) end
    local sc = function(score) return c * al.tanh(score / c) end
    for _, b in ipairs({ 1, 2 }) do
      local a = { query_layer = grnd({ b, 4096, 16, 128 }), key_layer = grnd({ b, 4096, 16, 128 }),
        value_layer = grnd({ b, 4096, 16, 128 }), qkv_format = "bshd", attn_mask_type = "no_mask", score_mod = sc,
        backend = "flash" }
      -- the split forced, so that the test holds on any SM count (by default it splits here on 132 SMs)
      local o_0, ctx_0, o_p, ctx_p
      with_env("ATTNLAB_FLASH_SM90_CONSUMERS", "split", function()
        o_0, ctx_0 = al.attention.forward(a)
        local before = {}
        for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do before[line] = true end
        with_env("ATTNLAB_FLASH_SM90_FWD_PDL", "1", function()
          for _ = 1, 3 do o_p, ctx_p = al.attention.forward(a) end   -- (the last one compared: back-to-back launches)
        end)
        if b == 1 then   -- its two kernels compiled (the names the host gives them)
          local new = {}
          for line in (al.cuda.backend_info("flash") or ""):gmatch("[^\n]+") do
            if not before[line] and line:find(" pdl ", 1, true) then new[#new + 1] = line end
          end
          local text = table.concat(new, "\n")
          assert(text:find("c3 pdl variant", 1, true) and text:find("row0 pdl variant", 1, true), text)
        end
      end)
      -- (the copies to the host wait for the stream: without the second launch's wait they could read rows the
      -- first launch had not written yet)
      assert.equal(0, al.max_abs_diff(o_0:cpu():to("f64"), o_p:cpu():to("f64")), "b = " .. b .. ": output")
      assert.equal(0, al.max_abs_diff(ctx_0.lse:cpu():to("f64"), ctx_p.lse:cpu():to("f64")), "b = " .. b .. ": lse")
    end
  end)

  it("causal via mask_mod + block mask == built-in causal on flash", function()
    if not HAS_GPU then pending("no GPU") return end
    local a = { query_layer = rnd({ 1, 512, 4, 128 }, "bf16"):cuda(), key_layer = rnd({ 1, 512, 4, 128 }, "bf16"):cuda(),
      value_layer = rnd({ 1, 512, 4, 128 }, "bf16"):cuda(), qkv_format = "bshd", backend = "flash" }
    local ref = al.attention.forward(copy(a, { attn_mask_type = "causal" }))
    local causal = function(b, h, q, kv) return al.ge(q, kv) end
    local got = al.attention.forward(copy(a, { attn_mask_type = "no_mask", mask_mod = causal,
      block_mask = al.attention.block_mask(causal, 1, 1, 512, 512, { block = 128 }) }))
    assert(al.max_abs_diff(got, ref) < 1e-2)
  end)
end)
