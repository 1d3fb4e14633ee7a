-- Shared helpers for the nn specs (layers, mha, inference): element access, naive loops and central
-- finite differences in f64.
local al = require "attnlab"
local M = {}

-- a fresh standard-normal f64 tensor of the given shape
function M.rnd(shape) return al.randn(shape, { dtype = "f64" }) end

-- give every parameter of module m random values scale * N(0, 1) + shift (never the zeros/ones of the
-- initialisation, which would hide a gradient that ignores them)
function M.randomize(m, scale, shift)
  for _, t in ipairs(m:parameters()) do t:copy_(al.randn_like(t) * scale + shift) end
end

-- set element i (1-based, row-major) of a contiguous tensor
function M.set(t, i, v)
  t:view(-1):narrow(1, i, 1):fill_(v)
end

function M.maxdiff(a, b)
  local m = 0
  assert(#a == #b, "length " .. #a .. " vs " .. #b)
  for i = 1, #a do
    local d = math.abs(a[i] - b[i])
    if d ~= d then return math.huge end
    if d > m then m = d end
  end
  return m
end

-- Central finite differences of L = sum(f() * W) with respect to every element (or every `stride`-th)
-- of each tensor in `wrt` (contiguous f64), against `analytic` (same order). f() returns a tensor.
-- Returns the largest |fd - analytic| relative to max(1, |analytic|).
function M.fd(f, W, wrt, analytic, stride, eps)
  eps = eps or 1e-6
  local w = W:flat_values()
  local function loss()
    local v = f():flat_values()
    local s = 0
    for i = 1, #v do s = s + v[i] * w[i] end
    return s
  end
  local worst, n = 0, 0
  for j, t in ipairs(wrt) do
    assert(t:is_contiguous(), "fd: tensor " .. j .. " must be contiguous")
    local vals = t:flat_values()
    local g = analytic[j]:contiguous():flat_values()
    assert(#g == #vals, "fd: gradient " .. j .. " has " .. #g .. " elements, the tensor " .. #vals)
    local step = stride or 1
    for i = 1 + (j % step), #vals, step do
      M.set(t, i, vals[i] + eps)
      local lp = loss()
      M.set(t, i, vals[i] - eps)
      local lm = loss()
      M.set(t, i, vals[i])
      local num = (lp - lm) / (2 * eps)
      local err = math.abs(num - g[i]) / math.max(1, math.abs(g[i]))
      if err > worst then worst = err end
      n = n + 1
    end
  end
  return worst, n
end

-- row-major flat list -> accessor a(i, j, ...) for a given shape
function M.idx(shape)
  return function(...)
    local k, n = 0, select("#", ...)
    for d = 1, n do k = k * shape[d] + (select(d, ...) - 1) end
    return k + 1
  end
end

-- naive y = x W^T + b over plain Lua lists: xv holds `rows` rows of nin values (row-major), w is [nout, nin]
-- and b [nout] (or nil) as tensors; returns rows * nout values
function M.linear(xv, rows, nin, w, b, nout)
  local wv, bv = w:flat_values(), b and b:flat_values()
  local y = {}
  for r = 1, rows do
    for o = 1, nout do
      local s = bv and bv[o] or 0
      for i = 1, nin do s = s + xv[(r - 1) * nin + i] * wv[(o - 1) * nin + i] end
      y[(r - 1) * nout + o] = s
    end
  end
  return y
end

-- one vector v (a Lua list) normalised as `kind` (LayerNorm, RMSNorm, L2Normalization), then scaled by the
-- list w and shifted by the list b where given
function M.norm_vec(kind, v, eps, w, b)
  local n, mean, sq = #v, 0, 0
  for i = 1, n do mean = mean + v[i] end
  mean = mean / n
  local c = kind == "LayerNorm" and mean or 0
  for i = 1, n do sq = sq + (v[i] - c) ^ 2 end
  local den = kind == "L2Normalization" and math.sqrt(sq + eps) or math.sqrt(sq / n + eps)
  local out = {}
  for i = 1, n do
    out[i] = (v[i] - c) / den * (w and w[i] or 1) + (b and b[i] or 0)
  end
  return out
end

return M
