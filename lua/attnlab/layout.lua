--[[
attnlab.layout — packed QKV/KV inputs and TransformerEngine's layout vocabulary (src/layout.c).

  -- declarative (TE's qkv_layer / kv_layer with qkv_interleave_dim): zero-copy views, no detection
  local q, k, v, layout = al.attention.unpack_qkv{qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd"}
  --> layout == "bs3hd"; q, k, v are qkv:select(3, 1..3)
  local q, k, v, layout = al.attention.unpack_qkv{query_layer = q, kv_layer = kv, qkv_interleave_dim = -2,
                                                  qkv_format = "thd"}          --> "thd_th2d"
  -- separate tensors pass through unchanged with layout nil (TE returns None: detect later)

  -- legacy (TE's get_qkv_layout): from storages, shapes, strides, offsets; a packed result warns
  local layout = al.attention.detect_layout(q, k, v, "bshd")     --> "bs3hd" + DeprecationWarning once

  al.layouts.names                     -- the 25 layout strings in NVTE_QKV_Layout order
  al.layouts.parse("bshd_bs2hd")       -- 7 (the C enum code); al.layouts.name(7) -> "bshd_bs2hd"
  al.layouts.qkv_format(l), q_format(l), kv_format(l), group(l), is_paged(l), is_packed(l),
  al.layouts.packing(l) (3, 2 or 1), interleave_dim(l) (-3, -2 or nil), paged(l), split_format(fmt)
  al.layouts.detect(q, k, v, qkv_format, inference_params, level)  -- for other modules: level 1 =
                                       -- the caller of detect is where a deprecation warning points

Argument names are TransformerEngine's, verbatim. qkv_format defaults to "sbhd" (DPA's default) and
qkv_interleave_dim to -3. inference_params: any non-nil value means a KV cache (packed inputs are then
an error, as in TE); for detect, inference_params.is_paged gives the paged_kv_ layout.
]]
local lffi = require "attnlab.ffi"
local T = require "attnlab.tensor"
local ffi, C = lffi.ffi, lffi.C

local M = {}

---------------------------------------------------------------------------------------------------
-- vocabulary
---------------------------------------------------------------------------------------------------
local NAMES, CODE = {}, {}
for i = 0, C.AL_QKV_LAYOUT_COUNT - 1 do
  local n = ffi.string(C.al_qkv_layout_name(i))
  NAMES[i + 1] = n
  CODE[n] = i
end
local FORMATS, FORMAT_CODE = {}, {}
for i = 0, C.AL_QKV_FORMAT_COUNT - 1 do
  local n = ffi.string(C.al_qkv_format_name(i))
  FORMATS[i + 1] = n
  FORMAT_CODE[n] = i
end
local GROUPS = {}
for i = 0, C.AL_QKV_GROUP_COUNT - 1 do GROUPS[i + 1] = ffi.string(C.al_qkv_group_name(i)) end

M.names, M.formats, M.groups = NAMES, FORMATS, GROUPS

-- A layout given as a name (any case) or a C code -> C code; errors name the caller.
local function code_of(l, fname)
  if type(l) == "number" and NAMES[l + 1] then return l end
  if type(l) == "string" then
    local c = CODE[l] or CODE[l:lower()]
    if c then return c end
  end
  error(fname .. ": layout: expected one of TransformerEngine's 25 layout strings (" ..
    table.concat(NAMES, " ") .. ") or a code 0-24, got " .. tostring(l), 3)
end

local function format_code(f, fname, argname)
  local c = FORMAT_CODE[f]
  if c == nil and type(f) == "string" then c = FORMAT_CODE[f:lower()] end
  if c == nil then
    error(fname .. ": " .. (argname or "qkv_format") .. ": expected one of " .. table.concat(FORMATS, ", ") ..
      ", got " .. (type(f) == "string" and ("'" .. f .. "'") or tostring(f)), 3)
  end
  return c
end

function M.parse(name)
  local c = code_of(name, "layouts.parse")
  return c -- not a tail call: code_of's error level counts this frame
end
function M.name(l) return NAMES[code_of(l, "layouts.name") + 1] end
function M.qkv_format(l) return FORMATS[C.al_qkv_layout_format(code_of(l, "layouts.qkv_format")) + 1] end
function M.q_format(l) return FORMATS[C.al_qkv_layout_q_format(code_of(l, "layouts.q_format")) + 1] end
function M.kv_format(l) return FORMATS[C.al_qkv_layout_kv_format(code_of(l, "layouts.kv_format")) + 1] end
function M.group(l) return GROUPS[C.al_qkv_layout_group(code_of(l, "layouts.group")) + 1] end
function M.is_paged(l) return C.al_qkv_layout_is_paged(code_of(l, "layouts.is_paged")) ~= 0 end
function M.is_packed(l) return C.al_qkv_layout_is_packed(code_of(l, "layouts.is_packed")) ~= 0 end
function M.packing(l) return tonumber(C.al_qkv_layout_packing(code_of(l, "layouts.packing"))) end
function M.interleave_dim(l)
  local d = C.al_qkv_layout_interleave_dim(code_of(l, "layouts.interleave_dim"))
  if d == 0 then return nil end
  return tonumber(d)
end

local int_out = ffi.new("int32_t[2]")

function M.paged(l)
  T.check(C.al_qkv_layout_paged(code_of(l, "layouts.paged"), int_out), "layouts.paged")
  return NAMES[int_out[0] + 1]
end

-- "sbhd_2bshd" -> "sbhd", "bshd"; "bshd" -> "bshd", "bshd".
function M.split_format(fmt)
  local c = format_code(fmt, "layouts.split_format")
  C.al_qkv_format_split(c, int_out, int_out + 1)
  return FORMATS[int_out[0] + 1], FORMATS[int_out[1] + 1]
end

function M.detect_calls() return tonumber(C.al_layout_detect_calls()) end

---------------------------------------------------------------------------------------------------
-- the declarative path
---------------------------------------------------------------------------------------------------
local is_tensor = T.is_tensor
local new, check = T.new, T.check

-- Preallocated: one FFI call per unpack, no table besides the three result handles.
local args = ffi.new("al_qkv_unpack_args")
local layout_out = ffi.new("int32_t[1]")
local scratch_q = ffi.new("al_tensor")

local KNOWN = { qkv_layer = true, kv_layer = true, query_layer = true, key_layer = true, value_layer = true,
  qkv_interleave_dim = true, qkv_format = true, inference_params = true }

-- The unknown-name scan uses pairs(), which LuaJIT 2.1 cannot compile: it would drag the whole
-- declared path into the interpreter (2-4 us instead of ~1 us). So each argument table is scanned
-- once and remembered (weak keys); a table reused call after call costs one lookup.
local scanned = setmetatable({}, { __mode = "k" })
local function scan_names(t)
  for k in pairs(t) do
    if not KNOWN[k] then
      error("unpack_qkv: unknown argument '" .. tostring(k) .. "' (expected qkv_layer, kv_layer, query_layer, " ..
        "key_layer, value_layer, qkv_interleave_dim, qkv_format, inference_params)", 4)
    end
  end
  scanned[t] = true
end

local function tensor_or_nil(k, x)
  if x ~= nil and not is_tensor(x) then
    error("unpack_qkv: " .. k .. ": expected a tensor or nil, got " .. type(x), 4)
  end
end

local function bad_arg(t)
  if not scanned[t] then scan_names(t) end
  -- written out rather than looped: an inner loop would end the trace of the caller's loop
  tensor_or_nil("qkv_layer", t.qkv_layer)
  tensor_or_nil("kv_layer", t.kv_layer)
  tensor_or_nil("query_layer", t.query_layer)
  tensor_or_nil("key_layer", t.key_layer)
  tensor_or_nil("value_layer", t.value_layer)
  local d = t.qkv_interleave_dim
  if d ~= nil and (type(d) ~= "number" or d ~= math.floor(d)) then
    error("unpack_qkv: qkv_interleave_dim must be -3 (e.g. bs3hd) or -2 (e.g. bsh3d), got " .. tostring(d), 3)
  end
end

local function unpack_qkv(t)
  if type(t) ~= "table" then
    error("unpack_qkv: expected a table of named arguments {qkv_layer=..., ...}, got " .. type(t), 2)
  end
  local qkv, kv, ql, kl, vl = t.qkv_layer, t.kv_layer, t.query_layer, t.key_layer, t.value_layer
  bad_arg(t)
  if qkv == nil and kv == nil then
    -- TE: nothing packed -> q, k, v all required, returned as given, layout left to detection.
    local missing = (ql == nil and "query_layer") or (kl == nil and "key_layer") or (vl == nil and "value_layer")
    if missing then
      error("unpack_qkv: query_layer, key_layer and value_layer are required unless packed inputs (qkv_layer " ..
        "or kv_layer) are provided; " .. missing .. " is missing", 2)
    end
    return ql, kl, vl, nil
  end
  local fmt = t.qkv_format
  local fc = fmt == nil and 0 or FORMAT_CODE[fmt] or format_code(fmt, "unpack_qkv")
  args.qkv_layer = qkv and qkv.raw or nil
  args.kv_layer = kv and kv.raw or nil
  args.query_layer = ql and ql.raw or nil
  args.key_layer = kl and kl.raw or nil
  args.value_layer = vl and vl.raw or nil
  args.qkv_interleave_dim = t.qkv_interleave_dim or -3
  args.qkv_format = fc
  args.has_kv_cache = t.inference_params ~= nil and 1 or 0
  local k, v = new(), new()
  if qkv then
    local q = new()
    local st = C.al_qkv_unpack(args, q.raw, k.raw, v.raw, layout_out)
    if st ~= 0 then check(st, "unpack_qkv") end
    return q, k, v, NAMES[layout_out[0] + 1]
  end
  -- kv_layer: q is query_layer itself (as in TE); C's alias of it goes to a scratch descriptor.
  local st = C.al_qkv_unpack(args, scratch_q, k.raw, v.raw, layout_out)
  if st ~= 0 then check(st, "unpack_qkv") end
  C.al_tensor_release(scratch_q)
  return ql, k, v, NAMES[layout_out[0] + 1]
end

---------------------------------------------------------------------------------------------------
-- the legacy path
---------------------------------------------------------------------------------------------------
local det_layout = ffi.new("int32_t[1]")
local det_packed = ffi.new("int32_t[1]")
local DET_ARGS = { "query_layer", "key_layer", "value_layer" }

local function deprecation_message(name)
  local code = CODE[name]
  local dim = tonumber(C.al_qkv_layout_interleave_dim(code))
  if C.al_qkv_layout_packing(code) == 3 then
    return ("Relying on pointer-based detection of packed q/k/v layouts (detected '%s') is deprecated: pass " ..
      "the packed buffer explicitly via qkv_layer (with qkv_interleave_dim=%d) instead of query_layer, key_layer " ..
      "and value_layer views of it"):format(name, dim)
  end
  return ("Relying on pointer-based detection of packed q/k/v layouts (detected '%s') is deprecated: pass " ..
    "the packed buffer explicitly via kv_layer (with qkv_interleave_dim=%d) together with query_layer, instead " ..
    "of key_layer and value_layer views of it"):format(name, dim)
end
M.deprecation_message = deprecation_message

-- level: 1 = the function calling detect (the place a deprecation warning names), 2 = its caller...
local function detect(q, k, v, qkv_format, inference_params, level, fname)
  fname = fname or "detect_layout"
  if not (is_tensor(q) and is_tensor(k) and is_tensor(v)) then -- (no table, no loop on the attention hot path)
    local x = { q, k, v }
    for i = 1, 3 do
      if not is_tensor(x[i]) then
        error(fname .. ": " .. DET_ARGS[i] .. ": expected a tensor, got " .. type(x[i]), (level or 1) + 1)
      end
    end
  end
  local fc = qkv_format == nil and 0 or FORMAT_CODE[qkv_format] or format_code(qkv_format, fname)
  local st = C.al_qkv_detect(q.raw, k.raw, v.raw, fc, det_layout, det_packed)
  if st ~= 0 then
    local msg = T.last_error()
    if fname ~= "detect_layout" then msg = msg:gsub("^detect_layout:", fname .. ":") end
    error(msg, (level or 1) + 1)
  end
  local code, packed = det_layout[0], det_packed[0] ~= 0
  local name = NAMES[code + 1]
  if packed then
    M.al.warnings.warn("DeprecationWarning", deprecation_message(name), (level or 1) + 1)
  end
  if inference_params ~= nil and type(inference_params) == "table" and inference_params.is_paged then
    if C.al_qkv_layout_paged(code, int_out) ~= 0 then error(fname .. ": " .. T.last_error(), (level or 1) + 1) end
    name = NAMES[int_out[0] + 1]
  end
  return name, packed
end
M.detect = detect

local function detect_layout(q, k, v, qkv_format, inference_params)
  local name = detect(q, k, v, qkv_format, inference_params, 2)
  return name -- not a tail call: the warning's level counts this frame
end

function M.install(al)
  M.al = al
  if not al.warnings then al.warnings = require("attnlab.warnings") end
  al.layouts = M
  al.layout = M
  al.attention = al.attention or {}
  al.attention.unpack_qkv = unpack_qkv
  al.attention.detect_layout = detect_layout
end

return M
