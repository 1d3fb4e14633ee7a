--[[
attnlab.variants.oracle — the CPU oracle of score_mod / mask_mod attention: exact semantics, in f64,
for checking the GPU kernels (and serving CPU tensors).

S = softmax_scale * Q K^T and O = P V use al.matmul in f64; the mask, score_mod, softmax, lse (-inf and
zero output for fully masked rows) and the backward's dS, score_grad and capture gradients run in
loops generated as Lua (attnlab.variants.luagen) and compiled by LuaJIT, so the oracle composes with
the built-in mask exactly like the flash kernels: an element is kept when it lies inside the sequence
lengths, the causal / window band, a non-empty block of the block mask (a full block keeps it without
mask_mod) and mask_mod. Formats bshd, sbhd and thd (padded too), GQA / MQA, cross attention.
]]
local T = require "attnlab.tensor"
local lffi = require "attnlab.ffi"
local sym = require "attnlab.variants.sym"
local luagen = require "attnlab.variants.luagen"
local check_block_mask = require("attnlab.variants.block_mask").check_block_mask

local M = {}
local ffi = lffi.ffi
local huge = math.huge
local load_offset = sym.load_offset
local gen_lua, lua_header, load_chunk, NAMES = luagen.gen_lua, luagen.lua_header, luagen.load_chunk, luagen.ORACLE_NAMES

---------------------------------------------------------------------------------------------------
-- the generated loops (compiled once per variant; the chunks are cached by source text)
---------------------------------------------------------------------------------------------------

-- A chunk's function: `params`, then a loop over the [B, H, SQ, SKV] score matrix that keeps POS (the position
-- the capture readers' errors report) current and runs `body` per element e (b, h, i = q_idx, j = kv_idx,
-- 0-based); `per_b` runs once per batch entry.
local function score_loops(params, per_b, body)
  return "return function(" .. params .. ")\n" .. [[
  local NINF = -math.huge
  for b = 0, B - 1 do
    ]] .. per_b .. [[

    for h = 0, H - 1 do
      POS[0], POS[1] = b, h
      for i = 0, SQ - 1 do
        local row = ((b * H + h) * SQ + i) * SKV
        POS[2] = i
        for j = 0, SKV - 1 do
          local e = row + j
]] .. body .. [[
        end
      end
    end
  end
end
]]
end

-- forward: S (raw q.k in, new logits out, -inf where masked), K (u8 keep)
local function forward_kernel(self)
  if self.fwd_fn then return self.fwd_fn end
  local mexpr = self.mask_root and gen_lua(self.mask_root, NAMES) or "1"
  local sexpr = self.score_root and gen_lua(self.score_root, NAMES) or "score"
  local src = lua_header(self.captures, self.score_root and "score_mod" or "mask_mod") .. score_loops(
    "Sp, Kp, B, H, SQ, SKV, scale, qlen, kvlen, diag, wl, wr, BMp, bsb, bsh, bsi, bsj, BMM, BMN",
    "local ql, kl, dg = qlen[b], kvlen[b], diag[b]", [[
          local keep = i < ql and j < kl
          if keep and wl >= 0 and j < i + dg - wl then keep = false end
          if keep and wr >= 0 and j > i + dg + wr then keep = false end
          if keep then
            local tile = 1
            if BMp ~= nil then
              tile = BMp[b * bsb + h * bsh + math.floor(i / BMM) * bsi + math.floor(j / BMN) * bsj]
            end
            if tile == 0 then keep = false
            elseif tile == 1 then POS[3] = j keep = (]] .. mexpr .. [[) ~= 0 end
          end
          if keep then
            POS[3] = j
            local score = Sp[e] * scale
            Sp[e] = ]] .. sexpr .. [[

            Kp[e] = 1
          else
            Sp[e] = NINF
            Kp[e] = 0
          end
]])
  self.fwd_src = src
  self.fwd_fn = load_chunk(src, "variant_forward")(self.cpu_caps_ptrs, self.pos, error, string.format)
  return self.fwd_fn
end

-- backward: DS holds dL/d(new logit) in, dL/d(score) out; capture gradients accumulate into G<k>
local function backward_kernel(self)
  if self.bwd_fn then return self.bwd_fn end
  local dexpr = self.score_root and gen_lua(self.score_grad_root, NAMES) or "grad"
  local acc = {}
  for _, g in ipairs(self.cap_grads or {}) do
    local off = gen_lua(load_offset(g.load.args, g.rec.strides), NAMES)
    acc[#acc + 1] = string.format("do local o = %s; local G = GR[%d]; G[o] = G[o] + %s end", off, g.rec.k + 1,
      gen_lua(g.term, NAMES))
  end
  local src = lua_header(self.captures, "score_mod") .. score_loops("SR, DS, Kp, B, H, SQ, SKV, scale, GR", "", [[
          if Kp[e] ~= 0 then
            POS[3] = j
            local score, grad = SR[e] * scale, DS[e]
            ]] .. table.concat(acc, "\n            ") .. [[

            DS[e] = ]] .. dexpr .. [[

          else
            DS[e] = 0
          end
]])
  self.bwd_src = src
  self.bwd_fn = load_chunk(src, "variant_backward")(self.cpu_caps_ptrs, self.pos, error, string.format)
  return self.bwd_fn
end

---------------------------------------------------------------------------------------------------
-- forward and backward
---------------------------------------------------------------------------------------------------
local function f64(t) return t:to({ dtype = "f64", device = "cpu" }) end

-- per-sequence geometry from the (C-validated) call
local function geometry(al, p, refs, fmt)
  local q, k = refs.q, refs.k
  local B, SQ, SKV
  local qstart, kvstart, qlen, kvlen = {}, {}, {}, {}
  if fmt == "thd" then
    local cq, ck = refs.cu_seqlens_q:totable(), refs.cu_seqlens_kv:totable()
    local cqp = refs.cu_seqlens_q_padded and refs.cu_seqlens_q_padded:totable() or cq
    local ckp = refs.cu_seqlens_kv_padded and refs.cu_seqlens_kv_padded:totable() or ck
    B = #cq - 1
    SQ, SKV = 0, 0
    for b = 1, B do
      qstart[b], kvstart[b] = cqp[b], ckp[b]
      qlen[b], kvlen[b] = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
      SQ, SKV = math.max(SQ, qlen[b]), math.max(SKV, kvlen[b])
    end
    if tonumber(p.sq) > 0 then SQ = tonumber(p.sq) end
    if tonumber(p.skv) > 0 then SKV = tonumber(p.skv) end
  else
    local bd = fmt == "sbhd" and 2 or 1
    B, SQ, SKV = q:size(bd), q:size(3 - bd), k:size(3 - bd)
    local cq = refs.cu_seqlens_q and refs.cu_seqlens_q:totable()
    local ck = refs.cu_seqlens_kv and refs.cu_seqlens_kv:totable()
    for b = 1, B do
      qstart[b], kvstart[b] = 0, 0
      qlen[b] = cq and (cq[b + 1] - cq[b]) or SQ
      kvlen[b] = ck and (ck[b + 1] - ck[b]) or SKV
    end
  end
  return B, SQ, SKV, qstart, kvstart, qlen, kvlen
end

-- format tensor [.., heads, d] -> dense f64 [B, heads, S, d] (zeros past each sequence)
local function to_dense(al, t, fmt, B, S_, starts, lens)
  local nd = t:dim()
  local heads, d = t:size(nd - 1), t:size(nd)
  local dense = al.zeros({ B, heads, S_, d }, { dtype = "f64" })
  local src = f64(t)
  for b = 1, B do
    local len = lens[b]
    if len > 0 then
      local rows -- [len, heads, d]
      if fmt == "thd" then rows = src:narrow(1, starts[b] + 1, len)
      elseif fmt == "bshd" then rows = src:select(1, b):narrow(1, 1, len)
      else rows = src:select(2, b):narrow(1, 1, len) end
      dense:select(1, b):narrow(2, 1, len):copy_(rows:permute(2, 1, 3))
    end
  end
  return dense
end

-- dense [B, heads, S, d] -> rows of dst (format view) (dst zero first)
local function from_dense(dst, dense, fmt, B, starts, lens)
  dst:zero_()
  for b = 1, B do
    local len = lens[b]
    if len > 0 then
      local rows
      if fmt == "thd" then rows = dst:narrow(1, starts[b] + 1, len)
      elseif fmt == "bshd" then rows = dst:select(1, b):narrow(1, 1, len)
      else rows = dst:select(2, b):narrow(1, 1, len) end
      rows:copy_(dense:select(1, b):narrow(2, 1, len):permute(2, 1, 3))
    end
  end
end

local function dptr(t) return ffi.cast("double *", t:data_ptr()) end

-- check the call for what the oracle supports; names the argument
local function oracle_check(fname, p, inp, args, defaults)
  local function get(n) local x = args[n] if x == nil and defaults then x = defaults[n] end return x end
  if p.dropout_p ~= 0 then error(fname .. ": attention_dropout: score_mod / mask_mod variants do not support dropout", 0) end
  if inp.fp8 ~= nil then error(fname .. ": fp8_recipe: score_mod / mask_mod variants do not support FP8", 0) end
  if p.bias_type ~= 0 then
    error(fname .. ": core_attention_bias_type: with score_mod, write the bias in score_mod (e.g. score + bias[h][q_idx][kv_idx], " ..
      "or slopes[h] * ... for ALiBi) instead of core_attention_bias", 0)
  end
  if p.softmax_type ~= 0 then error(fname .. ": softmax_type: score_mod / mask_mod variants support the vanilla softmax only", 0) end
  if p.mask_type == 6 then error(fname .. ": attn_mask_type: 'arbitrary' with score_mod / mask_mod: express the mask as mask_mod", 0) end
  if inp.attention_mask ~= nil then
    error(fname .. ": attention_mask: padding masks with score_mod / mask_mod are not supported: give the lengths as " ..
      "cu_seqlens_q / cu_seqlens_kv", 0)
  end
  if p.return_max_logit ~= 0 then error(fname .. ": return_max_logit: not supported with score_mod / mask_mod", 0) end
  if get("inference_params") ~= nil then error(fname .. ": inference_params: not supported with score_mod / mask_mod", 0) end
end
M.oracle_check = oracle_check

-- Forward on the CPU. Returns out (q's format and dtype, unflattened), lse, and the oracle state.
function M.oracle_forward(al, v, p, inp, refs, fmt, block_mask)
  local C = lffi.C
  T.check(C.al_attn_check(p, inp), "attention.forward")
  local B, SQ, SKV, qstart, kvstart, qlen, kvlen = geometry(al, p, refs, fmt)
  local q, k, vv = refs.q, refs.k, refs.v
  local nd = q:dim()
  local H, HG = q:size(nd - 1), k:size(nd - 1)
  local D, DV = q:size(nd), vv:size(nd)
  local G = H / HG
  local scale = tonumber(p.softmax_scale)
  if scale == 0 then scale = 1 / math.sqrt(D) end
  -- diagonal alignment and window as the plan resolves them
  local mt = tonumber(p.mask_type)
  local causal = mt == 2 or mt == 3 or mt == 4 or mt == 5
  local br
  if causal then br = (mt == 4 or mt == 5)
  else br = tonumber(p.bottom_right_diagonal) ~= 0 end
  local wl, wr = tonumber(p.window_left), tonumber(p.window_right)
  if causal then
    if wl == -1 and wr == -1 then wr = 0 elseif wl >= 0 then wr = 0 end
  elseif wl == -1 and wr == 0 then wr = -1 end
  local qlen_c, kvlen_c, diag_c = ffi.new("int64_t[?]", B), ffi.new("int64_t[?]", B), ffi.new("int64_t[?]", B)
  for b = 1, B do
    qlen_c[b - 1], kvlen_c[b - 1] = qlen[b], kvlen[b]
    diag_c[b - 1] = br and (kvlen[b] - qlen[b]) or 0
  end
  -- dense operands
  local Qd = to_dense(al, q, fmt, B, SQ, qstart, qlen)      -- [B,H,SQ,D]
  local Kd = to_dense(al, k, fmt, B, SKV, kvstart, kvlen)   -- [B,HG,SKV,D]
  local Vd = to_dense(al, vv, fmt, B, SKV, kvstart, kvlen)  -- [B,HG,SKV,DV]
  local Qg = Qd:view(B, HG, G * SQ, D)
  local Sraw = al.matmul(Qg, Kd:transpose(3, 4)):contiguous()          -- [B,HG,G*SQ,SKV] = [B,H,SQ,SKV]
  -- the backward reads the raw scores only through score_mod's gradient: a mask-only variant overwrites them
  local Sn = v.score_root and Sraw:clone() or Sraw
  local Keep = al.zeros({ B, H, SQ, SKV }, { dtype = "u8" })
  v:_bind_cpu(al)
  local bmp, bsb, bsh, bsi, bsj, bmm, bmn = nil, 0, 0, 0, 0, 1, 1
  local bmt
  if block_mask then
    check_block_mask("attention.forward", block_mask, B, H, SQ, SKV)
    bmt = block_mask.mask:to("cpu")
    bmp = ffi.cast("uint8_t *", bmt:data_ptr())
    local st = bmt:stride()
    bsb = block_mask.bb == 1 and 0 or st[1]
    bsh = block_mask.hb == 1 and 0 or st[2]
    bsi, bsj = st[3], st[4]
    bmm, bmn = block_mask.block_m, block_mask.block_n
  end
  local fwd = forward_kernel(v)
  fwd(dptr(Sn), ffi.cast("uint8_t *", Keep:data_ptr()), B, H, SQ, SKV, scale, qlen_c, kvlen_c, diag_c,
    wl, wr, bmp, bsb, bsh, bsi, bsj, bmm, bmn)
  -- softmax rows (Sn becomes P), lse
  local lse = al.zeros({ B, H, SQ }, { dtype = "f64" })
  local sp, lp = dptr(Sn), dptr(lse)
  local NINF = -huge
  local exp, log = math.exp, math.log
  for r = 0, B * H * SQ - 1 do
    local base = r * SKV
    local m = NINF
    for j = 0, SKV - 1 do local x = sp[base + j] if x > m then m = x end end
    if m == NINF then
      for j = 0, SKV - 1 do sp[base + j] = 0 end
      lp[r] = NINF
    else
      local s = 0   -- one exponential per element: P = exp(x - m) / s (= exp(x - lse))
      for j = 0, SKV - 1 do local e = exp(sp[base + j] - m) sp[base + j] = e s = s + e end
      lp[r] = m + log(s)
      local inv = 1 / s
      for j = 0, SKV - 1 do sp[base + j] = sp[base + j] * inv end
    end
  end
  local Od = al.matmul(Sn:view(B, HG, G * SQ, SKV), Vd):contiguous():view(B, H, SQ, DV)
  -- outputs in q's format and dtype
  local oshape = q:size()
  oshape[nd] = DV
  local out = al.zeros(oshape, { dtype = q:dtype() })
  from_dense(out, Od, fmt, B, qstart, qlen)
  local lse_out = tonumber(p.compute_dtype) == 1 and lse or lse:to("f32")
  local st = { B = B, H = H, HG = HG, G = G, SQ = SQ, SKV = SKV, D = D, DV = DV, scale = scale, fmt = fmt,
    qstart = qstart, kvstart = kvstart, qlen = qlen, kvlen = kvlen, Qd = Qd, Kd = Kd, Vd = Vd,
    Sraw = v.score_root and Sraw or nil, P = Sn,
    Keep = Keep, Od = Od, bmt = bmt, f64 = tonumber(p.compute_dtype) == 1 }
  return out, lse_out, st
end

-- Backward on the CPU: writes dq, dk, dv (format tensors); returns capture gradients {k -> f32 tensor}.
function M.oracle_backward(al, v, st, dout, dq, dk, dv)
  local B, H, HG, G, SQ, SKV, D, DV = st.B, st.H, st.HG, st.G, st.SQ, st.SKV, st.D, st.DV
  local dOd = to_dense(al, dout, st.fmt, B, SQ, st.qstart, st.qlen)           -- [B,H,SQ,DV]
  local dOg = dOd:view(B, HG, G * SQ, DV)
  local Pg = st.P:view(B, HG, G * SQ, SKV)
  local dVd = al.matmul(Pg:transpose(3, 4), dOg)                              -- [B,HG,SKV,DV]
  local dP = al.matmul(dOg, st.Vd:transpose(3, 4)):contiguous()               -- [B,HG,G*SQ,SKV]
  -- dS = P * (dP - rowsum(dO * O)), in place in dP
  local pp, dpp, op, dop = dptr(st.P), dptr(dP), dptr(st.Od), dptr(dOd)
  for r = 0, B * H * SQ - 1 do
    local s = 0
    local ob = r * DV
    for d = 0, DV - 1 do s = s + op[ob + d] * dop[ob + d] end
    local base = r * SKV
    for j = 0, SKV - 1 do dpp[base + j] = pp[base + j] * (dpp[base + j] - s) end
  end
  -- score_grad and capture gradients
  local grads = {}
  local GR = {}
  for i, rec in ipairs(v.captures) do
    if rec.requires_grad then
      local g = al.zeros(rec.shape, { dtype = "f64" })
      grads[i] = g
      GR[i] = dptr(g)
    end
  end
  -- score_grad and the capture gradients; a mask-only variant has neither (its loop would copy dS where kept and
  -- write 0 where masked, where P, and so dS, is 0 already)
  if v.score_root then
    local bwd = backward_kernel(v)
    bwd(dptr(st.Sraw), dpp, ffi.cast("uint8_t *", st.Keep:data_ptr()), B, H, SQ, SKV, st.scale, GR)
  end
  local dSg = dP
  local dQd = al.matmul(dSg, st.Kd):view(B, H, SQ, D) * st.scale
  local dKd = al.matmul(dSg:transpose(3, 4), st.Qd:view(B, HG, G * SQ, D)) * st.scale
  from_dense(dq, dQd, st.fmt, B, st.qstart, st.qlen)
  from_dense(dk, dKd, st.fmt, B, st.kvstart, st.kvlen)
  from_dense(dv, dVd, st.fmt, B, st.kvstart, st.kvlen)
  if not st.f64 then for i, g in pairs(grads) do grads[i] = g:to("f32") end end
  return grads
end

return M
