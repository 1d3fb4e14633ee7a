--[[
attnlab.fp8 — FP8 quantisation and scaling recipes scripted in Lua (TransformerEngine's vocabulary).

  local q8 = al.fp8.quantize(x, {format = "e4m3", scale = 16})   -- data (fp8 tensor), scale, scale_inv, format
  local y  = q8:dequantize()                                        -- f32 (or :dequantize("bf16"))
  al.fp8.amax(x)                                                    -- max |x| (NaN if any NaN)
  local r = al.fp8.DelayedScaling{margin = 0, fp8_format = "HYBRID", amax_history_len = 16}
  local out, ctx = al.attention.forward{qkv_layer = qkv, qkv_format = "bshd", fp8_recipe = r}
  al.fp8.autocast(r, function() ... al.attention.forward{...} ... end)
  r:state()   -- every slot's amax history and scale

Slots (TE's roles): forward qkv (Q, K, V, one scale shared by all three), s (softmax output P, the
input of P.V), o; backward do, dp (the score gradient feeding dQ, dK), dqkv (dq, dk, dv).
Per slot the recipe says how its scale is found (slot.mode):
  delayed  scale from the slot's amax history before the step (compute_algo over the history), then
           the step's amax is appended: S and dP amaxes come from the kernel, so they are one step late
  current  from this tensor's amax (QKV: the packed buffer's, in Lua; O, dO, dQKV: computed by the C
           kernel, as TE's Float8CurrentScaling)
  token    current scaling per token (one scale per (b, s) position over heads and head dim; QKV and O):
           the causal-safe option (prefix-invariant: a token's scale depends only on that token)
  mx       MXFP8 32-element blocks with E8M0 scales, along d (V along s unless v_block_dim = "d")
  lua      a Recipe's own scale function, applied in Lua (current timing for O, dO, dQKV)
S and dP are produced inside the kernel: they are always delayed (TE does the same).
combine_and_quantize: given qkv_layer (or kv_layer), the packed buffer is quantised in one pass with
the one QKV scale and q/k/v are select views of the FP8 buffer (bit-identical to quantising each view).
]]
local bit = require "bit"
local lffi = require "attnlab.ffi"
local T = require "attnlab.tensor"
local ffi, C = lffi.ffi, lffi.C

local M = {}

local E4M3, E5M2 = 4, 5
local FORMAT = { e4m3 = E4M3, e5m2 = E5M2, fp8_e4m3 = E4M3, fp8_e5m2 = E5M2, E4M3 = E4M3, E5M2 = E5M2 }
local FMT_NAME = { [E4M3] = "e4m3", [E5M2] = "e5m2" }
local SLOTS = { "qkv", "s", "o", "do", "dp", "dqkv" }
local FORWARD = { qkv = true, s = true, o = true }
M.SLOTS = SLOTS

local function fmt_code(fname, f)
  if f == nil then return E4M3 end
  if type(f) == "number" and FMT_NAME[f] then return f end
  local c = FORMAT[f]
  if not c then error(fname .. ": format: expected 'e4m3' or 'e5m2', got " .. tostring(f), 3) end
  return c
end

function M.fp8_max(format) return tonumber(C.al_fp8_max(fmt_code("fp8_max", format))) end

---------------------------------------------------------------------------------------------------
-- quantised tensors
---------------------------------------------------------------------------------------------------
local F8 = {}
-- an FP8 tensor whose scale is still on the device (attention's fp8_output under delayed scaling on the
-- device) reads it on first use of .scale / .scale_inv: one wait, only when a script asks
F8.__index = function(self, k)
  local at = rawget(self, "_scale_at")
  if at and (k == "scale" or k == "scale_inv") then
    local sc = at[1]:narrow(1, at[2], 1):item()
    rawset(self, "scale", sc)
    rawset(self, "scale_inv", 1 / sc)
    rawset(self, "_scale_at", nil)
    return rawget(self, k)
  end
  return F8[k]
end
function F8:dequantize(dtype)
  local out = T.new()
  T.check(C.al_fp8_dequantize(out.raw, self.data.raw, self.scale_inv, T.parse_dtype(dtype or "f32", "dequantize")),
    "fp8.dequantize")
  return out
end
function F8:size(...) return self.data:size(...) end
-- an FP8 tensor object around codes that carry scale (attention's fp8_output)
-- (scale may be {tensor, i}: element i of a device tensor, read when first asked for)
function M.wrap(data, scale, format)
  local f = FMT_NAME[fmt_code("fp8.wrap", format)]
  if type(scale) == "table" then return setmetatable({ data = data, format = f, _scale_at = scale }, F8) end
  return setmetatable({ data = data, scale = scale, scale_inv = 1 / scale, format = f }, F8)
end
function F8:__tostring()
  return string.format("al.fp8 tensor (%s, scale %.6g, shape [%s])", self.format, self.scale,
    table.concat(self.data:size(), ","))
end

local function check_x(fname, x)
  if not T.is_tensor(x) then error(fname .. ": x: expected a tensor, got " .. type(x), 3) end
end

function M.amax(x)
  check_x("fp8.amax", x)
  local r = ffi.new("double[1]")
  T.check(C.al_amax(x.raw, r), "fp8.amax")
  return r[0]
end

-- amax_tensor(x) -> a f64 [1] tensor on x's device holding amax(x); on a GPU nothing waits for it
function M.amax_tensor(x)
  check_x("fp8.amax_tensor", x)
  local out = T.new()
  T.check(C.al_amax_tensor(out.raw, x.raw), "fp8.amax_tensor")
  return out
end

-- quantize(x, {format=, scale=}) ; scale defaults to current scaling fp8_max / amax / 2^margin.
function M.quantize(x, opts)
  check_x("fp8.quantize", x)
  opts = opts or {}
  local f = fmt_code("fp8.quantize", opts.format)
  local scale = opts.scale
  if scale == nil then
    local a = M.amax(x)
    scale = (a > 0 and a < math.huge) and tonumber(C.al_fp8_max(f)) / a / 2 ^ (opts.margin or 0) or 1
  end
  if type(scale) ~= "number" or not (scale > 0) or scale == math.huge then
    error("fp8.quantize: scale: expected a finite number > 0, got " .. tostring(scale), 2)
  end
  local out = T.new()
  T.check(C.al_fp8_quantize(out.raw, x.raw, f, scale), "fp8.quantize")
  return setmetatable({ data = out, scale = scale, scale_inv = 1 / scale, format = FMT_NAME[f] }, F8)
end

-- quantize_amax(x, {format=, scale=}) -> the FP8 tensor of quantize(x, ...) and amax_tensor(x), in one pass
-- over x (on a GPU only queued: the amax stays on the device). scale is required: the amax measured here
-- cannot have chosen it (delayed scaling: it only joins the history).
function M.quantize_amax(x, opts)
  check_x("fp8.quantize_amax", x)
  opts = opts or {}
  local f = fmt_code("fp8.quantize_amax", opts.format)
  local scale = opts.scale
  if type(scale) ~= "number" or not (scale > 0) or scale == math.huge then
    error("fp8.quantize_amax: scale: expected a finite number > 0, got " .. tostring(scale), 2)
  end
  local out, am = T.new(), T.new()
  T.check(C.al_fp8_quantize_amax(out.raw, am.raw, x.raw, f, scale), "fp8.quantize_amax")
  return setmetatable({ data = out, scale = scale, scale_inv = 1 / scale, format = FMT_NAME[f] }, F8), am
end

-- Per-row current scaling: rows are the leading dims, row_dims trailing dims form one row.
local R8 = {}
R8.__index = R8
function R8:dequantize(dtype)
  local d = T.new()
  T.check(C.al_fp8_dequantize(d.raw, self.data.raw, 1, 0), "fp8.dequantize")
  local s = self.scale_inv
  for _ = 1, self.row_dims do s = s:unsqueeze(-1) end
  local r = d * s:expand_as(d)
  return dtype and r:to(dtype) or r
end
function M.quantize_rows(x, opts)
  check_x("fp8.quantize_rows", x)
  opts = opts or {}
  local f = fmt_code("fp8.quantize_rows", opts.format)
  local rd = opts.row_dims or 1
  local out, si = T.new(), T.new()
  T.check(C.al_fp8_quantize_rows(out.raw, si.raw, x.raw, f, rd, opts.margin or 0), "fp8.quantize_rows")
  return setmetatable({ data = out, scale_inv = si, row_dims = rd, format = FMT_NAME[f] }, R8)
end

-- MXFP8: 32-element blocks along dim (Lua dim: 1-based, negative from the end; default -1).
local MX = {}
MX.__index = MX
function MX:dequantize(dtype)
  local out = T.new()
  T.check(C.al_mxfp8_dequantize(out.raw, self.data.raw, self.scales.raw, self.cdim, T.parse_dtype(dtype or "f32", "dequantize")),
    "fp8.mxfp8_dequantize")
  return out
end
function M.mxfp8_quantize(x, opts)
  check_x("fp8.mxfp8_quantize", x)
  opts = opts or {}
  local f = fmt_code("fp8.mxfp8_quantize", opts.format)
  local cdim = T.dim0(x, opts.dim or -1, "fp8.mxfp8_quantize")
  local out, sc = T.new(), T.new()
  T.check(C.al_mxfp8_quantize(out.raw, sc.raw, x.raw, f, cdim), "fp8.mxfp8_quantize")
  return setmetatable({ data = out, scales = sc, cdim = cdim, dim = cdim + 1, format = FMT_NAME[f] }, MX)
end

---------------------------------------------------------------------------------------------------
-- recipes
---------------------------------------------------------------------------------------------------
local Recipe = {}
Recipe.__index = Recipe
M.RecipeClass = Recipe

local function algo_fn(fname, a)
  if a == nil or a == "max" then
    return function(h) local m = 0 for i = 1, #h do if h[i] ~= h[i] then return h[i] end if h[i] > m then m = h[i] end end return m end
  elseif a == "most_recent" then
    return function(h) return h[#h] or 0 end
  elseif type(a) == "function" then
    return a
  end
  error(fname .. ": amax_compute_algo: expected 'max', 'most_recent' or a function(history), got " .. tostring(a), 3)
end

local function formats(fname, ff)
  ff = ff or "HYBRID"
  if ff == "HYBRID" then return E4M3, E5M2 end
  if ff == "E4M3" then return E4M3, E4M3 end
  if ff == "E5M2" then return E5M2, E5M2 end
  error(fname .. ": fp8_format: expected 'HYBRID', 'E4M3' or 'E5M2', got " .. tostring(ff), 3)
end

-- cfg.modes[slot] = mode; cfg.history_len[slot]; cfg.algo[slot]
local function new_recipe(kind, fname, cfg, modes, hist, algos)
  local fwd, bwd = formats(fname, cfg.fp8_format)
  local margin = cfg.margin or 0
  if type(margin) ~= "number" then error(fname .. ": margin: expected a number, got " .. tostring(margin), 3) end
  local r = setmetatable({ kind = kind, fp8_format = cfg.fp8_format or "HYBRID", margin = margin,
    fwd_format = fwd, bwd_format = bwd, slots = {}, steps = 0, config = cfg }, Recipe)
  for _, s in ipairs(SLOTS) do
    local n = hist[s]
    if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
      error(fname .. ": amax_history_len: expected an integer >= 1, got " .. tostring(n), 3)
    end
    r.slots[s] = { name = s, mode = modes[s], history_len = n, algo = algos[s], amax_history = {}, scale = 1.0,
      format = FMT_NAME[FORWARD[s] and fwd or bwd] }
  end
  return r
end

function Recipe:fmax(slot) return tonumber(C.al_fp8_max(FORMAT[self.slots[slot].format])) end

-- Amaxes a fused GPU forward left pending (al_attn_fp8.amax_deferred: cuDNN's amaxes are copied back
-- behind the graph, without a stream sync) are recorded when the recipe is next used: any method here,
-- the next step's prepare, r:state(). So the call returns at once and the GPU is never left idle while
-- the host waits; under delayed scaling those amaxes only feed the next step's scales anyway.
function Recipe:settle()
  local p = rawget(self, "_pending")
  if not p then return end
  self._pending = nil
  for i = 1, #p do p[i]() end
end

-- Queue fn (a deferred record) to run at the next settle, after those queued before it.
function Recipe:defer(fn)
  local p = rawget(self, "_pending")
  if not p then p = {}; self._pending = p end
  p[#p + 1] = fn
end

-- Delayed scaling kept on the device (al_fp8_ds, src/fp8_delayed.c). A DelayedScaling recipe with a built-in
-- amax_compute_algo moves its state (histories, scales) to the data's device at its first call there: the
-- quantise kernels and cuDNN's graph read the scales on the device and add their amaxes to accumulators, and
-- an update kernel after each call folds them into the histories, so no step waits for the GPU (TE's way).
-- The Lua tables below mirror it: r:state() reads it back (one wait); anything that changes the state on
-- the host (reset, a call through the host path) first takes it back and drops the device copy, which the
-- next device call seeds again. device_scaling = false keeps everything on the host.
local DS_ALGO = { max = 0, most_recent = 1 }
local DS_MASK_FWD, DS_MASK_BWD = 0x07, 0x38

-- The state of device state ds into recipe r's Lua tables, for the slots in mask; whole = true replaces the
-- histories (ds is the recipe's state), else each slot's latest amax is recorded on the host (ds was dropped
-- while a call that uses it was under way).
local function absorb(r, ds, mask, whole)
  local H = ds.history_len
  local hist, scale, used = ffi.new("double[?]", 6 * H), ffi.new("double[6]"), ffi.new("double[6]")
  T.check(C.al_fp8_ds_read(ds, hist, scale, used), "fp8 recipe (device state)")
  local c0 = rawget(r, "_ds_count0") or {}
  for i, s in ipairs(SLOTS) do
    if bit.band(mask, bit.lshift(1, i - 1)) ~= 0 then
      local st = r.slots[s]
      local c = tonumber(ds.count[i - 1])
      local n = math.min(c, H)
      if whole then
        local h = {}
        for j = 0, n - 1 do h[j + 1] = hist[(i - 1) * H + j] end
        st.amax_history = h
        st.scale = scale[i - 1]
        if c > (c0[i] or 0) then st.last_amax, st.last_scale = h[n], used[i - 1] end
      elseif n > 0 then
        st.last_scale = used[i - 1]
        r:record(s, hist[(i - 1) * H + n - 1])
      end
    end
  end
  if whole then
    local c = {}
    for i = 1, 6 do c[i] = tonumber(ds.count[i - 1]) end
    r._ds_count0 = c
  end
end

-- the al_fp8_ds for tensor x's device (created from the Lua state), or nil when the recipe keeps its state
-- on the host
function Recipe:_ds_for(x)
  local algo = rawget(self, "ds_algo")
  if not algo then return nil end
  local dev = x:device()
  local ds = rawget(self, "_ds")
  if ds and self._ds_device == dev then return ds end
  self:_pull(true)
  local H = self.slots.qkv.history_len
  local hist, count = ffi.new("double[?]", 6 * H), ffi.new("int64_t[6]")
  local scale, fmax = ffi.new("double[6]"), ffi.new("double[6]")
  for i, s in ipairs(SLOTS) do
    local st = self.slots[s]
    local h = st.amax_history
    count[i - 1] = #h
    for j = 1, #h do hist[(i - 1) * H + j - 1] = h[j] end
    scale[i - 1], fmax[i - 1] = st.scale, self:fmax(s)
  end
  ds = ffi.gc(ffi.new("al_fp8_ds"), C.al_fp8_ds_release)
  local dt, di = T.parse_device(dev, "fp8 recipe")
  T.check(C.al_fp8_ds_init(ds, dt, di, H, algo, 2 ^ self.margin, fmax, hist, count, scale), "fp8.DelayedScaling (device state)")
  local c0 = {}
  for i = 1, 6 do c0[i] = #self.slots[SLOTS[i]].amax_history end
  self._ds, self._ds_device, self._ds_count0 = ds, dev, c0
  return ds
end

-- Read the device state back into the Lua tables (waits for the device); drop = true also drops the device
-- copy (the Lua state becomes the one that counts).
function Recipe:_pull(drop)
  local ds = rawget(self, "_ds")
  if not ds then return end
  if drop then self._ds = nil end
  absorb(self, ds, 0x3F, true)
end

-- The scale a slot uses for its next quantisation (delayed slots), or from a current amax.
function Recipe:compute_scale(slot, amax)
  self:settle()
  self:_pull(true)
  local st = self.slots[slot]
  if self.scale_fn then
    local r = self.scale_fn(slot, amax ~= nil and { amax } or st.amax_history, self:fmax(slot), st)
    if type(r) ~= "number" or not (r > 0) or r == math.huge then
      error("fp8.Recipe: scale function returned " .. tostring(r) .. " for slot " .. slot .. " (expected a finite number > 0)", 0)
    end
    return r
  end
  local a = amax
  if a == nil then a = st.algo(st.amax_history) end
  if a ~= a or not (a > 0) or a == math.huge then return amax ~= nil and 1.0 or st.scale end  -- nothing to measure
  return self:fmax(slot) / a / 2 ^ self.margin
end

-- Append a step's amax to a slot's history (rolling) and update its delayed scale (TE: after the step).
function Recipe:record(slot, amax)
  self:settle()
  self:_pull(true)
  local st = self.slots[slot]
  local h = st.amax_history
  h[#h + 1] = amax
  while #h > st.history_len do table.remove(h, 1) end
  st.last_amax = amax
  if st.mode == "delayed" then st.scale = self:compute_scale(slot) end
end

function Recipe:state()
  self:settle()
  self:_pull(false)
  local t = {}
  for _, s in ipairs(SLOTS) do
    local st = self.slots[s]
    local h = {}
    for i, v in ipairs(st.amax_history) do h[i] = v end
    t[s] = { mode = st.mode, format = st.format, amax_history = h, scale = st.scale, scale_inv = 1 / st.scale,
      last_amax = st.last_amax, last_scale = st.last_scale }
  end
  t.steps = self.steps
  return t
end

function Recipe:reset()
  self:settle()
  self._ds = nil
  for _, s in ipairs(SLOTS) do self.slots[s].amax_history = {}; self.slots[s].scale = 1.0 end
  self.steps = 0
end

-- A deep copy (same settings and state): lets two runs start from one state (prefix tests, A/B).
function Recipe:clone()
  self:settle()
  self:_pull(false)
  local c = setmetatable({}, Recipe)
  for k, v in pairs(self) do c[k] = v end
  c._ds, c._ds_device, c._ds_count0 = nil, nil, nil   -- (the clone seeds its own device state when used there)
  c.slots = {}
  for s, st in pairs(self.slots) do
    local n = {}
    for k, v in pairs(st) do n[k] = v end
    n.amax_history = {}
    for i, v in ipairs(st.amax_history) do n.amax_history[i] = v end
    c.slots[s] = n
  end
  return c
end

function Recipe:__tostring()
  local parts = {}
  for _, s in ipairs(SLOTS) do parts[#parts + 1] = s .. "=" .. self.slots[s].mode end
  return string.format("al.fp8.%s(%s, margin=%g; %s)", self.kind, self.fp8_format, self.margin, table.concat(parts, " "))
end

local function all(v) local t = {} for _, s in ipairs(SLOTS) do t[s] = v end return t end

function M.DelayedScaling(cfg)
  cfg = cfg or {}
  local fname = "fp8.DelayedScaling"
  local algo = algo_fn(fname, cfg.amax_compute_algo)
  local dsc = cfg.device_scaling
  if dsc ~= nil and type(dsc) ~= "boolean" then error(fname .. ": device_scaling: expected a boolean, got " .. type(dsc), 2) end
  local r = new_recipe("DelayedScaling", fname, cfg, all("delayed"), all(cfg.amax_history_len or 1024), all(algo))
  -- the state on the device (Recipe:_ds_for) unless device_scaling = false or the algo is a Lua function
  if dsc ~= false then r.ds_algo = DS_ALGO[cfg.amax_compute_algo or "max"] end
  r.device_scaling = r.ds_algo ~= nil
  return r
end

-- Float8CurrentScaling: QKV, O, dO, dQKV current; S and dP delayed (history len 1, most_recent: TE's
-- NVTE_DPA_FP8DS_* defaults). granularity = "token" (or causal_safe = true): QKV and O per token.
function M.CurrentScaling(cfg)
  cfg = cfg or {}
  local fname = "fp8.CurrentScaling"
  local g = cfg.granularity or (cfg.causal_safe and "token" or "tensor")
  if g ~= "tensor" and g ~= "token" then error(fname .. ": granularity: expected 'tensor' or 'token', got " .. tostring(g), 2) end
  local cur = g == "token" and "token" or "current"
  local modes = { qkv = cur, s = "delayed", o = cur, ["do"] = "current", dp = "delayed", dqkv = "current" }
  local hl = cfg.ds_amax_history_len or 1
  local r = new_recipe("CurrentScaling", fname, cfg, modes, all(hl),
    all(algo_fn(fname, cfg.ds_amax_compute_algo or "most_recent")))
  r.granularity = g
  return r
end

-- MXFP8BlockScaling (E4M3 by default): QKV, O, dO, dQKV in 32-blocks along d with E8M0 scales
-- (V along s, as TE's columnwise V for P.V, unless v_block_dim = "d"); S and dP delayed.
function M.MXFP8BlockScaling(cfg)
  cfg = cfg or {}
  local fname = "fp8.MXFP8BlockScaling"
  cfg.fp8_format = cfg.fp8_format or "E4M3"
  local vb = cfg.v_block_dim or "s"
  if vb ~= "s" and vb ~= "d" then error(fname .. ": v_block_dim: expected 's' or 'd', got " .. tostring(vb), 2) end
  local modes = { qkv = "mx", s = "delayed", o = "mx", ["do"] = "mx", dp = "delayed", dqkv = "mx" }
  local r = new_recipe("MXFP8BlockScaling", fname, cfg, modes, all(cfg.ds_amax_history_len or 1),
    all(algo_fn(fname, cfg.ds_amax_compute_algo or "most_recent")))
  r.v_block_dim = vb
  return r
end

-- A recipe written in Lua: scale(slot, amaxes, fp8_max, slot_state) -> scale, where amaxes is the slot's
-- history (delayed) or {amax of the tensor now} (current). timing = {qkv = "current", o = "current",
-- default = "delayed"}; S and dP must be delayed.
function M.Recipe(cfg)
  local fname = "fp8.Recipe"
  if type(cfg) ~= "table" then error(fname .. ": expected a table of settings, got " .. type(cfg), 2) end
  if cfg.scale ~= nil and type(cfg.scale) ~= "function" then
    error(fname .. ": scale: expected a function(slot, amaxes, fp8_max, state), got " .. type(cfg.scale), 2)
  end
  local timing = cfg.timing or {}
  local modes = {}
  for _, s in ipairs(SLOTS) do
    local t = timing[s] or timing.default or "delayed"
    if t ~= "delayed" and t ~= "current" then error(fname .. ": timing." .. s .. ": expected 'delayed' or 'current', got " .. tostring(t), 2) end
    if t == "current" and (s == "s" or s == "dp") then
      error(fname .. ": timing." .. s .. ": S and dP are produced inside the kernel, so they can only be 'delayed'", 2)
    end
    modes[s] = t == "delayed" and "delayed" or (s == "qkv" and "current" or "lua")
  end
  local r = new_recipe("Recipe", fname, cfg, modes, all(cfg.amax_history_len or 16), all(algo_fn(fname, cfg.amax_compute_algo)))
  r.scale_fn = cfg.scale
  r.name = cfg.name
  return r
end

function M.is_recipe(x) return getmetatable(x) == Recipe end

---------------------------------------------------------------------------------------------------
-- autocast
---------------------------------------------------------------------------------------------------
local active = nil
function M.autocast(r, fn)
  if r ~= nil and not M.is_recipe(r) then error("fp8.autocast: expected a recipe (al.fp8.DelayedScaling{...}, ...), got " .. tostring(r), 2) end
  if type(fn) ~= "function" then error("fp8.autocast: expected a function as the second argument, got " .. type(fn), 2) end
  local prev = active
  active = r
  local res = { n = 0 }
  local function pack(...) res = { n = select("#", ...), ... } end
  pack(pcall(fn))
  active = prev
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end
function M.active_recipe() return active end

---------------------------------------------------------------------------------------------------
-- the attention hooks (attention.lua calls these when a recipe applies)
---------------------------------------------------------------------------------------------------
local function fake_mx(x, dim, fmt)
  local q = M.mxfp8_quantize(x, { format = FMT_NAME[fmt], dim = dim })
  return q:dequantize("f32")
end

-- Quantise the inputs for the QKV slot and fill the al_attn_fp8 struct. info: {mode=, qkv_layer=,
-- kv_layer=, dim=, fmt_name=, combine=}; q, k, v the (unpacked) views. dry: do not record.
-- Returns q8, k8, v8, f (cdata), keep (refs to keep alive), post (data for finish_forward).
function M.prepare_forward(al, r, info, q, k, v, dry)
  r:settle()
  if dry then r:_pull(false) end   -- (explain shows the scales as they stand on the device)
  -- (the finaliser releases a deferred-amax record nobody settled)
  local f = ffi.gc(ffi.new("al_attn_fp8"), C.al_attn_fp8_settle)
  C.al_attn_fp8_init(f)
  f.amax_deferred = 1
  f.fwd_format, f.bwd_format = r.fwd_format, r.bwd_format
  f.margin = r.margin
  local in_dtype = q:dtype()
  f.out_dtype = T.parse_dtype(in_dtype)
  if info.fp8_output then
    -- TE's fp8_output: O comes back as its FP8 codes with O's one per-tensor scale (no dequantisation pass)
    local mo = r.slots.o.mode
    if mo ~= "delayed" and mo ~= "current" then
      error("attention.forward: fp8_output: needs the recipe's O slot scaled per tensor in the call (delayed or current), " ..
        "got mode '" .. tostring(mo) .. "'", 0)
    end
    f.out_dtype = r.fwd_format
  end
  local keep = {}
  local sq = r.slots.qkv
  local fmt = r.fwd_format
  local q8, k8, v8
  local amax
  local combine = info.combine ~= false
  local dim = info.dim or -3
  if sq.mode == "mx" then
    -- MXFP8: Q, K along d; V along s (the token dim) unless v_block_dim = "d"; read as f32 by the kernel
    local tokdim = info.fmt_name == "sbhd" and 1 or (info.fmt_name == "bshd" and 2 or 1)
    q8, k8 = fake_mx(q, -1, fmt), fake_mx(k, -1, fmt)
    v8 = fake_mx(v, r.v_block_dim == "d" and -1 or tokdim, fmt)
    amax = math.max(M.amax(q), M.amax(k), M.amax(v))
    sq.last_scale = nil
  elseif sq.mode == "token" then
    -- one scale per token: packed qkv rows are (3, h, d) (q, k, v of a token share it); kv rows (2, h, d)
    local function rows(x, nd) return M.quantize_rows(x, { format = FMT_NAME[fmt], row_dims = nd, margin = r.margin }) end
    if info.mode == "qkv" then
      local p = rows(info.qkv_layer, 3)
      q8, k8, v8 = p.data:select(dim, 1), p.data:select(dim, 2), p.data:select(dim, 3)
      f.q_descale, f.k_descale, f.v_descale = p.scale_inv.raw, p.scale_inv.raw, p.scale_inv.raw
      keep[#keep + 1] = p
    else
      local pq = rows(q, 2)
      q8 = pq.data
      f.q_descale = pq.scale_inv.raw
      keep[#keep + 1] = pq
      if info.mode == "kv" then
        local p = rows(info.kv_layer, 3)
        k8, v8 = p.data:select(dim, 1), p.data:select(dim, 2)
        f.k_descale, f.v_descale = p.scale_inv.raw, p.scale_inv.raw
        keep[#keep + 1] = p
      else
        local pk, pv = rows(k, 2), rows(v, 2)
        k8, v8 = pk.data, pv.data
        f.k_descale, f.v_descale = pk.scale_inv.raw, pv.scale_inv.raw
        keep[#keep + 1] = pk
        keep[#keep + 1] = pv
      end
    end
    amax = math.max(M.amax(q), M.amax(k), M.amax(v))
    sq.last_scale = 0
  else
    -- one scale for Q, K and V (TE: DS/CS quantise q, k, v as one tensor)
    local packed = info.mode == "qkv" and info.qkv_layer or nil
    local srcs
    if packed and combine then srcs = { packed }
    elseif info.mode == "kv" and combine then srcs = { q, info.kv_layer }
    else srcs = { q, k, v } end
    -- the max over srcs of get(x), in order (math.max's NaN handling, as math.max(a, b, c))
    local function max_of(get)
      local m = get(srcs[1])
      for i = 2, #srcs do m = math.max(m, get(srcs[i])) end
      return m
    end
    -- delayed scaling on the device (Recipe:_ds_for): the scale is read and the amax accumulated there
    local ds = not dry and r:_ds_for(q) or nil
    -- delayed on a GPU: this amax only joins the history, so it stays on the device until the recipe settles
    -- (no sync), and each source is quantised and measured in one pass (quantize_amax)
    local on_device = not ds and sq.mode == "delayed" and not dry and q:device() ~= "cpu"
    local t = {}
    if ds then
      amax = nil
    elseif on_device then
      amax = function() return max_of(function(x) return t[x]:item() end) end
    else
      amax = max_of(M.amax)
    end
    local scale
    if ds then scale = 1   -- (read on the device)
    elseif sq.mode == "delayed" then scale = sq.scale
    else scale = r:compute_scale("qkv", amax) end
    local function quant(x)
      if ds then
        local o = T.new()
        T.check(C.al_fp8_ds_quantize(o.raw, x.raw, fmt, ds, 0), "attention.forward (fp8 qkv)")
        return o
      end
      if on_device then
        local q8x
        q8x, t[x] = M.quantize_amax(x, { format = FMT_NAME[fmt], scale = scale })
        return q8x.data
      end
      return M.quantize(x, { format = FMT_NAME[fmt], scale = scale }).data
    end
    if packed and combine then
      local p8 = quant(packed)   -- combine_and_quantize: one pass over the caller's buffer
      q8, k8, v8 = p8:select(dim, 1), p8:select(dim, 2), p8:select(dim, 3)
    elseif info.mode == "kv" and combine then
      local p8 = quant(info.kv_layer)
      q8, k8, v8 = quant(q), p8:select(dim, 1), p8:select(dim, 2)
    else
      q8, k8, v8 = quant(q), quant(k), quant(v)
    end
    f.qkv_scale_inv = 1 / scale
    f.scale[0] = scale
    if ds then
      -- every scale from ds (the 1s below only say "given"); the scales used are recorded in `used`
      local used = al.empty({ 6 }, { dtype = "f64", device = q:device() })
      f.ds, f.ds_used = ds, used.raw
      keep[#keep + 1] = used
      keep[#keep + 1] = ds   -- (the call's state even if the recipe drops it before the backward)
      for i = 0, 5 do f.scale[i] = 1 end
      return q8, k8, v8, f, keep, { in_dtype = in_dtype, ds = ds, used = used }
    end
    sq.last_scale = scale
  end
  -- S (always delayed), O
  f.scale[1] = r.slots.s.scale
  local mo = r.slots.o.mode
  if mo == "delayed" then f.scale[2] = r.slots.o.scale
  elseif mo == "current" then f.scale[2] = 0
  elseif mo == "token" then f.scale[2] = 0; f.o_per_token = 1
  else f.scale[2] = -1; f.out_dtype = 0 end   -- lua / mx: quantised in finish_forward from f32
  -- backward slots as they stand now (prepare_backward sets them again before the backward runs)
  for i, s in pairs({ [3] = "do", [4] = "dp", [5] = "dqkv" }) do
    local m = r.slots[s].mode
    f.scale[i] = m == "delayed" and r.slots[s].scale or (m == "current" and 0 or -1)
  end
  if type(amax) == "function" then
    r:defer(function() r:record("qkv", amax()) end)
  elseif not dry then r:record("qkv", amax) end
  return q8, k8, v8, f, keep, { in_dtype = in_dtype }
end

-- the call's amaxes into the histories of ds (device state) for the slots in mask; when the recipe dropped ds
-- meanwhile (reset, a host-path call), they are recorded on the host instead
local function ds_finish(r, ds, mask)
  T.check(C.al_fp8_ds_update(ds, mask), "fp8 recipe (device state update)")
  if rawget(r, "_ds") ~= ds then absorb(r, ds, mask, false) end
end

-- After the C forward: record S and O, apply Lua-side O quantisation. Returns the output (4-d).
function M.finish_forward(al, r, f, out, post, info)
  r:settle()
  if post.ds then
    ds_finish(r, post.ds, DS_MASK_FWD)
    r.steps = r.steps + 1
    return out
  end
  r.slots.s.last_scale = f.scale_used[1]
  local mo = r.slots.o.mode
  if f.pending ~= nil then   -- S and O amaxes still on their way (only when O's scale was given)
    r.slots.o.last_scale = f.scale_used[2]
    r:defer(function()
      C.al_attn_fp8_settle(f)
      r:record("s", f.amax[1])
      r:record("o", f.amax[2])
    end)
    r.steps = r.steps + 1
    return out
  end
  r:record("s", f.amax[1])
  if mo == "lua" or mo == "mx" then
    local a = M.amax(out)
    if mo == "mx" then out = fake_mx(out, -1, r.fwd_format):to(post.in_dtype)
    else
      local sc = r:compute_scale("o", a)
      r.slots.o.last_scale = sc
      out = M.quantize(out, { format = r.slots.o.format, scale = sc }):dequantize(post.in_dtype)
    end
    r:record("o", a)
  else
    r.slots.o.last_scale = f.scale_used[2]
    r:record("o", f.amax[2])
  end
  r.steps = r.steps + 1
  return out
end

-- Before the C backward: scales of dO, dP, dQKV; Lua-side dO quantisation. Returns dout to pass.
function M.prepare_backward(al, r, f, dout)
  r:settle()
  if f.ds ~= nil then return dout, false end   -- (dO, dP, dQKV scales read from f.ds on the device)
  f.scale[4] = r.slots.dp.scale
  local function cslot(i, s)
    local m = r.slots[s].mode
    if m == "delayed" then f.scale[i] = r.slots[s].scale
    elseif m == "current" then f.scale[i] = 0
    else f.scale[i] = -1 end
  end
  cslot(3, "do")
  cslot(5, "dqkv")
  local m = r.slots["do"].mode
  if m == "lua" or m == "mx" then
    local a = M.amax(dout)
    local d
    if m == "mx" then d = fake_mx(dout, -1, r.bwd_format)
    else
      local sc = r:compute_scale("do", a)
      r.slots["do"].last_scale = sc
      d = M.quantize(dout, { format = r.slots["do"].format, scale = sc }):dequantize("f32")
    end
    r:record("do", a)
    return d:to(dout:dtype()), true
  end
  return dout, false
end

-- After the C backward: record, apply Lua-side dQKV quantisation to the gradient tensors in place.
function M.finish_backward(al, r, f, grads_list, do_done, post)
  r:settle()
  if f.ds ~= nil then
    ds_finish(r, post.ds, DS_MASK_BWD)
    return
  end
  if f.pending ~= nil then   -- dO, dP and dQKV amaxes still on their way (every backward scale was given)
    r.slots["do"].last_scale = f.scale_used[3]
    r.slots.dp.last_scale = f.scale_used[4]
    r.slots.dqkv.last_scale = f.scale_used[5]
    r:defer(function()
      C.al_attn_fp8_settle(f)
      r:record("do", f.amax[3])
      r:record("dp", f.amax[4])
      r:record("dqkv", f.amax[5])
    end)
    return
  end
  if not do_done then
    r.slots["do"].last_scale = f.scale_used[3]
    r:record("do", f.amax[3])
  end
  r.slots.dp.last_scale = f.scale_used[4]
  r:record("dp", f.amax[4])
  local m = r.slots.dqkv.mode
  if m == "lua" or m == "mx" then
    local a = 0
    for _, g in ipairs(grads_list) do local x = M.amax(g) if x ~= x or x > a then a = x end end
    local sc = m == "lua" and r:compute_scale("dqkv", a) or nil
    for _, g in ipairs(grads_list) do
      local y
      if m == "mx" then y = fake_mx(g, -1, r.bwd_format)
      else y = M.quantize(g, { format = r.slots.dqkv.format, scale = sc }):dequantize("f32") end
      g:copy_(y)
    end
    r.slots.dqkv.last_scale = sc
    r:record("dqkv", a)
  else
    r.slots.dqkv.last_scale = f.scale_used[5]
    r:record("dqkv", f.amax[5])
  end
end

function M.install(al)
  al.fp8 = al.fp8 or {}
  for k, v in pairs(M) do
    if k ~= "install" then al.fp8[k] = v end
  end
end

return M
