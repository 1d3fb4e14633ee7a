--[[
attnlab.variants.deriv — symbolic derivatives of a traced expression (attnlab.variants.sym).

deriv(root, wrt) is d root / d wrt as a new simplified tree: wrt is the `score` variable (the backward's
score_grad = grad * d(new logit)/d(score)) or a capture's load node (a parameter's partial, for the
capture gradients). Comparisons, logic and integer-indexed reads are piecewise constant (derivative 0);
abs / min / max / where take the derivative of the branch the value comes from. The result is always a
float tree.
]]
local sym = require "attnlab.variants.sym"

local M = {}
local S, const, cval = sym.S, sym.const, sym.cval

local ZERO_F, ONE_F
local function deriv(root, wrt)
  ZERO_F = ZERO_F or const(0, "f")
  ONE_F = ONE_F or const(1, "f")
  local memo, dep = {}, {}
  local function depends(n)
    local d = dep[n]
    if d ~= nil then return d end
    d = rawequal(n, wrt)
    if not d then for _, a in ipairs(n.args) do if depends(a) then d = true break end end end
    dep[n] = d
    return d
  end
  local function D(n)
    if not depends(n) then return ZERO_F end
    if rawequal(n, wrt) then return ONE_F end
    local r = memo[n]
    if r then return r end
    local op, a, b = n.op, n.args[1], n.args[2]
    if op == "add" then r = S.add(D(a), D(b))
    elseif op == "sub" then r = S.sub(D(a), D(b))
    elseif op == "neg" then r = S.neg(D(a))
    elseif op == "mul" then r = S.add(S.mul(D(a), b), S.mul(a, D(b)))
    elseif op == "div" then r = S.sub(S.div(D(a), b), S.div(S.mul(a, D(b)), S.mul(b, b)))
    elseif op == "pow" then
      local e = tonumber(n.x)
      r = S.mul(S.mul(const(e, "f"), S.pow(a, e - 1)), D(a))
    elseif op == "exp" then r = S.mul(n, D(a))
    elseif op == "log" then r = S.div(D(a), a)
    elseif op == "tanh" then r = S.mul(S.sub(ONE_F, S.mul(n, n)), D(a))
    elseif op == "sqrt" then r = S.div(D(a), S.mul(const(2, "f"), n))
    elseif op == "abs" then r = S.where(S.lt(a, const(0)), S.neg(D(a)), D(a))
    elseif op == "min" then r = S.where(S.le(a, b), D(a), D(b))
    elseif op == "max" then r = S.where(S.ge(a, b), D(a), D(b))
    elseif op == "where" then r = S.where(a, D(b), D(n.args[3]))
    elseif op == "mod" then
      if depends(b) then error("score_mod: the derivative of x % y with respect to y is not supported", 0) end
      r = D(a)
    else
      r = ZERO_F   -- comparisons, logic, loads at integer indices: piecewise constant
    end
    if r.t ~= "f" then
      local c = cval(r)
      r = c and const(c, "f") or r
    end
    memo[n] = r
    return r
  end
  return D(root)
end
M.deriv = deriv
return M
