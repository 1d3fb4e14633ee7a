--[[
attnlab.attention — the functional DotProductAttention front end (al.attention.forward / backward /
explain), TransformerEngine's argument names verbatim (te_dpa_semantics.md §2-3).

  local out, ctx = al.attention.forward{qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd",
                                         attn_mask_type = "causal"}
  local grads = al.attention.backward(ctx, dout)      -- grads.qkv_layer: one packed gradient
  print(al.attention.explain{...})                     -- each backend's verdict and reason

Inputs: qkv_layer (with qkv_interleave_dim), or query_layer + kv_layer, or query_layer, key_layer,
value_layer (the legacy path: al.attention.detect_layout labels them and warns when they are views of
one packed buffer). Packed inputs are unpacked by al.attention.unpack_qkv (layout.lua) into zero-copy
select views; every tensor is read by C through its real strides.
The output is flattened like TE's: [b,s,h*d_v] (bshd), [s,b,h*d_v] (sbhd), [t,h*d_v] (thd); with
return_max_logit, forward returns out, max_logit, ctx.
Gradients come back keyed like the input: qkv_layer -> one packed gradient of qkv_layer's shape whose
select views received dq/dk/dv in place; query_layer + kv_layer; or the three separate tensors; plus
core_attention_bias (pre/post-scale bias) and softmax_offset (learnable softmax) where they apply.
Dropout draws (seed, offset) from the default generator (al.manual_seed) unless dropout_seed /
dropout_offset are given; the backward reuses the forward's mask exactly.
Variants (docs/VARIANTS.md): score_mod / mask_mod / block_mask are traced by attnlab.variants; CPU
tensors run its Lua oracle, CUDA tensors the C backends with an al_attn_variant (flash serves it);
the backward adds grads.captures (gradients of al.attention.param captures).
]]
local lffi = require "attnlab.ffi"
local T = require "attnlab.tensor"
local ffi, C = lffi.ffi, lffi.C

local M = {}
-- Upvalues rather than global and field lookups on the hot path: each looked-up name is a constant of
-- the trace, and a trace of more than 500 constant slots is not compiled (see build below).
local type, tonumber = type, tonumber
local istype, ffi_copy = ffi.istype, ffi.copy
local tensor_ct = ffi.typeof("al_lua_tensor")
local after_alloc = T.after_alloc
local LOADED = package.loaded
local al_attn_params_init, al_attn_forward, al_tensor_view = C.al_attn_params_init, C.al_attn_forward, C.al_tensor_view

local FORMATS = { sbhd = 0, bshd = 1, thd = 2 }
local MASKS = { no_mask = 0, padding = 1, causal = 2, padding_causal = 3, causal_bottom_right = 4,
  padding_causal_bottom_right = 5, arbitrary = 6 }
local MASK_ALIASES = { ["padding,causal"] = "padding_causal", ["causal,padding"] = "padding_causal",
  causal_padding = "padding_causal", ["padding,causal_bottom_right"] = "padding_causal_bottom_right",
  ["causal_bottom_right,padding"] = "padding_causal_bottom_right" }
local CAUSAL = { causal = true, padding_causal = true, causal_bottom_right = true, padding_causal_bottom_right = true }
local BIASES = { no_bias = 0, pre_scale_bias = 1, post_scale_bias = 2, alibi = 3 }
local SOFTMAX = { vanilla = 0, ["off-by-one"] = 1, off_by_one = 1, learnable = 2 }
M.FORMATS, M.MASKS, M.BIASES, M.SOFTMAX = FORMATS, MASKS, BIASES, SOFTMAX

local function keys(t)
  local k = {}
  for n in pairs(t) do k[#k + 1] = n end
  table.sort(k)
  return table.concat(k, ", ")
end

local function enum(fname, argname, tbl, v, aliases)
  if aliases and aliases[v] then v = aliases[v] end
  local c = tbl[v]
  if c == nil then error(string.format("%s: %s: expected one of %s, got %s", fname, argname, keys(tbl), tostring(v)), 3) end
  return c, v
end

local function warn(al, category, msg)
  if al.warnings and al.warnings.warn then al.warnings.warn(category, msg, 4)
  else io.stderr:write("attnlab: " .. category .. ": " .. msg .. "\n") end
end

-- (as T.is_tensor: false for non-cdata too). Not a tail call: a trace started in a function that
-- tail-calls a builtin or a C function aborts ("leaving loop in root trace") and the function ends up
-- blacklisted, which then aborts every trace through it; the same holds for T.new.
local function is_tensor(x)
  local r = istype(tensor_ct, x)
  return r
end

local function check_tensor_arg(fname, name, x)
  if x ~= nil and not is_tensor(x) then error(fname .. ": " .. name .. ": expected a tensor, got " .. type(x), 3) end
end

-- One argument table for unpack_qkv, refilled per call and emptied after it: a fresh table per call would
-- be rescanned for unknown names (pairs(), not compiled) every time (bench/host_overhead.lua).
local UARGS = {}
local detect_layout = require("attnlab.layout").detect

-- The select views of a packed qkv_layer, remembered per buffer handle (weak keys) with a byte copy of
-- the handle's descriptor and the arguments that shaped them: a buffer passed again unchanged (same
-- descriptor, qkv_interleave_dim, qkv_format; no other input tensor, no KV cache) reuses its views
-- instead of three new handles and a C call; any change re-unpacks (and re-validates) through C.
local VIEWS = setmetatable({}, { __mode = "k" })
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")
-- Resolved here, once: a C symbol first looked up while LuaJIT records a trace aborts that recording
-- ("symbol not in cache"), and the first call that reaches memcmp (a packed buffer passed a second
-- time) may well be inside the hot loop's first recording.
local memcmp = C.memcmp
local TENSOR_BYTES = ffi.sizeof("al_tensor")

local function cached_views(args, fmt)
  local qkv = args.qkv_layer
  if qkv == nil or args.kv_layer ~= nil or args.query_layer ~= nil or args.key_layer ~= nil or
    args.value_layer ~= nil or args.inference_params ~= nil or not is_tensor(qkv) then return nil end
  local e = VIEWS[qkv]
  if e ~= nil and e.dim == (args.qkv_interleave_dim or -3) and e.fmt == fmt and
    memcmp(e.snap, qkv.raw, TENSOR_BYTES) == 0 then
    return e
  end
  return nil
end

local function remember_views(args, fmt, q, k, v, layout)
  local qkv = args.qkv_layer
  if qkv == nil or args.kv_layer ~= nil or args.query_layer ~= nil or args.key_layer ~= nil or
    args.value_layer ~= nil or args.inference_params ~= nil then return end
  local e = VIEWS[qkv]
  if e == nil then
    e = { snap = ffi.new("al_tensor") }
    VIEWS[qkv] = e
  end
  ffi.copy(e.snap, qkv.raw, TENSOR_BYTES) -- bytes only: the snapshot owns no storage reference
  e.dim, e.fmt, e.q, e.k, e.v, e.layout = args.qkv_interleave_dim or -3, fmt, q, k, v, layout
end
M._views_cache = VIEWS -- for tests

-- level: frames from unpack_inputs up to the user's call (for the deprecation warning's location)
local function unpack_inputs(al, fname, args, fmt, level)
  if args.qkv_layer ~= nil or args.kv_layer ~= nil then
    local e = cached_views(args, fmt)
    if e ~= nil then return e.q, e.k, e.v, e.layout, "qkv" end
    check_tensor_arg(fname, "qkv_layer", args.qkv_layer)
    check_tensor_arg(fname, "kv_layer", args.kv_layer)
    local u = UARGS
    u.qkv_layer, u.kv_layer, u.query_layer = args.qkv_layer, args.kv_layer, args.query_layer
    u.key_layer, u.value_layer = args.key_layer, args.value_layer
    u.qkv_interleave_dim, u.qkv_format = args.qkv_interleave_dim or -3, fmt
    u.inference_params = args.inference_params
    local q, k, v, layout = al.attention.unpack_qkv(u) -- (after an error the next call refills u)
    u.qkv_layer, u.kv_layer, u.query_layer, u.key_layer, u.value_layer, u.inference_params = nil, nil, nil, nil, nil, nil
    remember_views(args, fmt, q, k, v, layout)
    return q, k, v, layout, args.qkv_layer and "qkv" or "kv"
  end
  local q, k, v = args.query_layer, args.key_layer, args.value_layer
  if not (is_tensor(q) and is_tensor(k) and is_tensor(v)) then
    if q == nil or k == nil or v == nil then
      error(fname .. ": query_layer, key_layer and value_layer are required unless packed inputs (qkv_layer or " ..
        "kv_layer) are provided", 3)
    end
    check_tensor_arg(fname, "query_layer", q)
    check_tensor_arg(fname, "key_layer", k)
    check_tensor_arg(fname, "value_layer", v)
  end
  local layout = detect_layout(q, k, v, fmt, args.inference_params, level or 1)
  return q, k, v, layout, "separate"
end

---------------------------------------------------------------------------------------------------
-- argument -> C params / inputs
---------------------------------------------------------------------------------------------------
-- TE's check_set_window_size, with its warnings; returns the (left, right) C receives.
local function window(al, fname, mask_name, ws)
  local wl, wr
  if ws == nil then wl, wr = -1, -1
  elseif type(ws) == "table" and #ws == 2 and type(ws[1]) == "number" and type(ws[2]) == "number" then wl, wr = ws[1], ws[2]
  else error(fname .. ": window_size: expected {left, right} (numbers, -1 = unbounded), got " .. tostring(ws), 3) end
  if CAUSAL[mask_name] then
    if ws == nil or (wl == -1 and wr == -1) then wl, wr = -1, 0
    elseif wl >= 0 and wr ~= 0 then
      warn(al, "UserWarning", "window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=" .. mask_name ..
        "; using (" .. wl .. ", 0)")
      wr = 0
    end
  else
    if wl == -1 and wr == 0 then
      warn(al, "UserWarning", "window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=" .. mask_name ..
        "; using (-1, -1)")
      wr = -1
    end
  end
  return wl, wr
end

local BACKEND_LEN = 16
local NO_DEFAULTS = setmetatable({}, { __newindex = function() error("attention: NO_DEFAULTS is read-only", 2) end })

-- The hot path (build, forward, flatten) is written for LuaJIT's trace compiler, so that one cached call
-- compiles into one short trace whatever the caller's loop looks like (bench/host_path_instr.sh counts
-- it): no helper called several times per call with different arguments (its own trace's side exits
-- end in "loop unroll limit reached" and fall back to the interpreter), no inner loops, no closures,
-- few constants (a trace of more than 500 aborts as "trace too long"), and the rare cases (errors,
-- optional tensors, window sizes, dropout) in functions of their own that a plain call never enters.
-- A setting is the call's argument, else the module's default (`defaults`), else the built-in default.
local function set_opt(fname, inp, refs, field, name, x)
  if x == nil then return end
  check_tensor_arg(fname, name, x)
  refs[field] = x
  inp[field] = x.raw
end

-- the optional tensor inputs (cu_seqlens, masks, bias, ALiBi slopes, softmax offset), when any is given
-- (level: build's level 3, the caller of M.forward)
local function optional_inputs(fname, args, inp, refs, offset)
  set_opt(fname, inp, refs, "cu_seqlens_q", "cu_seqlens_q", args.cu_seqlens_q)
  set_opt(fname, inp, refs, "cu_seqlens_kv", "cu_seqlens_kv", args.cu_seqlens_kv)
  set_opt(fname, inp, refs, "cu_seqlens_q_padded", "cu_seqlens_q_padded", args.cu_seqlens_q_padded)
  set_opt(fname, inp, refs, "cu_seqlens_kv_padded", "cu_seqlens_kv_padded", args.cu_seqlens_kv_padded)
  local am = args.attention_mask
  if type(am) == "table" then
    if #am ~= 2 then error(fname .. ": attention_mask: expected a tensor or {q_mask, kv_mask}", 4) end
    set_opt(fname, inp, refs, "attention_mask", "attention_mask[1]", am[1])
    set_opt(fname, inp, refs, "attention_mask_kv", "attention_mask[2]", am[2])
  else
    set_opt(fname, inp, refs, "attention_mask", "attention_mask", am)
  end
  set_opt(fname, inp, refs, "bias", "core_attention_bias", args.core_attention_bias)
  set_opt(fname, inp, refs, "alibi_slopes", "alibi_slopes", args.alibi_slopes)
  set_opt(fname, inp, refs, "softmax_offset", "softmax_offset", offset)
end

-- head counts and head dims against the module's configuration, from the descriptors (methods:size()
-- gets blacklisted by the JIT when called with and without a dim, and every trace through it then
-- aborts); released or odd-ranked tensors take the method path. Errors at level 4 (M.forward's caller).
local function check_heads(fname, q, k, v, nh, ng, kvc)
  local qr, kr, vr = q.raw, k.raw, v.raw
  local nd = qr.ndim
  local fast = nd >= 2 and kr.ndim == nd and vr.ndim == nd and qr.storage ~= nil and kr.storage ~= nil and
    vr.storage ~= nil
  local h, hg
  if fast then h, hg = tonumber(qr.size[nd - 2]), tonumber(kr.size[nd - 2])
  else nd = q:dim(); h, hg = q:size(nd - 1), k:size(nd - 1) end
  if nh ~= nil and h ~= nh then
    error(string.format("%s: query_layer has %d heads, expected num_attention_heads = %d", fname, h, nh), 4)
  end
  if ng ~= nil and hg ~= ng then
    error(string.format("%s: Keys and values must have num_gqa_group = %d heads, got %d", fname, ng, hg), 4)
  end
  if kvc ~= nil then
    local dqk, dv = kvc, kvc
    if type(kvc) == "table" then dqk, dv = kvc[1], kvc[2] end
    local gq, gk, gv
    if fast then gq, gk, gv = tonumber(qr.size[nd - 1]), tonumber(kr.size[nd - 1]), tonumber(vr.size[nd - 1])
    else gq, gk, gv = q:size(-1), k:size(-1), v:size(-1) end
    if gq ~= dqk or gk ~= dqk then
      error(string.format("%s: query/key head dim must equal kv_channels d_qk = %d, got %d and %d", fname, dqk, gq, gk), 4)
    end
    if gv ~= dv then
      error(string.format("%s: value head dim must equal kv_channels d_v = %d, got %d", fname, dv, gv), 4)
    end
  end
  return h
end

-- dropout stream: (seed, offset) from the default generator, counters reserved for b*h*sq*skv
local function dropout_stream(fname, args, p, inp, refs, fmt_name, q, k, h, msq, mskv)
  local seed, off = args.dropout_seed, args.dropout_offset
  if seed == nil or off == nil then
    local s, o = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")
    C.al_rng_get_state(s, o)
    seed = seed or s[0]
    if off == nil then
      local st = C.al_attn_check(p, inp)
      if st ~= 0 then
        local msg = T.last_error()
        if msg:sub(1, #fname + 1) ~= fname .. ":" then msg = fname .. ": " .. msg end
        error(msg, 3)
      end
      -- b*h*sq*skv elements, 4 per Philox counter (the plan filled nothing back into p: compute here)
      local b, sq, skv
      if fmt_name == "thd" then
        b = refs.cu_seqlens_q:size(1) - 1
        sq = msq or q:size(1)
        skv = mskv or k:size(1)
      else
        local bd = fmt_name == "sbhd" and 2 or 1
        b, sq, skv = q:size(bd), q:size(3 - bd), k:size(3 - bd)
      end
      off = C.al_rng_reserve(math.ceil(b * h * sq * skv / 4))
    end
  end
  p.dropout_seed, p.dropout_offset = seed, off
end

local params_ct, inputs_ct = ffi.typeof("al_attn_params"), ffi.typeof("al_attn_inputs")

local function build(al, fname, args, defaults, level)
  if type(args) ~= "table" then error(fname .. ": expected a table of named arguments, got " .. type(args), 3) end
  defaults = defaults or NO_DEFAULTS
  local fmt_name = args.qkv_format
  if fmt_name == nil then fmt_name = defaults.qkv_format; if fmt_name == nil then fmt_name = "sbhd" end end
  local fmt = FORMATS[fmt_name]
  if fmt == nil then fmt = enum(fname, "qkv_format", FORMATS, fmt_name) end
  local q, k, v, layout, mode = unpack_inputs(al, fname, args, fmt_name, (level or 3) + 2)
  local mask_name = args.attn_mask_type
  if mask_name == nil then mask_name = defaults.attn_mask_type; if mask_name == nil then mask_name = "causal" end end
  local mask_code = MASKS[mask_name]
  if mask_code == nil then mask_code, mask_name = enum(fname, "attn_mask_type", MASKS, mask_name, MASK_ALIASES) end
  local bias_name = args.core_attention_bias_type
  if bias_name == nil then bias_name = defaults.core_attention_bias_type; if bias_name == nil then bias_name = "no_bias" end end
  local bias_code = BIASES[bias_name]
  if bias_code == nil then bias_code = enum(fname, "core_attention_bias_type", BIASES, bias_name) end
  local sm_name = args.softmax_type
  if sm_name == nil then sm_name = defaults.softmax_type; if sm_name == nil then sm_name = "vanilla" end end
  local sm_code = SOFTMAX[sm_name]
  if sm_code == nil then sm_code = enum(fname, "softmax_type", SOFTMAX, sm_name) end

  local p = params_ct()
  al_attn_params_init(p)
  p.qkv_format = fmt
  p.mask_type = mask_code
  p.bias_type = bias_code
  p.softmax_type = sm_code
  local ws = args.window_size
  if ws == nil then ws = defaults.window_size end
  if ws == nil then
    p.window_left, p.window_right = -1, CAUSAL[mask_name] and 0 or -1
  else
    local wl, wr = window(al, fname, mask_name, ws)
    p.window_left, p.window_right = wl, wr
  end
  local brd = args.bottom_right_diagonal
  if brd == nil then brd = defaults.bottom_right_diagonal end
  if brd ~= nil then p.bottom_right_diagonal = brd and 1 or 0 end
  local scale = args.softmax_scale
  if scale == nil then scale = defaults.softmax_scale end
  if scale ~= nil then
    if type(scale) ~= "number" or scale == 0 then error(fname .. ": softmax_scale: expected a non-zero number, got " .. tostring(scale), 3) end
    p.softmax_scale = scale
  end
  local dropout = args.attention_dropout
  if dropout == nil then dropout = defaults.attention_dropout; if dropout == nil then dropout = 0 end end
  if type(dropout) ~= "number" or dropout < 0 or dropout >= 1 then
    error(fname .. ": attention_dropout: expected a number in [0, 1), got " .. tostring(dropout), 3)
  end
  p.dropout_p = dropout
  local rml = args.return_max_logit
  if rml == nil then rml = defaults.return_max_logit end
  p.return_max_logit = rml and 1 or 0
  local det = args.deterministic
  if det == nil then det = defaults.deterministic end
  p.deterministic = det and 1 or 0
  local cd = args.compute_dtype
  if cd == nil then cd = defaults.compute_dtype end
  if cd == nil or cd == "f32" then p.compute_dtype = 0
  elseif cd == "f64" then p.compute_dtype = 1
  else error(fname .. ": compute_dtype: expected 'f32' or 'f64', got " .. tostring(cd), 3) end
  local be = args.backend
  if be == nil then be = defaults.backend end
  if be ~= nil then
    if type(be) ~= "string" or #be >= BACKEND_LEN then error(fname .. ": backend: expected 'cpu', 'unfused', 'flash' or 'fused', got " .. tostring(be), 3) end
    ffi_copy(p.backend, be)
  end
  local msq, mskv
  if fmt == 2 then -- thd
    msq, mskv = args.max_seqlen_q, args.max_seqlen_kv
    if msq == nil then msq = defaults.max_seqlen_q end
    if mskv == nil then mskv = defaults.max_seqlen_kv end
    if msq ~= nil then p.sq = msq end
    if mskv ~= nil then p.skv = mskv end
  end

  local nh = args.num_attention_heads
  if nh == nil then nh = defaults.num_attention_heads end
  local ng = args.num_gqa_groups
  if ng == nil then ng = defaults.num_gqa_groups end
  local kvc = args.kv_channels
  if kvc == nil then kvc = defaults.kv_channels end
  local h = check_heads(fname, q, k, v, nh, ng, kvc)

  local refs = { q = q, k = k, v = v }
  local inp = inputs_ct()
  inp.q, inp.k, inp.v = q.raw, k.raw, v.raw
  local so = args.softmax_offset
  if so == nil then so = defaults.softmax_offset end
  if so ~= nil or args.cu_seqlens_q ~= nil or args.cu_seqlens_kv ~= nil or args.cu_seqlens_q_padded ~= nil or
    args.cu_seqlens_kv_padded ~= nil or args.attention_mask ~= nil or args.core_attention_bias ~= nil or
    args.alibi_slopes ~= nil then
    optional_inputs(fname, args, inp, refs, so)
  end
  if dropout > 0 then dropout_stream(fname, args, p, inp, refs, fmt_name, q, k, h, msq, mskv) end
  return p, inp, refs, layout, mode, fmt_name
end

---------------------------------------------------------------------------------------------------
-- forward / backward / explain
---------------------------------------------------------------------------------------------------
local flat_size = ffi.new("int64_t[8]")
-- out [..., h, d_v] -> [..., h*d_v]: one C call, no size table (out is the backends' contiguous result)
-- (the ranks of the three formats written out: a loop would be an inner loop in the caller's trace)
local function flatten(out)
  local r = out.raw
  local n = r.ndim
  local sz = r.size
  if n == 4 then
    flat_size[0], flat_size[1], flat_size[2] = sz[0], sz[1], sz[2] * sz[3]
  elseif n == 3 then
    flat_size[0], flat_size[1] = sz[0], sz[2] * sz[1]
  else
    for i = 0, n - 3 do flat_size[i] = sz[i] end
    flat_size[n - 2] = sz[n - 2] * sz[n - 1]
  end
  local f = tensor_ct()
  local st = al_tensor_view(f.raw, r, n - 1, flat_size)
  if st ~= 0 then T.check(st, "attention.forward") end
  return f
end

-- FP8: the recipe that applies (fp8_recipe argument, the module's, or al.fp8.autocast's; false = none);
-- quantises the QKV slot (combine_and_quantize for packed inputs) and points inp at the FP8 views.
local function apply_fp8(al, fname, args, defaults, inp, refs, mode, fmt_name, dry)
  local r = args.fp8_recipe
  if r == nil and defaults then r = defaults.fp8_recipe end
  local fp8 = LOADED["attnlab.fp8"]
  if r == nil and fp8 then r = fp8.active_recipe() end
  if not r then
    if args.fp8_output or (args.fp8_output == nil and defaults and defaults.fp8_output) then
      error(fname .. ": fp8_output: FP8 output needs an FP8 recipe (fp8_recipe=, the module's, or al.fp8.autocast)", 4)
    end
    return nil
  end
  fp8 = fp8 or require "attnlab.fp8"
  if not fp8.is_recipe(r) then error(fname .. ": fp8_recipe: expected an al.fp8 recipe, got " .. tostring(r), 4) end
  local fp8_output = args.fp8_output
  if fp8_output == nil and defaults then fp8_output = defaults.fp8_output end
  if fp8_output ~= nil and type(fp8_output) ~= "boolean" then
    error(fname .. ": fp8_output: expected a boolean, got " .. type(fp8_output), 4)
  end
  local info = { mode = mode, qkv_layer = args.qkv_layer, kv_layer = args.kv_layer, dim = args.qkv_interleave_dim or -3,
    fmt_name = fmt_name, combine = args.fp8_combine, fp8_output = fp8_output }
  local q8, k8, v8, f, keep, post = fp8.prepare_forward(al, r, info, refs.q, refs.k, refs.v, dry)
  inp.q, inp.k, inp.v = q8.raw, k8.raw, v8.raw
  inp.fp8 = f
  refs.q8, refs.k8, refs.v8, refs.fp8_keep, refs.fp8_struct = q8, k8, v8, keep, f
  return { recipe = r, f = f, post = post, module = fp8 }
end

---------------------------------------------------------------------------------------------------
-- variants (score_mod / mask_mod / block_mask, lua/attnlab/variants.lua): the CPU runs the Lua
-- oracle; CUDA tensors go to the C backends with an al_attn_variant (only flash serves it)
---------------------------------------------------------------------------------------------------
local variants_mod
local function variant_args(args, defaults)
  local sm, mm, bm = args.score_mod, args.mask_mod, args.block_mask
  if sm == nil then sm = defaults and defaults.score_mod end
  if mm == nil then mm = defaults and defaults.mask_mod end
  if bm == nil then bm = defaults and defaults.block_mask end
  if sm == nil and mm == nil and bm == nil then return nil end
  return sm or nil, mm or nil, bm or nil
end

-- the al_attn_variant for C (its strings, captures and block mask are kept alive in `keep`)
local function cuda_variant(al, fname, v, q, bm, keep)
  local vs = ffi.new("al_attn_variant")
  keep[#keep + 1] = vs
  local function cstr(x)
    if x == nil then return nil end
    local b = ffi.new("char[?]", #x + 1, x)
    keep[#keep + 1] = b
    return b
  end
  vs.score_mod, vs.score_grad, vs.mask_mod = cstr(v.cuda_score_mod), cstr(v.cuda_score_grad), cstr(v.cuda_mask_mod)
  vs.capture_grad, vs.prelude = cstr(v.cuda_capture_grad), cstr(v.cuda_prelude)
  vs.score_pre, vs.score_post = cstr(v.cuda_score_pre), v.cuda_score_pre and v.score_post or 0
  vs.score_grad_pre = cstr(v.cuda_score_grad_pre)
  if v.cuda_score_mod and v.score_lo then   -- the new logit's proven bounds (variants/interval.lua, score_bounds)
    vs.score_bounded, vs.score_lo, vs.score_hi = 1, v.score_lo, v.score_hi
  end
  vs.score_mufu = (v.cuda_score_mod and v.score_mufu) and 1 or 0   -- the forward's consumers (docs/FLASH.md)
  local ncap = #v.captures
  if ncap > C.AL_ATTN_VARIANT_MAX_CAPTURES then
    error(string.format("%s: score_mod / mask_mod capture %d tensors, at most %d are supported", fname, ncap,
      C.AL_ATTN_VARIANT_MAX_CAPTURES), 0)
  end
  vs.ncaptures = ncap
  local dev = q:device()
  -- captures: contiguous f32 (float dtypes) or i32 (integer dtypes) copies on q's device
  for i, rec in ipairs(v.captures) do
    local t = rec.tensor:to({ dtype = rec.kind == "i" and "i32" or "f32", device = dev }):contiguous()
    keep[#keep + 1] = t
    vs.captures[i - 1] = t.raw
  end
  if bm then
    local t = bm:on(dev)
    keep[#keep + 1] = t
    vs.block_mask = t.raw
    vs.block_m, vs.block_n = bm.block_m, bm.block_n
    vs.block_order = bm.heavy_last and 1 or 0
  end
  return vs
end

local function forward_variant(al, fname, args, defaults, sm, mm, bm, level)
  variants_mod = variants_mod or require "attnlab.variants"
  local V = variants_mod
  local p, inp, refs, layout, mode, fmt_name = build(al, fname, args, defaults, level + 1)
  local r8 = args.fp8_recipe
  if r8 == nil and defaults then r8 = defaults.fp8_recipe end
  local fp8 = package.loaded["attnlab.fp8"]
  if r8 == nil and fp8 then r8 = fp8.active_recipe() end
  if r8 then error(fname .. ": fp8_recipe: score_mod / mask_mod variants do not support FP8", level) end
  local ok, err = pcall(V.oracle_check, fname, p, inp, args, defaults)
  if not ok then error(err, level) end
  local v
  ok, v = pcall(V.build, al, sm, mm, fname)
  if not ok then error(v, level) end
  local ctx = { params = p, inputs = inp, refs = refs, layout = layout, mode = mode, qkv_format = fmt_name,
    args = args, qkv_interleave_dim = args.qkv_interleave_dim or -3, variant = v, block_mask = bm, captures = {} }
  for i, rec in ipairs(v.captures) do ctx.captures[i] = rec.tensor end
  local out, lse
  if not refs.q:is_cuda() then
    local st
    ok, out, lse, st = pcall(V.oracle_forward, al, v, p, inp, refs, fmt_name, bm)
    if not ok then error(out, level) end
    ctx.oracle = st
  else
    if bm then
      ok, err = pcall(V.check_block_mask, fname, bm, bm.B, bm.H, bm.Sq, bm.Skv)
      if not ok then error(err, level) end
    end
    ctx.keep = {}
    ok, err = pcall(cuda_variant, al, fname, v, refs.q, bm, ctx.keep)
    if not ok then error(err, level) end
    inp.variant = err
    ctx.cvariant = err
    out, lse = T.new(), T.new()
    T.check(C.al_attn_forward(p, inp, out.raw, lse.raw, nil), fname)
    T.after_alloc()
  end
  ctx.out, ctx.lse = out, lse
  return flatten(out), ctx
end

-- level: frames from M.forward up to the user's call
function M.forward(al, args, defaults, level)
  local fname = "attention.forward"
  if type(args) == "table" then
    local sm, mm, bm = variant_args(args, defaults)
    if sm or mm or bm then return forward_variant(al, fname, args, defaults, sm, mm, bm, (level or 2) + 1) end
  end
  local p, inp, refs, layout, mode, fmt_name = build(al, fname, args, defaults, (level or 2) + 1)
  local f8 = apply_fp8(al, fname, args, defaults, inp, refs, mode, fmt_name, false)
  local out, lse = tensor_ct(), tensor_ct()
  local ml = nil
  if p.return_max_logit ~= 0 then ml = tensor_ct() end
  local st = al_attn_forward(p, inp, out.raw, lse.raw, ml and ml.raw or nil)
  if st ~= 0 then T.check(st, fname) end
  after_alloc()
  if f8 then out = f8.module.finish_forward(al, f8.recipe, f8.f, out, f8.post) end
  local ctx = { params = p, inputs = inp, refs = refs, layout = layout, mode = mode, qkv_format = fmt_name,
    out = out, lse = lse, args = args, fp8 = f8,
    qkv_interleave_dim = args.qkv_interleave_dim or -3 }
  local flat = flatten(out)
  if f8 and f8.f.out_dtype == f8.recipe.fwd_format then   -- fp8_output: codes + O's scale, like TE's Float8Tensor
    -- (delayed scaling on the device: O's scale is element 3 of the call's used record, read when asked for)
    local sc = f8.post.ds and { f8.post.used, 3 } or f8.f.scale_used[2]
    flat = f8.module.wrap(flat, sc, f8.recipe.fwd_format)
  end
  if p.return_max_logit ~= 0 then
    ctx.max_logit = ml
    return flat, ml, ctx
  end
  return flat, ctx
end

-- The gradient buffers handed to al_attn_backward. Its contract is that every element is written (zeros
-- in padding rows and thd gaps: each backend fills what its kernels skip), so they are not zeroed here:
-- three fills cost 3-7% of a fused backward on the H200 (cuDNN's own kernels run 1.4-4.6 ms there).
-- ATTNLAB_POISON_GRADS=1 (tests) fills them with NaN first, so an element a backend misses shows.
local POISON_GRADS = os.getenv("ATTNLAB_POISON_GRADS") == "1"
local function grad_like(al, t)
  local g = al.empty(t:size(), { dtype = t:dtype(), device = t:device() })
  if POISON_GRADS then g:fill_(0 / 0) end
  return g
end

function M.backward(al, ctx, dout)
  local fname = "attention.backward"
  if type(ctx) ~= "table" or ctx.params == nil then error(fname .. ": ctx: expected the ctx returned by attention.forward", 2) end
  if not is_tensor(dout) then error(fname .. ": dout: expected a tensor, got " .. type(dout), 2) end
  local out = ctx.out
  if dout:numel() ~= out:numel() then
    error(string.format("%s: dout must have %d elements (the output's), got %d", fname, out:numel(), dout:numel()), 2)
  end
  local d4 = dout
  if dout:dim() ~= out:dim() then
    local ok, r = pcall(dout.view, dout, out:size())
    d4 = ok and r or dout:contiguous():view(out:size())
  end
  local args = ctx.args
  local refs = ctx.refs
  local grads = {}
  local dq, dk, dv
  local dim = ctx.qkv_interleave_dim
  if ctx.mode == "qkv" then
    local g = grad_like(al, args.qkv_layer)
    dq, dk, dv = g:select(dim, 1), g:select(dim, 2), g:select(dim, 3)
    grads.qkv_layer = g
  elseif ctx.mode == "kv" then
    dq = grad_like(al, refs.q)
    local g = grad_like(al, args.kv_layer)
    dk, dv = g:select(dim, 1), g:select(dim, 2)
    grads.query_layer, grads.kv_layer = dq, g
  else
    dq, dk, dv = grad_like(al, refs.q), grad_like(al, refs.k), grad_like(al, refs.v)
    grads.query_layer, grads.key_layer, grads.value_layer = dq, dk, dv
  end
  if ctx.variant then
    local v = ctx.variant
    local cg
    if ctx.oracle then
      local ok, r = pcall(variants_mod.oracle_backward, al, v, ctx.oracle, d4, dq, dk, dv)
      if not ok then error(r, 2) end
      cg = r
    else
      -- capture gradients: f32 accumulators, zeroed here (the kernels only add)
      cg = {}
      local vs = ctx.cvariant
      for i, rec in ipairs(v.captures) do
        if rec.requires_grad and v.has_cap_grad then
          local g = al.zeros(rec.shape, { dtype = "f32", device = refs.q:device() })
          cg[i] = g
          vs.capture_grads[i - 1] = g.raw
        else
          vs.capture_grads[i - 1] = nil
        end
      end
      T.check(C.al_attn_backward(ctx.params, ctx.inputs, out.raw, d4.raw, ctx.lse.raw, dq.raw, dk.raw, dv.raw,
        nil, nil), fname)
      for i = 0, #v.captures - 1 do vs.capture_grads[i] = nil end
    end
    -- grads.captures[i] <-> ctx.captures[i] (false when not an al.attention.param), also keyed by the tensor;
    -- f32 on q's device (f64 from the CPU oracle under compute_dtype = "f64")
    local caps = {}
    for i, rec in ipairs(v.captures) do
      local g = cg[i]
      if rec.requires_grad and g == nil then g = al.zeros(rec.shape, { dtype = "f32", device = refs.q:device() }) end
      caps[i] = g or false
      if g then caps[rec.tensor] = g end
    end
    grads.captures = caps
    return grads
  end
  local db, doff = T.new(), T.new()
  local f8, do_done = ctx.fp8, false
  if f8 then d4, do_done = f8.module.prepare_backward(al, f8.recipe, f8.f, d4) end
  T.check(C.al_attn_backward(ctx.params, ctx.inputs, out.raw, d4.raw, ctx.lse.raw, dq.raw, dk.raw, dv.raw,
    db.raw, doff.raw), fname)
  if f8 then f8.module.finish_backward(al, f8.recipe, f8.f, { dq, dk, dv }, do_done, f8.post) end
  if db.raw.storage ~= nil then grads.core_attention_bias = db end
  if doff.raw.storage ~= nil then grads.softmax_offset = doff end
  return grads
end

local function explain_variant(al, fname, args, defaults, sm, mm, bm, level)
  variants_mod = variants_mod or require "attnlab.variants"
  local p, inp, refs, layout = build(al, fname, args, defaults, level + 1)
  local ok, v = pcall(variants_mod.build, al, sm, mm, fname)
  if not ok then error(v, level) end
  local lines = { "layout " .. tostring(layout) }
  local desc = tostring(v):gsub("^attention variant", "variant (score_mod / mask_mod):")
  if not refs.q:is_cuda() then
    local okc, err = pcall(variants_mod.oracle_check, fname, p, inp, args, defaults)
    lines[#lines + 1] = desc
    if bm then lines[#lines + 1] = "block mask: " .. tostring(bm):gsub("\n.*", "") end
    if okc then
      lines[#lines + 1] = "cpu tensors: served by the Lua oracle (attnlab.variants: generated Lua compiled by LuaJIT, f64)"
      return table.concat(lines, "\n") .. "\n", "variants-oracle"
    end
    lines[#lines + 1] = "error: " .. tostring(err)
    return table.concat(lines, "\n") .. "\n", nil
  end
  local keep = {}
  inp.variant = cuda_variant(al, fname, v, refs.q, bm, keep)
  local buf = ffi.new("char[?]", 8192)
  local name = C.al_attn_explain(p, inp, buf, 8192)
  lines[#lines + 1] = desc
  if bm then lines[#lines + 1] = "block mask: " .. tostring(bm):gsub("\n.*", "") end
  local text = table.concat(lines, "\n") .. "\n" .. ffi.string(buf)
  if name == nil and text:find("error:", 1, true) == nil then text = text .. "error: " .. T.last_error() .. "\n" end
  return text, name ~= nil and ffi.string(name) or nil
end

function M.explain(al, args, defaults, level)
  local fname = "attention.explain"
  if type(args) == "table" then
    local sm, mm, bm = variant_args(args, defaults)
    if sm or mm or bm then return explain_variant(al, fname, args, defaults, sm, mm, bm, (level or 2) + 1) end
  end
  local p, inp, refs, layout, mode, fmt_name = build(al, fname, args, defaults, (level or 2) + 1)
  local f8 = apply_fp8(al, fname, args, defaults, inp, refs, mode, fmt_name, true)
  local buf = ffi.new("char[?]", 8192)
  local name = C.al_attn_explain(p, inp, buf, 8192)
  local text = "layout " .. tostring(layout) .. "\n" .. ffi.string(buf)
  if f8 then
    text = text .. "fp8 recipe: " .. tostring(f8.recipe) .. (mode ~= "separate" and f8.recipe.slots.qkv.mode ~= "mx" and
      args.fp8_combine ~= false and " (packed " .. mode .. " buffer quantised in one pass: combine_and_quantize)\n" or "\n")
    if rawget(f8.recipe, "ds_algo") then
      text = text .. "fp8 scaling state: with the data on " .. refs.q:device() ..
        " (amax histories and scales updated there after each call; " ..
        (refs.q:device() == "cpu" and "read directly"
          or name ~= nil and ffi.string(name) == "fused" and "the fused backend reads them on the device, no host wait"
          or "this backend reads its scales on the host: a wait per call") .. ")\n"
    end
  end
  if name == nil and text:find("error:", 1, true) == nil then
    text = text .. "error: " .. T.last_error() .. "\n"
  end
  return text, name ~= nil and ffi.string(name) or nil
end

-- TE's default ALiBi slopes for h heads (a Lua list).
function M.default_alibi_slopes(h)
  local buf = ffi.new("float[?]", h)
  C.al_attn_default_alibi_slopes(h, buf)
  local t = {}
  for i = 0, h - 1 do t[i + 1] = buf[i] end
  return t
end

function M.install(al)
  al.attention = al.attention or {}
  local A = al.attention
  -- (not tail calls: the frames count for the warnings' call-site levels)
  A.forward = function(args) local a, b, c = M.forward(al, args, nil, 2) return a, b, c end
  A.backward = function(ctx, dout) return M.backward(al, ctx, dout) end
  A.explain = function(args) local a, b = M.explain(al, args, nil, 2) return a, b end
  A.default_alibi_slopes = M.default_alibi_slopes
  A.backends = function()
    local t, i = {}, 0
    while true do
      local n = C.al_attn_backend_name(i)
      if n == nil then break end
      t[#t + 1] = ffi.string(n)
      i = i + 1
    end
    return t
  end
  -- for nn.lua: forward/backward/explain with module defaults
  A._forward_with = function(args, defaults, level)
    local a, b, c = M.forward(al, args, defaults, (level or 1) + 1)
    return a, b, c
  end
  -- for bench/host_overhead.lua: the Lua front end alone (everything forward does before the C call)
  A._prepare = function(args, defaults)
    local p, inp, refs, _, mode, fmt_name = build(al, "attention.forward", args, defaults, 2)
    apply_fp8(al, "attention.forward", args, defaults, inp, refs, mode, fmt_name, false)
    return p, inp, refs
  end
  A._explain_with = function(args, defaults, level)
    local a, b = M.explain(al, args, defaults, (level or 1) + 1)
    return a, b
  end
end

return M
