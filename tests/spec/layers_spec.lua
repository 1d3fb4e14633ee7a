-- al.nn.Linear, LayerNorm, RMSNorm, L2Normalization, RotaryEmbedding and al.optim: outputs against
-- naive Lua loops, every gradient (inputs and parameters) against central finite differences in f64,
-- optimiser steps against the textbook formulas; the same on cuda (#gpu) against the CPU.
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"
local chk = require "nn_check"

local rnd = chk.rnd

local function randomize(m) chk.randomize(m, 0.5, 0.3) end

local function naive_linear(x, w, b, nin, nout)
  local xv = x:flat_values()
  return chk.linear(xv, #xv / nin, nin, w, b, nout)
end

-- every row of n values of x normalised (nn_check.norm_vec), as one flat list
local function naive_norm(kind, x, n, eps, w, b)
  local xv = x:flat_values()
  local wv, bv = w and w:flat_values(), b and b:flat_values()
  local y = {}
  for r = 1, #xv / n do
    local row = {}
    for i = 1, n do row[i] = xv[(r - 1) * n + i] end
    for i, v in ipairs(chk.norm_vec(kind, row, eps, wv, bv)) do y[(r - 1) * n + i] = v end
  end
  return y
end

-- q [b, s, h, d], positions pos[b][s] (Lua), rotating the first `dim` channels
local function naive_rope(q, pos, dim, base, interleaved)
  local sz = q:size()
  local b, s, h = sz[1], sz[2], sz[3]
  local qv = q:flat_values()
  local at = chk.idx(sz)
  local y = {}
  for i = 1, #qv do y[i] = qv[i] end
  for bi = 1, b do for si = 1, s do for hi = 1, h do
    for i = 0, dim / 2 - 1 do
      local ia, ib
      if interleaved then ia, ib = 2 * i + 1, 2 * i + 2 else ia, ib = i + 1, i + 1 + dim / 2 end
      local ang = pos[bi][si] * base ^ (-2 * i / dim)
      local xa, xb = qv[at(bi, si, hi, ia)], qv[at(bi, si, hi, ib)]
      y[at(bi, si, hi, ia)] = xa * math.cos(ang) - xb * math.sin(ang)
      y[at(bi, si, hi, ib)] = xb * math.cos(ang) + xa * math.sin(ang)
    end
  end end end
  return y
end

describe("nn layers", function()
  before_each(function() al.manual_seed(20240917) end)

  describe("Linear", function()
    for _, bias in ipairs({ true, false }) do
      it("forward equals the naive x W^T + b, and every gradient equals finite differences (bias=" .. tostring(bias) .. ")", function()
        local lin = al.nn.Linear(5, 3, { bias = bias, params_dtype = "f64" })
        randomize(lin)
        local x = rnd({ 2, 4, 5 })
        local y = lin:forward(x)
        assert.are.same({ 2, 4, 3 }, y:size())
        local want = naive_linear(x, lin.weight, lin.bias, 5, 3)
        assert.is_true(chk.maxdiff(y:flat_values(), want) < 1e-12)
        local W = rnd({ 2, 4, 3 })
        lin:zero_grad()
        local dx = lin:backward(x, W)
        local wrt, an = { x, lin.weight }, { dx, lin.grad_weight }
        if bias then wrt[3], an[3] = lin.bias, lin.grad_bias end
        local err, n = chk.fd(function() return lin:forward(x) end, W, wrt, an)
        assert.equal(40 + 15 + (bias and 3 or 0), n)
        assert.is_true(err < 1e-7, "fd error " .. err)
      end)
    end

    it("accumulates parameter gradients until zero_grad, and parameters() hands out the same tensors", function()
      local lin = al.nn.Linear{ in_features = 3, out_features = 2, params_dtype = "f64" }
      local x, dy = rnd({ 4, 3 }), rnd({ 4, 2 })
      lin:backward(x, dy)
      local once = lin.grad_weight:clone()
      lin:backward(x, dy)
      assert.is_true(al.max_abs_diff(lin.grad_weight, once * 2) < 1e-12)
      local p, g = lin:parameters()
      assert.equal(lin.weight, p[1]); assert.equal(lin.grad_weight, g[1]); assert.equal(lin.grad_bias, g[2])
      lin:zero_grad()
      assert.equal(0, lin.grad_weight:abs():max())
      assert.equal(0, lin.grad_bias:abs():max())
    end)

    it("initialises deterministically from al.manual_seed, within PyTorch's bound 1/sqrt(in)", function()
      al.manual_seed(7)
      local a = al.nn.Linear(16, 8)
      al.manual_seed(7)
      local b = al.nn.Linear(16, 8)
      assert.equal(0, al.max_abs_diff(a.weight, b.weight))
      assert.is_true(a.weight:abs():max() <= 0.25)
      assert.is_true(a.weight:abs():max() > 0.1)
      local c = al.nn.Linear(16, 8)
      assert.is_true(al.max_abs_diff(a.weight, c.weight) > 0)
    end)

    it("names the argument in its errors", function()
      local lin = al.nn.Linear(4, 2)
      assert.has_error(function() lin:forward(al.randn({ 3, 5 })) end,
        "Linear:forward: input: expected a tensor whose last dim is in_features = 4, got shape [3,5]")
      assert.has_error(function() al.nn.Linear(0, 2) end, "nn.Linear: in_features: expected a positive integer, got 0")
    end)
  end)

  for _, kind in ipairs({ "LayerNorm", "RMSNorm", "L2Normalization" }) do
    it(kind .. ": forward equals the naive formula and every gradient equals finite differences", function()
      local m = al.nn[kind](6, { eps = 1e-5, params_dtype = "f64" })
      randomize(m)
      local x = rnd({ 3, 2, 6 }) * 1.5 + 0.7
      local y = m:forward(x)
      local want = naive_norm(kind, x, 6, 1e-5, m.weight, m.bias)
      assert.is_true(chk.maxdiff(y:flat_values(), want) < 1e-12)
      local W = rnd({ 3, 2, 6 })
      m:zero_grad()
      local dx = m:backward(x, W)
      local wrt, an = { x }, { dx }
      local p, g = m:parameters()
      for i = 1, #p do wrt[#wrt + 1], an[#an + 1] = p[i], g[i] end
      assert.equal(kind == "LayerNorm" and 2 or kind == "RMSNorm" and 1 or 0, #p)
      local err = chk.fd(function() return m:forward(x) end, W, wrt, an)
      assert.is_true(err < 1e-7, "fd error " .. err)
    end)
  end

  it("QKNorm builds the TE qk_norm_type modules over the head dim and rejects others", function()
    local n = al.nn.QKNorm("RMSNorm", 8)
    assert.equal(8, n.normalized_shape)
    assert.equal(1e-6, al.nn.QKNorm(true, 4, { eps = 1e-6 }).eps)
    assert.has_error(function() al.nn.QKNorm("BatchNorm", 8) end,
      "nn.QKNorm: qk_norm_type: expected 'RMSNorm', 'LayerNorm' or 'L2Normalization', got BatchNorm")
  end)

  for _, inter in ipairs({ false, true }) do
    it("RotaryEmbedding (" .. (inter and "interleaved" or "half-split") .. ", partial dim) equals the naive rotation; backward equals finite differences", function()
      local rope = al.nn.RotaryEmbedding{ dim = 6, rotary_base = 100, interleaved = inter }
      -- a non-contiguous input: the q view of a packed [b, s, h, 3, d] buffer
      local packed = rnd({ 2, 3, 2, 3, 8 })
      local q = packed:select(4, 1)
      local pos = { { 0, 1, 2 }, { 5, 6, 9 } }
      local y = rope:forward(q, { positions = pos })
      local want = naive_rope(q, pos, 6, 100, inter)
      assert.is_true(chk.maxdiff(y:flat_values(), want) < 1e-12)
      -- channels past dim pass through unchanged
      assert.equal(0, al.max_abs_diff(y:narrow(-1, 7, 2), q:narrow(-1, 7, 2)))
      local qc = q:clone()
      local W = rnd({ 2, 3, 2, 8 })
      local dq = rope:backward(qc, W, { positions = pos })
      local err = chk.fd(function() return rope:forward(qc, { positions = pos }) end, W, { qc }, { dq })
      assert.is_true(err < 1e-7, "fd error " .. err)
    end)
  end

  it("RotaryEmbedding with broadcast positions [1, s] equals per-batch positions, and rejects a wrong rank", function()
    local rope = al.nn.RotaryEmbedding{ dim = 4 }
    local q = rnd({ 2, 3, 1, 4 })
    local a = rope:forward(q, { positions = { { 0, 1, 2 } } })
    local b = rope:forward(q, { positions = { { 0, 1, 2 }, { 0, 1, 2 } } })
    assert.equal(0, al.max_abs_diff(a, b))
    assert.is_true(al.max_abs_diff(a, q) > 1e-3)
    assert.has_error(function() rope:forward(q, { positions = { 0, 1, 2 } }) end,
      "RotaryEmbedding: positions must have 2 dims (the input's without heads and channels), got 1")
  end)

  describe("optim", function()
    it("SGD with momentum and weight decay equals torch.optim.SGD's update over two steps", function()
      local p, g = rnd({ 5 }), rnd({ 5 })
      local pv, gv = p:flat_values(), g:flat_values()
      local opt = al.optim.SGD({ p }, { g }, { lr = 0.1, momentum = 0.9, weight_decay = 0.01 })
      opt:step(); opt:step()
      local want, buf = {}, {}
      for i = 1, 5 do
        local x = pv[i]
        for s = 1, 2 do
          local d = gv[i] + 0.01 * x
          buf[i] = s == 1 and d or 0.9 * buf[i] + d
          x = x - 0.1 * buf[i]
        end
        want[i] = x
      end
      assert.is_true(chk.maxdiff(p:flat_values(), want) < 1e-14)
    end)

    it("Adam equals the bias-corrected textbook update over three steps; zero_grad clears the grads", function()
      local p, g = rnd({ 2, 3 }), rnd({ 2, 3 })
      local pv, gv = p:flat_values(), g:flat_values()
      local opt = al.optim.Adam({ p }, { g }, { lr = 0.01, betas = { 0.8, 0.9 }, eps = 1e-6, weight_decay = 0.1 })
      for _ = 1, 3 do opt:step() end
      local want = {}
      for i = 1, 6 do
        local x, m, v = pv[i], 0, 0
        for t = 1, 3 do
          local d = gv[i] + 0.1 * x
          m = 0.8 * m + 0.2 * d
          v = 0.9 * v + 0.1 * d * d
          x = x - 0.01 * (m / (1 - 0.8 ^ t)) / (math.sqrt(v / (1 - 0.9 ^ t)) + 1e-6)
        end
        want[i] = x
      end
      assert.is_true(chk.maxdiff(p:flat_values(), want) < 1e-12)
      opt:zero_grad()
      assert.equal(0, g:abs():max())
      assert.has_error(function() al.optim.Adam({ p }, {}) end, "optim.Adam: 1 params but 0 grads")
    end)
  end)
end)

describe("nn layers on cuda #gpu", function()
  local function gpu_it(name, fn)
    if HAS_GPU then it(name, fn) else pending(name .. " (no GPU)") end
  end
  gpu_it("Linear, LayerNorm, RMSNorm and RoPE give the CPU's outputs and gradients on cuda", function()
    al.manual_seed(3)
    local x = al.randn({ 2, 5, 16 })
    local dy = al.randn({ 2, 5, 16 })
    for _, ctor in ipairs({
      function(dev) return al.nn.Linear(16, 16, { device = dev }) end,
      function(dev) return al.nn.LayerNorm(16, { device = dev }) end,
      function(dev) return al.nn.RMSNorm(16, { device = dev }) end,
    }) do
      al.manual_seed(11)
      local c = ctor("cpu")
      al.manual_seed(11)
      local g = ctor("cuda")
      local yc, yg = c:forward(x), g:forward(x:cuda())
      assert.is_true(al.max_abs_diff(yc, yg) < 1e-4)
      local dc, dg = c:backward(x, dy), g:backward(x:cuda(), dy:cuda())
      assert.is_true(al.max_abs_diff(dc, dg) < 1e-4)
      local _, gc = c:parameters()
      local _, gg = g:parameters()
      for i = 1, #gc do assert.is_true(al.max_abs_diff(gc[i], gg[i]) < 1e-3) end
    end
    local rope = al.nn.RotaryEmbedding{ dim = 8 }
    local q = al.randn({ 2, 5, 2, 8 })
    local pos = { { 0, 1, 2, 3, 4 } }
    assert.is_true(al.max_abs_diff(rope:forward(q, { positions = pos }), rope:forward(q:cuda(), { positions = pos })) < 1e-5)
  end)
end)
