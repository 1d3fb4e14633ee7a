--[[
attnlab.layers — Torch7-style building blocks around attention: al.nn.Linear, al.nn.LayerNorm,
al.nn.RMSNorm, al.nn.L2Normalization (QK-norm) and al.nn.RotaryEmbedding (interleaved or half-split).

  local lin = al.nn.Linear(64, 192, {bias = true, params_dtype = "f32"})   -- or al.nn.Linear{in_features=, out_features=}
  local y = lin:forward(x)                 -- x [.., 64] -> [.., 192]   (al.matmul: CBLAS / cuBLASLt)
  local dx = lin:backward(x, dy)           -- returns dL/dx and accumulates lin.grad_weight / lin.grad_bias
  local params, grads = lin:parameters()   -- { weight, bias }, { grad_weight, grad_bias }
  lin:zero_grad()

  local ln = al.nn.LayerNorm(64, {eps = 1e-5})          -- weight ones, bias zeros (as TE)
  local rms = al.nn.RMSNorm(64, {eps = 1e-5})
  local rope = al.nn.RotaryEmbedding{dim = 32, rotary_base = 10000, interleaved = false}
  local y = rope:forward(q, {positions = pos})         -- q [.., h, d]; pos broadcastable to q's [..] (token dims)
  local dq = rope:backward(q, dy, {positions = pos})

Every module: forward(input), backward(input, grad_output) (grad_input, accumulating parameter
gradients), parameters(), zero_grad() (also zeroGradParameters), deterministic initialisation from
al.manual_seed. Backward passes are written by hand with al ops (matmul, sums over dims,
broadcasting); everything runs on whatever device the tensors live on. Norms work over the last dim,
over any leading shape (QK-norm applies them per head on [.., h, d]).

Conventions as TransformerEngine/PyTorch: Linear's weight is [out_features, in_features] and
y = x W^T + b; LayerNorm y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance);
RMSNorm y = x / sqrt(mean(x^2) + eps) * weight; L2Normalization y = x / sqrt(sum(x^2) + eps).
RoPE (TE's apply_rotary_pos_emb): inv_freq_i = base^(-2i/dim), angle = pos * inv_freq_i; pairs are
(i, i + dim/2) when half-split (TE's default, rotate_half) and (2i, 2i+1) when interleaved; channels
past `dim` pass through unchanged.
]]
local M = {}

local ffi = require("attnlab.ffi").ffi
local C = require("attnlab.ffi").C
local T = require "attnlab.tensor"

-- dims {1, .., n} of the leading dims of a tensor with `nd` dims (the reduction for parameter grads)
local function leading_dims(nd)
  local d = {}
  for i = 1, nd - 1 do d[i] = i end
  return d
end

-- sum over every dim but the last (a [.., n] tensor -> [n])
local function sum_leading(t)
  if t:dim() == 1 then return t end
  return t:sum(leading_dims(t:dim()))
end
M.sum_leading = sum_leading

-- g <- g + d, in place (the grad tensor keeps its identity: parameters() hands it out)
local function accumulate(g, d)
  g:copy_(g + d)
end
M.accumulate = accumulate

local function opts_of(fname, cfg)
  local dtype = cfg.params_dtype or cfg.dtype or "f32"
  local device = cfg.device or "cpu"
  return { dtype = dtype, device = device }
end

local function check_int(fname, name, v)
  if type(v) ~= "number" or v % 1 ~= 0 or v < 1 then
    error(string.format("%s: %s: expected a positive integer, got %s", fname, name, tostring(v)), 4)
  end
end

local function check_input(fname, x, n, what)
  if not T.is_tensor(x) then error(fname .. ": input: expected a tensor, got " .. type(x), 3) end
  if x:dim() < 1 or x:size(-1) ~= n then
    error(string.format("%s: input: expected a tensor whose last dim is %s = %d, got shape [%s]", fname, what, n,
      table.concat(x:size(), ",")), 3)
  end
end

-- A class table with Torch7 aliases, exposed as al.nn.<name>(...) (and .methods for extension).
local function class(al, name, ctor)
  local cls = {}
  cls.__index = cls
  cls.__name = name
  function cls:zeroGradParameters() return self:zero_grad() end
  function cls:updateOutput(input) return self:forward(input) end
  function cls:__tostring() return "al.nn." .. name .. (self._describe and ("(" .. self:_describe() .. ")") or "()") end
  al.nn[name] = setmetatable({ methods = cls }, { __call = function(_, ...) return ctor(cls, ...) end })
  return cls
end
M.class = class

function M.install(al)
  al.nn = al.nn or {}

  -------------------------------------------------------------------------------------------------
  -- Linear
  -------------------------------------------------------------------------------------------------
  local function linear_new(cls, a, b, c)
    local fname = "nn.Linear"
    local cfg
    if type(a) == "table" then cfg = a
    else
      cfg = {}
      for k, v in pairs(c or {}) do cfg[k] = v end
      cfg.in_features, cfg.out_features = a, b
    end
    local nin, nout = cfg.in_features, cfg.out_features
    check_int(fname, "in_features", nin)
    check_int(fname, "out_features", nout)
    local o = opts_of(fname, cfg)
    -- PyTorch's default bound 1/sqrt(in_features), drawn from the default Philox stream
    local bound = 1 / math.sqrt(nin)
    local w = al.rand({ nout, nin }, o)
    w = w * (2 * bound) - bound
    if w:dtype() ~= o.dtype then w = w:to(o.dtype) end
    local self = setmetatable({ in_features = nin, out_features = nout, weight = w,
      grad_weight = al.zeros({ nout, nin }, o), use_bias = cfg.bias ~= false }, cls)
    if self.use_bias then
      -- TE initialises the bias to zeros
      self.bias = al.zeros({ nout }, o)
      self.grad_bias = al.zeros({ nout }, o)
    end
    return self
  end
  local Linear = class(al, "Linear", linear_new)

  function Linear:forward(x)
    check_input("Linear:forward", x, self.in_features, "in_features")
    local y = al.matmul(x, self.weight:t())
    if self.bias then y = y + self.bias end
    self.output = y
    return y
  end

  function Linear:backward(x, dy)
    check_input("Linear:backward", x, self.in_features, "in_features")
    check_input("Linear:backward", dy, self.out_features, "out_features")
    local dx = al.matmul(dy, self.weight)
    local n = dy:numel() / self.out_features
    local dy2 = dy:reshape({ n, self.out_features })
    local x2 = x:reshape({ n, self.in_features })
    accumulate(self.grad_weight, al.matmul(dy2:t(), x2))
    if self.bias then accumulate(self.grad_bias, dy2:sum(1)) end
    self.gradInput = dx
    return dx
  end

  function Linear:parameters()
    if self.bias then return { self.weight, self.bias }, { self.grad_weight, self.grad_bias } end
    return { self.weight }, { self.grad_weight }
  end
  function Linear:zero_grad()
    self.grad_weight:zero_()
    if self.grad_bias then self.grad_bias:zero_() end
  end
  function Linear:_describe()
    return string.format("%d -> %d%s", self.in_features, self.out_features, self.bias and "" or ", no bias")
  end

  -------------------------------------------------------------------------------------------------
  -- LayerNorm, RMSNorm, L2Normalization (over the last dim)
  -------------------------------------------------------------------------------------------------
  local function norm_new(kind)
    return function(cls, a, b)
      local fname = "nn." .. kind
      local cfg
      if type(a) == "table" then cfg = a
      else
        cfg = {}
        for k, v in pairs(b or {}) do cfg[k] = v end
        cfg.normalized_shape = a
      end
      local n = cfg.normalized_shape or cfg.hidden_size
      check_int(fname, "normalized_shape", n)
      local eps = cfg.eps or (kind == "L2Normalization" and 1e-6 or 1e-5)
      if type(eps) ~= "number" or eps < 0 then error(fname .. ": eps: expected a number >= 0, got " .. tostring(eps), 3) end
      local o = opts_of(fname, cfg)
      local self = setmetatable({ normalized_shape = n, eps = eps, kind = kind }, cls)
      if kind ~= "L2Normalization" then
        self.weight = al.ones({ n }, o)
        self.grad_weight = al.zeros({ n }, o)
        if kind == "LayerNorm" then
          self.bias = al.zeros({ n }, o)
          self.grad_bias = al.zeros({ n }, o)
        end
      end
      return self
    end
  end

  local function norm_class(kind)
    local cls = class(al, kind, norm_new(kind))

    -- xhat and rstd of x (the statistics in x's dtype; the C reductions accumulate in f64/f32)
    function cls:_stats(x)
      local xc, r
      if kind == "LayerNorm" then
        xc = x - x:mean(-1, true)
        r = ((xc * xc):mean(-1, true) + self.eps):sqrt()
      elseif kind == "RMSNorm" then
        xc = x
        r = ((x * x):mean(-1, true) + self.eps):sqrt()
      else
        xc = x
        r = ((x * x):sum(-1, true) + self.eps):sqrt()
      end
      local rstd = 1 / r
      return xc * rstd, rstd
    end

    function cls:forward(x)
      check_input(kind .. ":forward", x, self.normalized_shape, "normalized_shape")
      local xhat, rstd = self:_stats(x)
      self._x, self._xhat, self._rstd = x, xhat, rstd
      local y = xhat
      if self.weight then y = y * self.weight end
      if self.bias then y = y + self.bias end
      self.output = y
      return y
    end

    function cls:backward(x, dy)
      check_input(kind .. ":backward", x, self.normalized_shape, "normalized_shape")
      check_input(kind .. ":backward", dy, self.normalized_shape, "normalized_shape")
      local xhat, rstd
      if x == self._x then xhat, rstd = self._xhat, self._rstd else xhat, rstd = self:_stats(x) end
      local g = dy
      if self.weight then
        accumulate(self.grad_weight, sum_leading(dy * xhat))
        g = dy * self.weight
      end
      if self.bias then accumulate(self.grad_bias, sum_leading(dy)) end
      local dx
      if kind == "LayerNorm" then
        -- dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dx = (g - g:mean(-1, true) - xhat * (g * xhat):mean(-1, true)) * rstd
      elseif kind == "RMSNorm" then
        dx = (g - xhat * (g * xhat):mean(-1, true)) * rstd
      else
        dx = (g - xhat * (g * xhat):sum(-1, true)) * rstd
      end
      self.gradInput = dx
      return dx
    end

    function cls:parameters()
      if self.bias then return { self.weight, self.bias }, { self.grad_weight, self.grad_bias } end
      if self.weight then return { self.weight }, { self.grad_weight } end
      return {}, {}
    end
    function cls:zero_grad()
      if self.grad_weight then self.grad_weight:zero_() end
      if self.grad_bias then self.grad_bias:zero_() end
    end
    function cls:_describe() return string.format("%d, eps=%g", self.normalized_shape, self.eps) end
    return cls
  end
  norm_class("LayerNorm")
  norm_class("RMSNorm")
  norm_class("L2Normalization")

  -- QK-norm by TE's name (qk_norm_type): "RMSNorm", "LayerNorm", "L2Normalization" (true = RMSNorm).
  function al.nn.QKNorm(kind, head_dim, cfg)
    if kind == true then kind = "RMSNorm" end
    if kind ~= "RMSNorm" and kind ~= "LayerNorm" and kind ~= "L2Normalization" then
      error("nn.QKNorm: qk_norm_type: expected 'RMSNorm', 'LayerNorm' or 'L2Normalization', got " .. tostring(kind), 2)
    end
    local c = {}
    for k, v in pairs(cfg or {}) do c[k] = v end
    c.normalized_shape = head_dim
    return al.nn[kind](c)
  end

  -------------------------------------------------------------------------------------------------
  -- RotaryEmbedding
  -------------------------------------------------------------------------------------------------
  local function rope_new(cls, cfg)
    local fname = "nn.RotaryEmbedding"
    if type(cfg) == "number" then cfg = { dim = cfg } end
    if type(cfg) ~= "table" then error(fname .. ": expected a table {dim=, rotary_base=, interleaved=}, got " .. type(cfg), 2) end
    local dim = cfg.dim
    check_int(fname, "dim", dim)
    if dim % 2 ~= 0 then error(fname .. ": dim: expected an even number, got " .. dim, 2) end
    -- a rotary dim is a head dim: anything past 2^16 is a typo (and would build a huge frequency table)
    if dim < 2 or dim > 65536 then error(fname .. ": dim: expected an even head dim in [2, 65536], got " .. dim, 2) end
    local base = cfg.rotary_base or 10000
    local self = setmetatable({ dim = dim, rotary_base = base, interleaved = cfg.interleaved or false }, cls)
    self.inv_freq = {}
    for i = 0, dim / 2 - 1 do self.inv_freq[i + 1] = base ^ (-(2 * i) / dim) end
    return self
  end
  local Rope = class(al, "RotaryEmbedding", rope_new)

  local pos_buf_size = 0
  local cbuf, sbuf

  -- cos and sin tensors [pshape..., dim/2] for positions given as a flat Lua list with shape pshape.
  function Rope:cos_sin(positions, pshape, dtype, device)
    local n = #positions
    local half = self.dim / 2
    local total = n * half
    if total > pos_buf_size then
      pos_buf_size = total
      cbuf, sbuf = ffi.new("double[?]", total), ffi.new("double[?]", total)
    end
    local inv = self.inv_freq
    local k = 0
    for i = 1, n do
      local p = positions[i]
      for j = 1, half do
        local a = p * inv[j]
        cbuf[k], sbuf[k] = math.cos(a), math.sin(a)
        k = k + 1
      end
    end
    local shape = {}
    for i = 1, #pshape do shape[i] = pshape[i] end
    shape[#shape + 1] = half
    local c = al.empty(shape, { dtype = dtype, device = device })
    local s = al.empty(shape, { dtype = dtype, device = device })
    T.check(C.al_tensor_write_f64(c.raw, cbuf, total), "RotaryEmbedding")
    T.check(C.al_tensor_write_f64(s.raw, sbuf, total), "RotaryEmbedding")
    return c, s
  end

  -- The two halves of each rotated pair as strided views of t's first `dim` channels.
  function Rope:_pairs(t)
    local size, stride = t:size(), t:stride()
    local nd = #size
    local sl = stride[nd]
    local half = self.dim / 2
    local s2 = {}
    for i = 1, nd do s2[i] = stride[i] end
    size[nd] = half
    local off = t:storage_offset()
    if self.interleaved then
      s2[nd] = 2 * sl
      return t:as_strided(size, s2, off), t:as_strided(size, s2, off + sl)
    end
    return t:as_strided(size, s2, off), t:as_strided(size, s2, off + half * sl)
  end

  -- positions (a tensor, a nested table, or {flat=, shape=}) -> flat list + shape broadcastable to
  -- t's token dims: t is [.., h, d] and positions cover the dims before h (cos/sin broadcast over heads)
  local function positions_of(t, opts)
    local p = opts and opts.positions
    if p == nil then
      error("RotaryEmbedding: opts.positions: expected the positions (a tensor or nested table broadcastable to " ..
        "the input's shape without its last dim), got nothing", 4)
    end
    local flat, shape
    if T.is_tensor(p) then flat, shape = p:flat_values(), p:size()
    elseif type(p) == "table" and p.flat then flat, shape = p.flat, p.shape
    elseif type(p) == "table" then
      local x = al.tensor(p, { dtype = "f64" })
      flat, shape = x:flat_values(), x:size()
    else
      error("RotaryEmbedding: opts.positions: expected a tensor or a table, got " .. type(p), 4)
    end
    if #shape ~= t:dim() - 2 then
      error(string.format("RotaryEmbedding: positions must have %d dims (the input's without heads and channels), got %d",
        t:dim() - 2, #shape), 4)
    end
    return flat, shape
  end

  -- y = rotate(t) with the given cos/sin (sign -1 applies the inverse rotation: the backward)
  function Rope:_apply(t, c, s, sign)
    if t:size(-1) < self.dim then
      error(string.format("RotaryEmbedding: the input's last dim (%d) is smaller than dim = %d", t:size(-1), self.dim), 3)
    end
    local x1, x2 = self:_pairs(t)
    local out = al.empty_like(t)
    local o1, o2 = self:_pairs(out)
    if sign < 0 then s = -s end
    o1:copy_(x1 * c - x2 * s)
    o2:copy_(x2 * c + x1 * s)
    local d = t:size(-1)
    if d > self.dim then
      out:narrow(-1, self.dim + 1, d - self.dim):copy_(t:narrow(-1, self.dim + 1, d - self.dim))
    end
    return out
  end

  function Rope:_cs(t, opts)
    if opts and opts.cos and opts.sin then return opts.cos, opts.sin end
    local flat, shape = positions_of(t, opts)
    return self:cos_sin(flat, shape, t:dtype(), t:device())
  end

  function Rope:forward(t, opts)
    if not T.is_tensor(t) then error("RotaryEmbedding:forward: input: expected a tensor, got " .. type(t), 2) end
    local c, s = self:_cs(t, opts)
    local y = self:_apply(t, c:unsqueeze(-2), s:unsqueeze(-2), 1)
    self.output = y
    return y
  end
  function Rope:backward(t, dy, opts)
    if not T.is_tensor(dy) then error("RotaryEmbedding:backward: grad_output: expected a tensor, got " .. type(dy), 2) end
    local c, s = self:_cs(t, opts)
    local dx = self:_apply(dy, c:unsqueeze(-2), s:unsqueeze(-2), -1)
    self.gradInput = dx
    return dx
  end
  function Rope:parameters() return {}, {} end
  function Rope:zero_grad() end
  function Rope:_describe()
    return string.format("dim=%d, base=%g, %s", self.dim, self.rotary_base, self.interleaved and "interleaved" or "half-split")
  end
end

return M
