-- FP8: quantisation (CPU, and CUDA parity #gpu), recipes, FP8 attention emulation on the cpu backend,
-- accuracy against the bf16 path (TE's bar RMSE / range < 0.11) and prefix-invariance under causal masking.
local al = require "attnlab"

local function maxdiff(a, b) return al.max_abs_diff and al.max_abs_diff(a, b) or (a:to("f64") - b:to("f64")):abs():max() end
-- FP8 tensors compared code by code: decode both exactly (f64) and compare as values, NaN = NaN
local function same_codes(a, b)
  local x, y = a:to("f64"):flat_values(), b:to("f64"):flat_values()
  if #x ~= #y then return false end
  for i = 1, #x do
    if not (x[i] == y[i] or (x[i] ~= x[i] and y[i] ~= y[i])) then return false, i end
    if x[i] == 0 and 1 / x[i] ~= 1 / y[i] then return false, i end   -- signed zeros
  end
  return true
end

describe("fp8 quantisation (cpu)", function()
  it("amax is max |x| over strided views and propagates NaN", function()
    al.manual_seed(11)
    local x = al.randn({6, 5, 7}):transpose(1, 3)
    local ref = 0
    for _, v in ipairs(x:flat_values()) do ref = math.max(ref, math.abs(v)) end
    assert.are.equal(ref, al.fp8.amax(x))
    local y = x:contiguous()
    y:select(1, 2):select(1, 3):fill_(0 / 0)
    local a = al.fp8.amax(y)
    assert.is_true(a ~= a)
    -- amax_tensor: the same value in a f64 [1] tensor on x's device
    local t = al.fp8.amax_tensor(x)
    assert.are.same({ 1 }, t:size())
    assert.are.equal("f64", t:dtype())
    assert.are.equal(ref, t:item())
    local tn = al.fp8.amax_tensor(y):item()
    assert.is_true(tn ~= tn)
    assert.are.equal(0, al.fp8.amax_tensor(al.empty({ 0, 3 })):item())
    assert.has_error(function() al.fp8.amax_tensor(al.zeros({ 2 }, { dtype = "i32" })) end,
      "fp8.amax_tensor: amax: x must be a float tensor, got i32")
  end)

  it("quantize = fp8(x * scale), dequantize = code * scale_inv, on any strides", function()
    al.manual_seed(12)
    local x = al.randn({4, 3, 8}):permute(3, 1, 2) * 20
    for _, fmt in ipairs({ "e4m3", "e5m2" }) do
      local q = al.fp8.quantize(x, { format = fmt, scale = 3.5 })
      local ref = (x:to("f64") * 3.5):to("fp8_" .. fmt)          -- the tensor conversion (convert.h) as oracle
      assert.is_true(same_codes(q.data, ref))
      local d = q:dequantize("f64")
      assert.is_true(maxdiff(d, ref:to("f64") * (1 / 3.5)) == 0)
      assert.are.equal(1 / 3.5, q.scale_inv)
    end
  end)

  it("quantize_amax = quantize and amax_tensor in one call: the same codes and the same amax", function()
    al.manual_seed(os.time() % 100000)
    for _, dt in ipairs({ "f64", "f32", "bf16", "f16" }) do
      local x = (al.randn({ 5, 3, 9 }) * 50):to(dt):transpose(1, 3)   -- strided
      for _, fmt in ipairs({ "e4m3", "e5m2" }) do
        local sc = 0.5 + math.random() * 4
        local q, am = al.fp8.quantize_amax(x, { format = fmt, scale = sc })
        local ref = al.fp8.quantize(x, { format = fmt, scale = sc })
        local ok, at = same_codes(q.data, ref.data)
        assert.is_true(ok, dt .. " " .. fmt .. ": codes differ at " .. tostring(at))
        assert.are.equal(sc, q.scale)
        assert.are.equal(1 / sc, q.scale_inv)
        assert.are.equal("fp8_" .. fmt, q.data:dtype())
        assert.are.same({ 1 }, am:size())
        assert.are.equal("f64", am:dtype())
        assert.are.equal(al.fp8.amax(x), am:item())
      end
    end
    local y = al.randn({ 40 })
    y:narrow(1, 17, 1):fill_(0 / 0)
    local _, an = al.fp8.quantize_amax(y, { scale = 1 })
    assert.is_true(an:item() ~= an:item(), "a NaN element makes the amax NaN")
    local qe, ae = al.fp8.quantize_amax(al.empty({ 0, 4 }), { scale = 2 })
    assert.are.same({ 0, 4 }, qe.data:size())
    assert.are.equal(0, ae:item())
  end)

  it("quantize_amax refuses a missing or bad scale, a non-float x and a bad format, naming the argument", function()
    local x = al.randn({ 4 })
    assert.has_error(function() al.fp8.quantize_amax(x) end,
      "fp8.quantize_amax: scale: expected a finite number > 0, got nil")
    assert.has_error(function() al.fp8.quantize_amax(x, { scale = -1 }) end,
      "fp8.quantize_amax: scale: expected a finite number > 0, got -1")
    assert.has_error(function() al.fp8.quantize_amax(x, { scale = 1 / 0 }) end,
      "fp8.quantize_amax: scale: expected a finite number > 0, got inf")
    assert.has_error(function() al.fp8.quantize_amax(x, { scale = 1, format = "e3m4" }) end,
      "fp8.quantize_amax: format: expected 'e4m3' or 'e5m2', got e3m4")
    local ok, err = pcall(al.fp8.quantize_amax, al.zeros({ 2 }, { dtype = "i32" }), { scale = 1 })
    assert.is_false(ok)
    assert.truthy(tostring(err):match("x must be f32, f64, f16 or bf16, got i32"), tostring(err))
  end)

  it("saturates (e4m3 to 448, e5m2 to 57344) instead of overflowing", function()
    local x = al.tensor({ 1e6, -1e6, 500, 0.001 })
    local q = al.fp8.quantize(x, { format = "e4m3", scale = 1 }):dequantize("f64"):flat_values()
    assert.are.same({ 448, -448, 448 }, { q[1], q[2], q[3] })
    local q5 = al.fp8.quantize(x, { format = "e5m2", scale = 1 }):dequantize("f64"):flat_values()
    assert.are.same({ 57344, -57344 }, { q5[1], q5[2] })
  end)

  it("combine_and_quantize: the packed buffer in one pass is bit-identical to quantising each view", function()
    al.manual_seed(13)
    for _, dim in ipairs({ -3, -2 }) do
      local shape = dim == -3 and { 2, 33, 3, 4, 16 } or { 2, 33, 4, 3, 16 }
      local qkv = al.randn(shape, { dtype = "bf16" })
      local q8 = al.fp8.quantize(qkv, { scale = 37.25 }).data
      for i = 1, 3 do
        local view = al.fp8.quantize(qkv:select(dim, i), { scale = 37.25 }).data
        assert.is_true(same_codes(q8:select(dim, i), view))
      end
    end
  end)

  it("quantize_rows: one current scale per row, fp8_max / row amax", function()
    al.manual_seed(14)
    local x = al.randn({3, 5, 2, 8})
    local r = al.fp8.quantize_rows(x, { row_dims = 2 })
    assert.are.same({ 3, 5 }, r.scale_inv:size())
    local si = r.scale_inv:flat_values()
    for b = 1, 3 do for s = 1, 5 do
      local row = x:select(1, b):select(1, s)
      local a = al.fp8.amax(row)
      local want = al.fp8.quantize(row, { scale = 448 / a }).data
      assert.is_true(same_codes(r.data:select(1, b):select(1, s), want))
      assert.is_true(math.abs(si[(b - 1) * 5 + s] - a / 448) <= 1e-7 * a)
    end end
    assert.is_true(maxdiff(r:dequantize(), x) < 0.07 * al.fp8.amax(x))
  end)

  it("MXFP8: 32-blocks with E8M0 scales, the smallest power of two that avoids saturation", function()
    al.manual_seed(15)
    local x = al.randn({5, 70}) * 100
    local m = al.fp8.mxfp8_quantize(x, { dim = -1 })
    assert.are.same({ 5, 3 }, m.scales:size())   -- ceil(70 / 32)
    local sc = m.scales:to("f64"):flat_values()
    for r = 1, 5 do for blk = 1, 3 do
      local lo, n = (blk - 1) * 32 + 1, math.min(32, 70 - (blk - 1) * 32)
      local a = al.fp8.amax(x:select(1, r):narrow(1, lo, n))
      local e = sc[(r - 1) * 3 + blk] - 127
      assert.is_true(a <= 448 * 2 ^ e and a > 448 * 2 ^ (e - 1), "block scale is the smallest fitting power of two")
    end end
    local d = m:dequantize()
    assert.is_true(maxdiff(d, x) <= 0.0625 * al.fp8.amax(x))
    -- along dim 1 of the transposed view gives the same codes as along the last dim of the original
    local mt = al.fp8.mxfp8_quantize(x:t(), { dim = 1 })
    assert.is_true(same_codes(mt.data:t():contiguous(), m.data))
  end)

  it("errors name the function and the argument", function()
    assert.has_error(function() al.fp8.quantize(al.randn({2}), { format = "e3m4" }) end,
      "fp8.quantize: format: expected 'e4m3' or 'e5m2', got e3m4")
    local ok, msg = pcall(al.fp8.quantize, al.randn({2}), { scale = -1 })
    assert.is_false(ok)
    assert.truthy(msg:find("scale", 1, true))
  end)
end)

---------------------------------------------------------------------------------------------------
local function rel_rmse(out, ref)
  local d = (out:to("f64") - ref:to("f64"))
  local n = d:numel()
  local s = 0
  for _, v in ipairs(d:flat_values()) do s = s + v * v end
  local mn, mx = math.huge, -math.huge
  for _, v in ipairs(ref:to("f64"):flat_values()) do mn = math.min(mn, v); mx = math.max(mx, v) end
  return math.sqrt(s / n) / (mx - mn)
end

local RECIPES = {
  { "DelayedScaling", function() return al.fp8.DelayedScaling{ amax_history_len = 4 } end, true },
  { "DelayedScaling E4M3 most_recent", function() return al.fp8.DelayedScaling{ fp8_format = "E4M3", amax_history_len = 1, amax_compute_algo = "most_recent" } end, true },
  { "CurrentScaling (per tensor)", function() return al.fp8.CurrentScaling{} end, false },
  { "CurrentScaling granularity=token", function() return al.fp8.CurrentScaling{ granularity = "token" } end, true },
  { "MXFP8BlockScaling (V blocks along s, as TE)", function() return al.fp8.MXFP8BlockScaling{} end, false },
  { "MXFP8BlockScaling v_block_dim=d", function() return al.fp8.MXFP8BlockScaling{ v_block_dim = "d" } end, true },
  { "Recipe (Lua, current QKV/O)", function()
      return al.fp8.Recipe{ amax_history_len = 8, timing = { qkv = "current", o = "current", default = "delayed" },
        scale = function(slot, amaxes, fmax) local m = 0 for _, a in ipairs(amaxes) do m = math.max(m, a) end
          return m > 0 and fmax / m / 2 or 1 end }
    end, false },
  { "Recipe (Lua, all delayed)", function()
      return al.fp8.Recipe{ amax_history_len = 8, scale = function(slot, amaxes, fmax)
        local m = 0 for _, a in ipairs(amaxes) do m = math.max(m, a) end return m > 0 and fmax / m or 1 end }
    end, true },
}

describe("fp8 attention (cpu emulation)", function()
  local log = {}
  setup(function() log = {} end)
  teardown(function()
    io.stderr:write("\n[fp8 accuracy] RMSE / range of FP8 vs the bf16 path (TE's bar: < 0.11)\n")
    for _, l in ipairs(log) do io.stderr:write("  " .. l .. "\n") end
  end)

  for _, rc in ipairs(RECIPES) do
    it(rc[1] .. ": forward and backward within RMSE / range < 0.11 of bf16 (numbers in the log)", function()
      al.manual_seed(21)
      local qkv = al.randn({ 2, 64, 3, 4, 32 }, { dtype = "bf16" })
      local dout = al.randn({ 2, 64, 4 * 32 }, { dtype = "bf16" })
      local r = rc[2]()
      local out, ctx
      for _ = 1, 3 do   -- delayed recipes need a step to see their amaxes
        out, ctx = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = r }
      end
      local g = al.attention.backward(ctx, dout)
      local ref, rctx = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal" }
      local rg = al.attention.backward(rctx, dout)
      local e_o = rel_rmse(out, ref)
      local e_g = rel_rmse(g.qkv_layer, rg.qkv_layer)
      log[#log + 1] = string.format("%-45s out %.4f  dqkv %.4f", rc[1], e_o, e_g)
      assert.is_true(e_o < 0.11, rc[1] .. " forward " .. e_o)
      assert.is_true(e_g < 0.11, rc[1] .. " backward " .. e_g)
      assert.are.equal("bf16", out:dtype())
      assert.is_true(e_o > 0, "FP8 must differ from bf16 (the emulation is active)")
      local st = r:state()
      for _, s in ipairs(al.fp8.SLOTS) do
        assert.is_true(#st[s].amax_history >= 1, s .. " has a history")
      end
      assert.is_true(st.s.amax_history[#st.s.amax_history] <= 1 and st.s.amax_history[1] > 0, "S is a softmax: amax in (0, 1]")
    end)
  end

  for _, rc in ipairs(RECIPES) do
    local expect = rc[3]
    it(rc[1] .. ": causal prefix-invariance " .. (expect and "holds" or "fails (the causality hazard, TE #3248)"), function()
      al.manual_seed(22)
      local qkv1 = al.randn({ 1, 64, 3, 2, 32 })
      local qkv2 = qkv1:clone()
      qkv2:narrow(2, 57, 8):copy_(al.randn({ 1, 8, 3, 2, 32 }) * 1000)   -- new, much larger last 8 tokens
      local r = rc[2]()
      al.attention.forward{ qkv_layer = qkv1, qkv_format = "bshd", fp8_recipe = r }   -- warm the histories
      local r1, r2 = r:clone(), r:clone()
      local o1 = al.attention.forward{ qkv_layer = qkv1, qkv_format = "bshd", fp8_recipe = r1 }
      local o2 = al.attention.forward{ qkv_layer = qkv2, qkv_format = "bshd", fp8_recipe = r2 }
      local d = maxdiff(o1:narrow(2, 1, 56), o2:narrow(2, 1, 56))
      if expect then assert.are.equal(0, d) else assert.is_true(d > 0, "prefix outputs changed by masked tokens") end
    end)
  end

  it("autocast and DotProductAttention{fp8_recipe=} pick up the recipe; packed and legacy paths agree bitwise", function()
    al.manual_seed(23)
    local qkv = al.randn({ 32, 2, 3, 2, 16 })
    local r1 = al.fp8.DelayedScaling{ amax_history_len = 2 }
    local r2, r3 = r1:clone(), r1:clone()
    local o1 = al.fp8.autocast(r1, function() return al.attention.forward{ qkv_layer = qkv } end)
    local dpa = al.DotProductAttention{ num_attention_heads = 2, kv_channels = 16, fp8_recipe = r2 }
    local o2 = dpa:forward{ qkv_layer = qkv }
    local o3 = al.attention.forward{ query_layer = qkv:select(3, 1), key_layer = qkv:select(3, 2),
      value_layer = qkv:select(3, 3), fp8_recipe = r3, fp8_combine = false }
    assert.are.equal(0, maxdiff(o1, o2))
    assert.are.equal(0, maxdiff(o1, o3))
    local plain = al.attention.forward{ qkv_layer = qkv }
    assert.is_true(maxdiff(o1, plain) > 0)
    assert.are.equal(1, #r1:state().qkv.amax_history)
    assert.are.same(r1:state().o.amax_history, r2:state().o.amax_history)
  end)

  it("fp8_output (TE's): O's FP8 codes with O's scale, the float output's values exactly, and the same backward", function()
    al.manual_seed(24)
    for _, mk in ipairs({ function() return al.fp8.DelayedScaling{ amax_history_len = 2 } end,
                          function() return al.fp8.CurrentScaling{} end }) do
      local qkv = al.randn({ 24, 2, 3, 2, 16 })
      local r = mk()
      al.attention.forward{ qkv_layer = qkv, fp8_recipe = r }   -- warm the histories
      local ra, rb = r:clone(), r:clone()
      local oa, ca = al.attention.forward{ qkv_layer = qkv, fp8_recipe = ra }
      local ob, cb = al.attention.forward{ qkv_layer = qkv, fp8_recipe = rb, fp8_output = true }
      assert.are.equal("e4m3", ob.format)
      assert.are.equal("fp8_e4m3", ob.data:dtype())
      assert.are.same(oa:size(), ob:size())
      assert.are.equal(cb.fp8.f.scale_used[2], ob.scale)
      assert.is_true(ob.scale > 0 and ob.scale_inv == 1 / ob.scale)
      assert.are.equal(0, maxdiff(ob:dequantize("f32"), oa))       -- code / scale is the float output, bit for bit
      assert.are.same(ra:state().o.amax_history, rb:state().o.amax_history)
      local dout = al.randn(oa:size())
      local ga, gb = al.attention.backward(ca, dout), al.attention.backward(cb, dout)
      assert.are.equal(0, maxdiff(ga.qkv_layer, gb.qkv_layer))       -- the backward reads the codes as the float O
      assert.are.same(ra:state().dqkv.amax_history, rb:state().dqkv.amax_history)
    end
  end)

  it("fp8_output: errors name the argument and what it needs", function()
    local qkv = al.randn({ 8, 1, 3, 2, 16 })
    assert.has_error(function() al.attention.forward{ qkv_layer = qkv, fp8_output = true } end,
      "attention.forward: fp8_output: FP8 output needs an FP8 recipe (fp8_recipe=, the module's, or al.fp8.autocast)")
    assert.has_error(function() al.attention.forward{ qkv_layer = qkv, fp8_output = 1, fp8_recipe = al.fp8.DelayedScaling{} } end,
      "attention.forward: fp8_output: expected a boolean, got number")
    local ok, err = pcall(al.attention.forward, { qkv_layer = qkv, fp8_output = true,
      fp8_recipe = al.fp8.CurrentScaling{ granularity = "token" } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("fp8_output: needs the recipe's O slot scaled per tensor", 1, true), tostring(err))
    -- the C front door: an FP8 out_dtype other than fwd_format
    local T = require "attnlab.tensor"
    local C = require("attnlab.ffi").C
    local _, ctx = al.attention.forward{ qkv_layer = qkv, fp8_recipe = al.fp8.DelayedScaling{} }
    ctx.inputs.fp8.out_dtype = T.parse_dtype("fp8_e5m2")
    local o, l = T.new(), T.new()
    assert.are_not.equal(0, C.al_attn_forward(ctx.params, ctx.inputs, o.raw, l.raw, nil))
    assert.truthy(T.last_error():find("an FP8 fp8.out_dtype (fp8_output) must be fwd_format fp8_e4m3, got fp8_e5m2", 1, true),
      T.last_error())
  end)

  it("S and dP use the kernel's amaxes one step late under delayed scaling", function()
    local r = al.fp8.DelayedScaling{ amax_history_len = 1 }
    local qkv = al.randn({ 16, 1, 3, 2, 16 })
    local _, ctx = al.attention.forward{ qkv_layer = qkv, fp8_recipe = r }
    assert.are.equal(1, ctx.fp8.f.scale_used[1])             -- step 1 used the initial scale 1
    local a = r:state().s.amax_history[1]
    assert.are.equal(448 / a, r:state().s.scale)              -- and set the next one from its amax
    local _, ctx2 = al.attention.forward{ qkv_layer = qkv, fp8_recipe = r }
    assert.are.equal(448 / a, ctx2.fp8.f.scale_used[1])
  end)

  -- The S slot as cuDNN's FP8 flash kernel has it (measured on an H200, cuDNN 9.14: the fused path's
  -- amax_O equals this emulation's to 4 digits): P = exp(s - m) against the running row max of the
  -- 128-key tiles seen so far (unnormalised, <= 1), quantised with scale[S]; the row sum stays
  -- unquantised; O = (sum of quantised P V) / l. A naive Lua oracle of exactly that, with a scale[S]
  -- from an amax of 0.2 (so the large P saturate), and of the normalised alternative, which must be far off.
  it("S: unnormalised P against the running max of 128-key tiles, quantised with scale[S] (cuDNN's kernel)", function()
    al.manual_seed(5)
    local SQ, SKV, D = 3, 300, 16
    local q = al.randn({ 1, SQ, 1, D }, { dtype = "f32" })
    local k = al.randn({ 1, SKV, 1, D }, { dtype = "f32" }) * 0.5
    local v = al.randn({ 1, SKV, 1, D }, { dtype = "f32" })
    local SS, SO = 448 / 0.2, 448
    local r = al.fp8.Recipe{ amax_history_len = 1,
      scale = function(slot) if slot == "s" then return SS elseif slot == "o" then return SO end return 1 end }
    local a = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = "no_mask",
      fp8_recipe = r }
    al.attention.forward(a)                       -- step 1: every slot at its initial scale 1
    local out, ctx = al.attention.forward(a)      -- step 2: the scales above
    assert.are.equal(SS, ctx.fp8.f.scale_used[1])
    local function fq(list, sc)                   -- e4m3 quantise -> dequantise a list of numbers
      local t = al.fp8.quantize(al.tensor(list, { dtype = "f64" }), { format = "e4m3", scale = sc })
      return t:dequantize("f64"):flat_values()
    end
    local q8 = fq(q:to("f64"):flat_values(), 1)
    local k8, v8 = fq(k:to("f64"):flat_values(), 1), fq(v:to("f64"):flat_values(), 1)
    local scale = 1 / math.sqrt(D)
    local want_tiles, want_norm = {}, {}
    for i = 0, SQ - 1 do
      local s = {}
      for j = 0, SKV - 1 do
        local acc = 0
        for d = 1, D do acc = acc + q8[i * D + d] * k8[j * D + d] end
        s[j] = acc * scale
      end
      -- the kernel's way: tiles of 128 keys, running max m, unquantised sum l
      local m, l, o = -math.huge, 0, {}
      for d = 1, D do o[d] = 0 end
      for j0 = 0, SKV - 1, 128 do
        local j1 = math.min(j0 + 127, SKV - 1)
        local mt = -math.huge
        for j = j0, j1 do mt = math.max(mt, s[j]) end
        local mnew = math.max(m, mt)
        local alpha = math.exp(m - mnew)
        local p = {}
        for j = j0, j1 do p[#p + 1] = math.exp(s[j] - mnew) end
        local sum = 0
        for _, x in ipairs(p) do sum = sum + x end
        l = l * alpha + sum
        local p8 = fq(p, SS)
        for d = 1, D do
          local acc = 0
          for c = 1, #p8 do acc = acc + p8[c] * v8[(j0 + c - 1) * D + d] end
          o[d] = o[d] * alpha + acc
        end
        m = mnew
      end
      -- the normalised alternative: P = exp(s - lse) quantised
      local pn = {}
      for j = 0, SKV - 1 do pn[j + 1] = math.exp(s[j] - m) / l end
      local pn8 = fq(pn, SS)
      for d = 1, D do
        want_tiles[#want_tiles + 1] = o[d] / l
        local acc = 0
        for j = 1, SKV do acc = acc + pn8[j] * v8[(j - 1) * D + d] end
        want_norm[#want_norm + 1] = acc
      end
    end
    want_tiles, want_norm = fq(want_tiles, SO), fq(want_norm, SO)   -- O into its FP8 slot
    local got = out:to("f64"):flat_values()
    local function rel(x, y)
      local se, lo, hi = 0, math.huge, -math.huge
      for n = 1, #x do se = se + (x[n] - y[n]) ^ 2; lo = math.min(lo, y[n]); hi = math.max(hi, y[n]) end
      return math.sqrt(se / #x) / (hi - lo)
    end
    local e_tiles, e_norm = rel(got, want_tiles), rel(got, want_norm)
    assert.is_true(e_tiles < 0.01, "vs the tiled-kernel oracle: RMSE/range " .. e_tiles)
    assert.is_true(e_norm > 0.05, "the normalised alternative should be far off (saturation): " .. e_norm)
  end)

  it("explain says why FP8 runs on the cpu backend", function()
    local qkv = al.randn({ 16, 1, 3, 2, 16 })
    local text, name = al.attention.explain{ qkv_layer = qkv, fp8_recipe = al.fp8.CurrentScaling{} }
    assert.are.equal("cpu", name)
    assert.truthy(text:find("fp8: emulated", 1, true))
    assert.truthy(text:find("combine_and_quantize", 1, true))
  end)
end)

describe("fp8 CUDA parity #gpu", function()
  it("amax, quantize, dequantize, quantize_rows and MXFP8 are bit-identical on CPU and GPU", function()
    if not al.cuda.available() then pending("no GPU") return end
    al.manual_seed(31)
    local x = (al.randn({ 3, 40, 3, 4, 32 }) * 30):to("bf16")
    x:select(1, 2):select(1, 5):fill_(1e9)
    local xv = x:permute(2, 1, 3, 5, 4)      -- strided
    local xvg = x:cuda():permute(2, 1, 3, 5, 4)
    assert.are.equal(al.fp8.amax(xv), al.fp8.amax(xvg))
    for _, fmt in ipairs({ "e4m3", "e5m2" }) do
      local a, b = al.fp8.quantize(xv, { format = fmt, scale = 1.7 }), al.fp8.quantize(xvg, { format = fmt, scale = 1.7 })
      assert.is_true(same_codes(a.data, b.data:cpu()))
      assert.are.equal(0, maxdiff(a:dequantize("bf16"), b:dequantize("bf16"):cpu()))
      local ra, rb = al.fp8.quantize_rows(xv, { format = fmt, row_dims = 3, margin = 1 }),
        al.fp8.quantize_rows(xvg, { format = fmt, row_dims = 3, margin = 1 })
      assert.is_true(same_codes(ra.data, rb.data:cpu()))
      assert.are.equal(0, maxdiff(ra.scale_inv, rb.scale_inv:cpu()))
      for _, dim in ipairs({ 1, -1, 3 }) do
        local ma, mb = al.fp8.mxfp8_quantize(xv, { format = fmt, dim = dim }), al.fp8.mxfp8_quantize(xvg, { format = fmt, dim = dim })
        assert.is_true(same_codes(ma.data, mb.data:cpu()))
        assert.are.equal(0, maxdiff(ma.scales, mb.scales:cpu()))
        assert.are.equal(0, maxdiff(ma:dequantize(), mb:dequantize():cpu()))
      end
    end
    local n = al.randn({ 1000 }):cuda()
    n:narrow(1, 700, 1):fill_(0 / 0)
    local a = al.fp8.amax(n)
    assert.is_true(a ~= a)
  end)

  it("the contiguous fast paths of amax, quantize and dequantize match the CPU bit for bit", function()
    -- contiguous, 16-byte-aligned operands take the vectorised kernels (16 codes per thread, src/cuda/fp8.cu);
    -- n leaves a partial last group of 16; special values sit in full groups and in the tail; an odd offset
    -- (narrow from element 2) sends the same data through the generic kernels
    if not al.cuda.available() then pending("no GPU") return end
    al.manual_seed(32)
    local n = 16 * 37 + 5
    local base = al.randn({ n }) * 40
    local special = { 0 / 0, 1 / 0, -1 / 0, 1e9, -1e9, 1e-30, -1e-30, -0.0, 2 ^ -10, 448, 449, 464, 57344, 61440, -3.5 }
    for i, v in ipairs(special) do base:narrow(1, 3 * i, 1):fill_(v) end
    base:narrow(1, n, 1):fill_(-1e9)
    base:narrow(1, n - 2, 1):fill_(1 / 0)
    local finite = base:clone()
    finite:narrow(1, 3, 1):fill_(7)                           -- the NaN (special[1]) replaced
    local function same_amax(a, b) return a == b or (a ~= a and b ~= b) end
    for _, dt in ipairs({ "f32", "f16", "bf16" }) do
      for _, src in ipairs({ base, finite }) do
        local x = src:to(dt)
        local xg = x:cuda()
        local ac, ag = al.fp8.amax(x), al.fp8.amax(xg)
        assert.is_true(same_amax(ac, ag), dt .. ": amax " .. tostring(ac) .. " vs " .. tostring(ag))
        local tg = al.fp8.amax_tensor(xg)   -- left on the GPU (no sync), the same value
        assert.are.equal("cuda:0", tg:device())
        assert.is_true(same_amax(ac, tg:item()), dt .. ": amax_tensor " .. tostring(tg:item()))
        assert.is_true(same_amax(al.fp8.amax(x:narrow(1, 2, n - 1)), al.fp8.amax_tensor(xg:narrow(1, 2, n - 1)):item()))
        assert.is_true(same_amax(al.fp8.amax(x:narrow(1, 2, n - 1)), al.fp8.amax(xg:narrow(1, 2, n - 1))))
        for _, fmt in ipairs({ "e4m3", "e5m2" }) do
          for _, sc in ipairs({ 1.0, 1.7, 2 ^ -7 }) do
            local what = string.format("%s %s scale %g", dt, fmt, sc)
            local a, b = al.fp8.quantize(x, { format = fmt, scale = sc }), al.fp8.quantize(xg, { format = fmt, scale = sc })
            local ok, at = same_codes(a.data, b.data:cpu())
            assert.is_true(ok, what .. ": quantize differs at element " .. tostring(at))
            for _, odt in ipairs({ "f32", "f16", "bf16" }) do
              ok, at = same_codes(a:dequantize(odt), b:dequantize(odt):cpu())
              assert.is_true(ok, what .. ": dequantize to " .. odt .. " differs at element " .. tostring(at))
            end
          end
          -- quantize_amax: one pass on the fast path, the two kernels on the unaligned view; the CPU's codes and amax
          for _, xx in ipairs({ { x, xg, "aligned" }, { x:narrow(1, 2, n - 1), xg:narrow(1, 2, n - 1), "unaligned" } }) do
            local qc, ac2 = al.fp8.quantize_amax(xx[1], { format = fmt, scale = 1.7 })
            local qg, ag2 = al.fp8.quantize_amax(xx[2], { format = fmt, scale = 1.7 })
            assert.are.equal("cuda:0", ag2:device())
            local ok, at = same_codes(qc.data, qg.data:cpu())
            assert.is_true(ok, dt .. " " .. fmt .. " " .. xx[3] .. ": quantize_amax codes differ at " .. tostring(at))
            assert.is_true(same_amax(ac2:item(), ag2:item()), dt .. " " .. fmt .. " " .. xx[3] .. ": quantize_amax amax " ..
              tostring(ac2:item()) .. " vs " .. tostring(ag2:item()))
          end
          local a = al.fp8.quantize(x:narrow(1, 2, n - 1), { format = fmt, scale = 1.7 })
          local b = al.fp8.quantize(xg:narrow(1, 2, n - 1), { format = fmt, scale = 1.7 })
          assert.is_true(same_codes(a.data, b.data:cpu()), dt .. " " .. fmt .. ": unaligned quantize")
          assert.is_true(same_codes(a:dequantize("bf16"), b:dequantize("bf16"):cpu()), dt .. " " .. fmt .. ": dequantize")
        end
      end
    end
  end)

  it("FP8 attention on cuda tensors goes to the fused backend's cuDNN FP8 path or says why not", function()
    if not al.cuda.available() then pending("no GPU") return end
    local qkv = al.randn({ 16, 1, 3, 2, 16 }, { dtype = "bf16" }):cuda()
    local text, name = al.attention.explain{ qkv_layer = qkv, fp8_recipe = al.fp8.DelayedScaling{} }
    -- details (Hopper, head dims, declines) in tests/spec/fp8_fused_spec.lua
    assert.truthy(name == "fused" or text:find("fused%s+no: ") ~= nil, text)
    assert.falsy(text:find("not implemented yet", 1, true), text)
  end)
end)
