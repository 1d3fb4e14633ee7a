--[[
attnlab.optim — plain SGD (with momentum, Nesterov, weight decay) and Adam/AdamW written in Lua over
the (params, grads) lists that every module's :parameters() returns. Updates are in place (the
parameter tensors keep their identity), on whatever device the tensors live on.

  local params, grads = model:parameters()
  local opt = al.optim.Adam(params, grads, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0})
  for step = 1, n do
    model:zero_grad()                 -- or opt:zero_grad()
    ... forward, backward ...
    opt:step()
  end
  local opt = al.optim.SGD(params, grads, {lr = 0.1, momentum = 0.9, nesterov = false, weight_decay = 0})

Adam follows PyTorch's torch.optim.Adam (bias-corrected moments; weight_decay adds wd * p to the
gradient; AdamW = decoupled decay p <- p - lr * wd * p). SGD follows torch.optim.SGD (dampening 0).
]]
local T = require "attnlab.tensor"

local M = {}

local function check_lists(fname, params, grads)
  if type(params) ~= "table" or type(grads) ~= "table" then
    error(fname .. ": expected (params, grads) lists as returned by :parameters(), got " .. type(params) .. " and " ..
      type(grads), 3)
  end
  if #params ~= #grads then
    error(string.format("%s: %d params but %d grads", fname, #params, #grads), 3)
  end
  for i = 1, #params do
    if not T.is_tensor(params[i]) or not T.is_tensor(grads[i]) then
      error(fname .. ": params[" .. i .. "] and grads[" .. i .. "] must be tensors", 3)
    end
    if params[i]:numel() ~= grads[i]:numel() then
      error(string.format("%s: params[%d] has %d elements but its grad %d", fname, i, params[i]:numel(), grads[i]:numel()), 3)
    end
  end
end

local function number_opt(fname, name, v, dflt, lo)
  if v == nil then return dflt end
  if type(v) ~= "number" or v < (lo or 0) then
    error(string.format("%s: %s: expected a number >= %g, got %s", fname, name, lo or 0, tostring(v)), 4)
  end
  return v
end

function M.install(al)
  al.optim = al.optim or {}

  -------------------------------------------------------------------------------------------------
  local SGD = {}
  SGD.__index = SGD
  local function sgd_new(_, params, grads, cfg)
    local fname = "optim.SGD"
    check_lists(fname, params, grads)
    cfg = cfg or {}
    local self = setmetatable({ params = params, grads = grads,
      lr = number_opt(fname, "lr", cfg.lr, 1e-2), momentum = number_opt(fname, "momentum", cfg.momentum, 0),
      weight_decay = number_opt(fname, "weight_decay", cfg.weight_decay, 0), nesterov = cfg.nesterov or false,
      buf = {}, t = 0 }, SGD)
    if self.nesterov and self.momentum == 0 then error(fname .. ": nesterov needs momentum > 0", 2) end
    return self
  end
  function SGD:step()
    self.t = self.t + 1
    for i, p in ipairs(self.params) do
      local g = self.grads[i]
      if self.weight_decay ~= 0 then g = g + p * self.weight_decay end
      if self.momentum ~= 0 then
        local b = self.buf[i]
        if b == nil then b = g:clone(); self.buf[i] = b
        else b:copy_(b * self.momentum + g) end
        if self.nesterov then g = g + b * self.momentum else g = b end
      end
      p:copy_(p - g * self.lr)
    end
  end
  function SGD:zero_grad() for _, g in ipairs(self.grads) do g:zero_() end end
  al.optim.SGD = setmetatable({ methods = SGD }, { __call = sgd_new })

  -------------------------------------------------------------------------------------------------
  local Adam = {}
  Adam.__index = Adam
  local function adam_new(decoupled)
    return function(_, params, grads, cfg)
      local fname = decoupled and "optim.AdamW" or "optim.Adam"
      check_lists(fname, params, grads)
      cfg = cfg or {}
      local betas = cfg.betas or { 0.9, 0.999 }
      if type(betas) ~= "table" or type(betas[1]) ~= "number" or type(betas[2]) ~= "number" or betas[1] < 0 or
         betas[1] >= 1 or betas[2] < 0 or betas[2] >= 1 then
        error(fname .. ": betas: expected {beta1, beta2} in [0, 1), got " .. tostring(betas), 2)
      end
      local self = setmetatable({ params = params, grads = grads, lr = number_opt(fname, "lr", cfg.lr, 1e-3),
        betas = { betas[1], betas[2] }, eps = number_opt(fname, "eps", cfg.eps, 1e-8),
        weight_decay = number_opt(fname, "weight_decay", cfg.weight_decay, decoupled and 1e-2 or 0),
        decoupled = decoupled, m = {}, v = {}, t = 0 }, Adam)
      for i, p in ipairs(params) do
        self.m[i] = al.zeros_like(p)
        self.v[i] = al.zeros_like(p)
      end
      return self
    end
  end
  function Adam:step()
    self.t = self.t + 1
    local b1, b2 = self.betas[1], self.betas[2]
    local bc1, bc2 = 1 - b1 ^ self.t, 1 - b2 ^ self.t
    local step = self.lr / bc1
    for i, p in ipairs(self.params) do
      local g = self.grads[i]
      if self.weight_decay ~= 0 then
        if self.decoupled then p:copy_(p * (1 - self.lr * self.weight_decay))
        else g = g + p * self.weight_decay end
      end
      local m, v = self.m[i], self.v[i]
      m:copy_(m * b1 + g * (1 - b1))
      v:copy_(v * b2 + g * g * (1 - b2))
      local denom = (v / bc2):sqrt() + self.eps
      p:copy_(p - m / denom * step)
    end
  end
  Adam.zero_grad = SGD.zero_grad
  al.optim.Adam = setmetatable({ methods = Adam }, { __call = adam_new(false) })
  al.optim.AdamW = setmetatable({ methods = Adam }, { __call = adam_new(true) })
end

return M
