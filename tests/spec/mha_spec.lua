-- al.nn.MultiheadAttention: outputs against a naive Lua MHA (projection layouts, GQA, RoPE, QK-norm,
-- input LayerNorm, cross-attention), every gradient against central finite differences in f64, the
-- pass-through against the sliced path bit for bit, no layout detection and no copy on the
-- declarative path, no deprecation warning on any path.
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"
local chk = require "nn_check"

local rnd = chk.rnd

local function randomize(m) chk.randomize(m, 0.4, 0.1) end

local function mha(cfg)
  local c = { hidden_size = 8, num_attention_heads = 2, qkv_format = "bshd", attention_dropout = 0,
    params_dtype = "f64", compute_dtype = "f64" }
  for k, v in pairs(cfg or {}) do c[k] = v end
  local m = al.nn.MultiheadAttention(c)
  randomize(m)
  return m
end

---------------------------------------------------------------------------------------------------
-- the naive oracle: plain Lua loops over a bshd input
---------------------------------------------------------------------------------------------------
local linear, norm_vec = chk.linear, chk.norm_vec

local function rope_vec(v, pos, dim, base, inter)
  local out = {}
  for i = 1, #v do out[i] = v[i] end
  for i = 0, dim / 2 - 1 do
    local a, b
    if inter then a, b = 2 * i + 1, 2 * i + 2 else a, b = i + 1, i + 1 + dim / 2 end
    local ang = pos * base ^ (-2 * i / dim)
    out[a] = v[a] * math.cos(ang) - v[b] * math.sin(ang)
    out[b] = v[b] * math.cos(ang) + v[a] * math.sin(ang)
  end
  return out
end

-- m: the module (its parameters are read); x [b, s, H] (and enc [b, skv, H] for cross); causal or not
local function oracle(m, x, causal, enc)
  local sz = x:size()
  local B, S, Hd = sz[1], sz[2], sz[3]
  local h, ng, d = m.num_attention_heads, m.num_gqa_groups, m.kv_channels
  local npg = h / ng
  local xv = x:flat_values()
  if m.layernorm then
    local w, b = m.layernorm.weight:flat_values(), m.layernorm.bias and m.layernorm.bias:flat_values()
    local out = {}
    for r = 1, B * S do
      local row = {}
      for i = 1, Hd do row[i] = xv[(r - 1) * Hd + i] end
      local y = norm_vec(m.normalization, row, m.layernorm.eps, w, b)
      for i = 1, Hd do out[(r - 1) * Hd + i] = y[i] end
    end
    xv = out
  end
  -- q[b][s][head] = vector, k/v[b][s][group]
  local Q, K, V = {}, {}, {}
  local SK = S
  if m.attention_type == "self" then
    local n = (h + 2 * ng) * d
    local mixed = linear(xv, B * S, Hd, m.qkv.weight, m.qkv.bias, n)
    for bi = 1, B do
      Q[bi], K[bi], V[bi] = {}, {}, {}
      for si = 1, S do
        local base = ((bi - 1) * S + si - 1) * n
        local q, k, v = {}, {}, {}
        local function vec(off)
          local t = {}
          for c = 1, d do t[c] = mixed[base + off + c] end
          return t
        end
        for hh = 0, h - 1 do
          if m.qkv_weight_interleaved then
            local g, j = math.floor(hh / npg), hh % npg
            q[hh + 1] = vec((g * (npg + 2) + j) * d)
          else
            q[hh + 1] = vec(hh * d)
          end
        end
        for g = 0, ng - 1 do
          if m.qkv_weight_interleaved then
            k[g + 1] = vec((g * (npg + 2) + npg) * d)
            v[g + 1] = vec((g * (npg + 2) + npg + 1) * d)
          else
            k[g + 1] = vec(h * d + g * d)
            v[g + 1] = vec(h * d + ng * d + g * d)
          end
        end
        Q[bi][si], K[bi][si], V[bi][si] = q, k, v
      end
    end
  else
    local ev = enc:flat_values()
    SK = enc:size(2)
    local qm = linear(xv, B * S, Hd, m.query_layer.weight, m.query_layer.bias, h * d)
    local kvm = linear(ev, B * SK, Hd, m.key_value.weight, m.key_value.bias, 2 * ng * d)
    for bi = 1, B do
      Q[bi], K[bi], V[bi] = {}, {}, {}
      for si = 1, S do
        local q = {}
        for hh = 0, h - 1 do
          local t = {}
          for c = 1, d do t[c] = qm[((bi - 1) * S + si - 1) * h * d + hh * d + c] end
          q[hh + 1] = t
        end
        Q[bi][si] = q
      end
      for si = 1, SK do
        local k, v = {}, {}
        local base = ((bi - 1) * SK + si - 1) * 2 * ng * d
        for g = 0, ng - 1 do
          local tk, tv = {}, {}
          for c = 1, d do
            if m.qkv_weight_interleaved then
              tk[c], tv[c] = kvm[base + (g * 2) * d + c], kvm[base + (g * 2 + 1) * d + c]
            else
              tk[c], tv[c] = kvm[base + g * d + c], kvm[base + ng * d + g * d + c]
            end
          end
          k[g + 1], v[g + 1] = tk, tv
        end
        K[bi][si], V[bi][si] = k, v
      end
    end
  end
  -- per-tensor work
  local function work(vec, normm, pos)
    local function nrm(t)
      if not normm then return t end
      return norm_vec(normm.kind, t, normm.eps, normm.weight and normm.weight:flat_values(),
        normm.bias and normm.bias:flat_values())
    end
    if m.qk_norm_before_rope then vec = nrm(vec) end
    if m.rotary_emb then
      local r = m.rotary_emb
      vec = rope_vec(vec, pos, r.dim, r.rotary_base, r.interleaved)
    end
    if not m.qk_norm_before_rope then vec = nrm(vec) end
    return vec
  end
  for bi = 1, B do
    for si = 1, S do for hh = 1, h do Q[bi][si][hh] = work(Q[bi][si][hh], m.q_norm, si - 1) end end
    for si = 1, SK do for g = 1, ng do K[bi][si][g] = work(K[bi][si][g], m.k_norm, si - 1) end end
  end
  -- attention
  local ctx = {}
  local scale = 1 / math.sqrt(d)
  for bi = 1, B do
    for si = 1, S do
      for hh = 1, h do
        local g = math.floor((hh - 1) / npg) + 1
        local scores, mx = {}, -math.huge
        local last = causal and si or SK
        for j = 1, last do
          local s = 0
          for c = 1, d do s = s + Q[bi][si][hh][c] * K[bi][j][g][c] end
          scores[j] = s * scale
          if scores[j] > mx then mx = scores[j] end
        end
        local den = 0
        for j = 1, last do scores[j] = math.exp(scores[j] - mx); den = den + scores[j] end
        for c = 1, d do
          local acc = 0
          for j = 1, last do acc = acc + scores[j] / den * V[bi][j][g][c] end
          ctx[((bi - 1) * S + si - 1) * h * d + (hh - 1) * d + c] = acc
        end
      end
    end
  end
  return linear(ctx, B * S, h * d, m.proj.weight, m.proj.bias, Hd)
end

-- bshd x [b, s, H] -> the input of format fmt (+ DPA arguments for thd)
local function as_format(x, fmt)
  if fmt == "bshd" then return x end
  if fmt == "sbhd" then return { hidden_states = x:transpose(1, 2):contiguous() } end
  local b, s = x:size(1), x:size(2)
  local cu = {}
  for i = 0, b do cu[i + 1] = i * s end
  local c = al.tensor(cu, { dtype = "i32" })
  return { hidden_states = x:reshape({ b * s, x:size(3) }), cu_seqlens_q = c, cu_seqlens_kv = c }
end
local function to_bshd(y, fmt, b, s)
  if fmt == "bshd" then return y end
  if fmt == "sbhd" then return y:transpose(1, 2) end
  return y:view(b, s, y:size(2))
end

local function all_grads(m, dx, extra)
  local list = { dx }
  local _, g = m:parameters()
  for i = 1, #g do list[#list + 1] = g[i] end
  if extra then list[#list + 1] = extra end
  return list
end

describe("MultiheadAttention", function()
  before_each(function() al.manual_seed(4242) end)

  local configs = {
    { name = "pass-through, interleaved weights, input LayerNorm", cfg = { input_layernorm = true }, mode = "qkv" },
    { name = "pass-through, [3, h, d] weights", cfg = { qkv_weight_interleaved = false, num_attention_heads = 4, kv_channels = 2 }, mode = "qkv" },
    { name = "GQA interleaved + RoPE + RMSNorm QK-norm", cfg = { num_attention_heads = 4, num_gqa_groups = 2, kv_channels = 4,
      rotary = true, qk_norm_type = "RMSNorm", input_layernorm = true, normalization = "RMSNorm" }, mode = "sliced" },
    { name = "GQA [q, k, v] weights (kv_layer)", cfg = { num_attention_heads = 4, num_gqa_groups = 1, kv_channels = 2,
      qkv_weight_interleaved = false }, mode = "sliced_kv" },
    { name = "interleaved RoPE, LayerNorm QK-norm before RoPE", cfg = { rotary = { interleaved = true, rotary_base = 50 },
      qk_norm_type = "LayerNorm", qk_norm_before_rope = true }, mode = "sliced" },
    { name = "L2 QK-norm, no bias", cfg = { qk_norm = "L2Normalization", bias = false }, mode = "sliced" },
  }

  for _, c in ipairs(configs) do
    it("equals the naive MHA: " .. c.name .. " (bshd, sbhd, thd)", function()
      local m = mha(c.cfg)
      local x = rnd({ 2, 3, 8 })
      local want = oracle(m, x, true)
      for _, fmt in ipairs({ "bshd", "sbhd", "thd" }) do
        m.qkv_format = fmt
        m.core_attention.qkv_format = fmt
        m.core_attention.attn_mask_type = fmt == "thd" and "padding_causal" or "causal"
        local ws, y = al.warnings.capture(function() return m:forward(as_format(x, fmt)) end)
        assert.equal(c.mode, m.state.mode)
        assert.equal(0, #ws)
        local d = chk.maxdiff(to_bshd(y, fmt, 2, 3):contiguous():flat_values(), want)
        assert.is_true(d < 1e-12, fmt .. ": max |mha - oracle| = " .. d)
      end
    end)
  end

  it("cross-attention (pass-through kv_layer, and with RoPE) equals the naive MHA", function()
    for _, extra in ipairs({ {}, { rotary = true, qk_norm_type = "RMSNorm", qkv_weight_interleaved = false } }) do
      local cfg = { attention_type = "cross", num_attention_heads = 2, num_gqa_groups = 1, attn_mask_type = "no_mask" }
      for k, v in pairs(extra) do cfg[k] = v end
      local m = mha(cfg)
      local x, enc = rnd({ 2, 3, 8 }), rnd({ 2, 5, 8 })
      local ws, y = al.warnings.capture(function() return m:forward{ hidden_states = x, encoder_output = enc } end)
      assert.equal(0, #ws)
      assert.equal(extra.rotary and "sliced" or "q_kv", m.state.mode)
      local d = chk.maxdiff(y:flat_values(), oracle(m, x, false, enc))
      assert.is_true(d < 1e-12, "max |mha - oracle| = " .. d)
    end
  end)

  for _, c in ipairs({ configs[1], configs[3], configs[4] }) do
    it("every gradient (input and parameters) equals finite differences: " .. c.name, function()
      local m = mha(c.cfg)
      local x = rnd({ 2, 3, 8 })
      local y = m:forward(x)
      local W = rnd(y:size())
      m:zero_grad()
      local dx = m:backward(x, W)
      local p, g = m:parameters()
      local wrt, an = { x }, { dx }
      for i = 1, #p do wrt[#wrt + 1], an[#an + 1] = p[i], g[i] end
      local err, n = chk.fd(function() return m:forward(x) end, W, wrt, an, 3)
      assert.is_true(n > 50)
      assert.is_true(err < 1e-6, "fd error " .. err)
    end)
  end

  it("cross-attention gradients (query side, encoder side, parameters) equal finite differences", function()
    local m = mha{ attention_type = "cross", attn_mask_type = "no_mask", num_gqa_groups = 1 }
    local x, enc = rnd({ 2, 3, 8 }), rnd({ 2, 4, 8 })
    local inp = { hidden_states = x, encoder_output = enc }
    local y = m:forward(inp)
    local W = rnd(y:size())
    m:zero_grad()
    local dx, denc = m:backward(inp, W)
    local p, g = m:parameters()
    local wrt, an = { x, enc }, { dx, denc }
    for i = 1, #p do wrt[#wrt + 1], an[#an + 1] = p[i], g[i] end
    local err = chk.fd(function() return m:forward{ hidden_states = x, encoder_output = enc } end, W, wrt, an, 3)
    assert.is_true(err < 1e-6, "fd error " .. err)
  end)

  for _, fmt in ipairs({ "bshd", "sbhd", "thd" }) do
    for _, inter in ipairs({ true, false }) do
      it(string.format("pass-through and sliced path: bit-identical outputs and gradients (%s, interleaved=%s, f32)", fmt, tostring(inter)), function()
        local function build()
          al.manual_seed(99)
          return al.nn.MultiheadAttention{ hidden_size = 16, num_attention_heads = 4, qkv_format = fmt, attention_dropout = 0,
            qkv_weight_interleaved = inter, input_layernorm = true,
            attn_mask_type = fmt == "thd" and "padding_causal" or "causal" }
        end
        local a, b = build(), build()
        b.pass_through = false
        al.manual_seed(5)
        local x = fmt == "thd" and al.randn({ 7, 16 }) or al.randn({ 3, 4, 16 })
        local inp = fmt == "thd" and { hidden_states = x, cu_seqlens_q = al.tensor({ 0, 2, 7 }, { dtype = "i32" }),
          cu_seqlens_kv = al.tensor({ 0, 2, 7 }, { dtype = "i32" }) } or x
        local dy = al.randn_like(fmt == "thd" and x or x)
        local det0 = tonumber(al.C.al_layout_detect_calls())
        local ya = a:forward(inp)
        local dxa = a:backward(inp, dy)
        assert.equal(det0, tonumber(al.C.al_layout_detect_calls()))   -- the declarative path never detects
        local yb = b:forward(inp)
        local dxb = b:backward(inp, dy)
        assert.equal("qkv", a.state.mode)
        assert.equal("sliced_kv", b.state.mode)
        assert.equal(0, al.max_abs_diff(ya, yb))
        local ga, gb = all_grads(a, dxa), all_grads(b, dxb)
        assert.equal(#ga, #gb)
        for i = 1, #ga do
          assert.equal(0, al.max_abs_diff(ga[i], gb[i]))
          assert.is_true(ga[i]:abs():max() > 0)
        end
      end)
    end
  end

  it("cross-attention: the kv_layer pass-through and the sliced path are bit-identical", function()
    local function build()
      al.manual_seed(12)
      return al.nn.MultiheadAttention{ hidden_size = 16, num_attention_heads = 4, num_gqa_groups = 2, attention_type = "cross",
        qkv_format = "sbhd", attention_dropout = 0, attn_mask_type = "no_mask" }
    end
    local a, b = build(), build()
    b.pass_through = false
    local inp = { hidden_states = al.randn({ 3, 2, 16 }), encoder_output = al.randn({ 5, 2, 16 }) }
    local dy = al.randn({ 3, 2, 16 })
    local ya = a:forward(inp)
    local dxa, dea = a:backward(inp, dy)
    local yb = b:forward(inp)
    local dxb, deb = b:backward(inp, dy)
    assert.equal("q_kv", a.state.mode)
    assert.equal("sliced_kv", b.state.mode)
    assert.equal(0, al.max_abs_diff(ya, yb))
    local ga, gb = all_grads(a, dxa, dea), all_grads(b, dxb, deb)
    for i = 1, #ga do assert.equal(0, al.max_abs_diff(ga[i], gb[i])) end
    -- the KV projection's gradient is the packed kv gradient DPA returned
    assert.is_true(a.grad_projection:is_same_storage(a.attention_gradients.kv_layer))
  end)

  it("the projection's gradient is the packed gradient DPA returns (no copy), and no detection runs", function()
    local m = mha{ num_attention_heads = 2, qkv_format = "sbhd" }
    local x = rnd({ 3, 2, 8 })
    local det0 = tonumber(al.C.al_layout_detect_calls())
    local ws = al.warnings.capture(function()
      local y = m:forward(x)
      m:backward(x, al.randn_like(y))
    end)
    assert.equal(0, #ws)
    assert.equal(det0, tonumber(al.C.al_layout_detect_calls()))
    local packed = m.attention_gradients.qkv_layer
    assert.are.same({ 3, 2, 2, 3, 4 }, packed:size())          -- [s, b, h, 3, d]: interleave -2
    assert.is_true(m.grad_projection:is_same_storage(packed))
    assert.equal(m.grad_projection:data_ptr(), packed:data_ptr())
    assert.are.same({ 3, 2, 24 }, m.grad_projection:size())
    -- and the forward handed DPA a view of the projection output itself
    assert.is_true(m.state.dargs.qkv_layer:is_same_storage(m.state.mixed))
    assert.equal(-2, m.state.dargs.qkv_interleave_dim)
    local n = mha{ qkv_weight_interleaved = false }
    n:forward(rnd({ 2, 3, 8 }))
    assert.equal(-3, n.state.dargs.qkv_interleave_dim)
    assert.are.same({ 2, 3, 3, 2, 4 }, n.state.dargs.qkv_layer:size())
  end)

  it("raises no deprecation warning on any path, even under warnings.filter('error')", function()
    local old = al.warnings.filter("error")
    local ok, err = pcall(function()
      for _, cfg in ipairs({ {}, { rotary = true }, { qk_norm = true }, { num_gqa_groups = 1 },
                             { num_gqa_groups = 1, qkv_weight_interleaved = false }, { num_gqa_groups = 1, rotary = true } }) do
        local m = mha(cfg)
        local x = rnd({ 2, 3, 8 })
        local y = m:forward(x)
        m:backward(x, al.randn_like(y))
        m.pass_through = false
        y = m:forward(x)
        m:backward(x, al.randn_like(y))
      end
    end)
    al.warnings.filter(old)
    assert.is_true(ok, tostring(err))
  end)

  it("training/evaluate, zero_grad, deterministic initialisation and argument errors", function()
    al.manual_seed(1)
    local a = al.nn.MultiheadAttention{ hidden_size = 8, num_attention_heads = 2 }
    al.manual_seed(1)
    local b = al.nn.MultiheadAttention{ hidden_size = 8, num_attention_heads = 2 }
    local pa, ga = a:parameters()
    local pb = b:parameters()
    assert.equal(4, #pa)
    for i = 1, #pa do assert.equal(0, al.max_abs_diff(pa[i], pb[i])) end
    assert.equal(0.1, a.core_attention.attention_dropout)    -- TE's default
    a:evaluate()
    local x = al.randn({ 3, 2, 8 })
    local y1, y2 = a:forward(x), a:forward(x)
    assert.equal(0, al.max_abs_diff(y1, y2))
    a:backward(x, al.randn_like(y2))
    assert.is_true(ga[1]:abs():max() > 0)
    a:zero_grad()
    for i = 1, #ga do assert.equal(0, ga[i]:abs():max()) end
    assert.has_error(function() al.nn.MultiheadAttention{ hidden_size = 8, num_attention_heads = 3 } end,
      "MultiheadAttention: hidden_size (8) must be divisible by num_attention_heads (3) unless kv_channels is given")
    assert.has_error(function() al.nn.MultiheadAttention{ hidden_size = 8, num_attention_heads = 2, fp8_recipe = {} } end,
      "MultiheadAttention: fp8_recipe: expected an al.fp8 recipe (al.fp8.DelayedScaling{...}, ...), got table")
    assert.has_error(function() a:forward(al.randn({ 2, 8 })) end,
      "MultiheadAttention:forward: hidden_states: expected a 3D tensor [s, b, 8] for qkv_format=sbhd, got [2,8]")
    assert.has_error(function() a:backward(al.randn({ 3, 2, 8 }), al.randn({ 3, 2, 8 })) end,
      "MultiheadAttention:backward: input differs from the forward's input")
  end)
end)

describe("MultiheadAttention with fp8_recipe (FP8 attention core, projections in high precision)", function()
  local function vals(t) return t:contiguous():flat_values() end
  it("output and parameter gradients stay close to the same MHA without FP8; the recipe's state updates", function()
    -- E4M3 everywhere (3 mantissa bits also for the backward's dO, dP, dQKV)
    local r = al.fp8.DelayedScaling{ margin = 0, fp8_format = "E4M3", amax_history_len = 4, amax_compute_algo = "max" }
    local function build(rec)
      al.manual_seed(7)
      return al.nn.MultiheadAttention{ hidden_size = 64, num_attention_heads = 4, qkv_format = "bshd",
        attention_dropout = 0, fp8_recipe = rec }
    end
    local a, b = build(r), build(nil)
    assert.equal(r, a.core_attention.fp8_recipe)
    assert.is_nil(b.core_attention.fp8_recipe)
    assert.equal(0, #r:state().qkv.amax_history)
    -- step 1 runs with the recipe's initial scales, step 2 with the delayed scales step 1 recorded
    for step = 1, 2 do
      al.manual_seed(30 + step)
      local x = al.randn({ 2, 16, 64 })
      local ya, yb = a:forward(x), b:forward(x)
      local st = r:state()
      for _, slot in ipairs({ "qkv", "s", "o" }) do
        assert.equal(step, #st[slot].amax_history, slot .. " amax history after forward " .. step)
        assert.is_true(st[slot].amax_history[1] > 0, slot .. " amax recorded")
      end
      assert.equal(step - 1, #st["do"].amax_history)       -- the backward slots move in the backward only
      local av, bv = vals(ya), vals(yb)
      local se, lo, hi, differ = 0, math.huge, -math.huge, false
      for i = 1, #bv do
        se = se + (av[i] - bv[i]) ^ 2
        lo, hi = math.min(lo, bv[i]), math.max(hi, bv[i])
        if av[i] ~= bv[i] then differ = true end
      end
      local rr = math.sqrt(se / #bv) / (hi - lo)
      assert.is_true(differ, "the FP8 path must change the output")
      assert.is_true(rr < 0.11, string.format("step %d: output RMSE/range = %.5f (limit 0.11)", step, rr))

      al.manual_seed(40 + step)
      local dy = al.randn_like(ya)
      a:zero_grad(); b:zero_grad()
      a:backward(x, dy); b:backward(x, dy)
      st = r:state()
      for _, slot in ipairs({ "do", "dp", "dqkv" }) do
        assert.equal(step, #st[slot].amax_history, slot .. " amax history after backward " .. step)
      end
      local _, ga = a:parameters()
      local _, gb = b:parameters()
      assert.equal(#gb, #ga)
      for i = 1, #ga do
        local gv, hv = vals(ga[i]), vals(gb[i])
        local num, den = 0, 0
        for j = 1, #hv do
          assert.is_true(gv[j] == gv[j] and math.abs(gv[j]) < math.huge, "finite gradient")
          num, den = num + (gv[j] - hv[j]) ^ 2, den + hv[j] ^ 2
        end
        local e = math.sqrt(num / den)
        assert.is_true(den > 0)
        assert.is_true(e < 0.1, string.format("step %d: parameter %d gradient relative norm error = %.5f (limit 0.1)", step, i, e))
      end
    end
  end)
end)

describe("MultiheadAttention on cuda #gpu", function()
  local function gpu_it(name, fn)
    if HAS_GPU then it(name, fn) else pending(name .. " (no GPU)") end
  end
  gpu_it("pass-through and sliced paths on cuda give the CPU's outputs and gradients", function()
    for _, cfg in ipairs({ {}, { rotary = true, num_gqa_groups = 2, qk_norm_type = "RMSNorm" } }) do
      local function build(dev)
        al.manual_seed(21)
        local c = { hidden_size = 32, num_attention_heads = 4, qkv_format = "bshd", attention_dropout = 0, device = dev }
        for k, v in pairs(cfg) do c[k] = v end
        return al.nn.MultiheadAttention(c)
      end
      local c, g = build("cpu"), build("cuda")
      al.manual_seed(3)
      local x, dy = al.randn({ 2, 16, 32 }), al.randn({ 2, 16, 32 })
      local xg = x:cuda()
      local yc, yg = c:forward(x), g:forward(xg)
      assert.is_true(al.max_abs_diff(yc, yg) < 1e-3)
      local dc, dg = c:backward(x, dy), g:backward(xg, dy:cuda())
      assert.is_true(al.max_abs_diff(dc, dg) < 1e-3)
      local _, gc = c:parameters()
      local _, gg = g:parameters()
      for i = 1, #gc do assert.is_true(al.max_abs_diff(gc[i], gg[i]) < 1e-2) end
      if not cfg.rotary then assert.is_true(g.grad_projection:is_same_storage(g.attention_gradients.qkv_layer)) end
    end
  end)
end)

describe("examples/train_copy_task.lua", function()
  it("a few training steps of the two-layer model bring the loss down", function()
    local run = dofile("examples/train_copy_task.lua")
    local losses = run{ steps = 30, print = false, seed = 3, al = al }
    assert.equal(30, #losses)
    local first, last = 0, 0
    for i = 1, 5 do first = first + losses[i] / 5; last = last + losses[25 + i] / 5 end
    assert.is_true(first > 1.8, "the first losses sit near chance (log 8 = 2.08), got " .. first)
    assert.is_true(last < first - 0.3, string.format("loss did not fall: %.3f -> %.3f", first, last))
  end)
end)
