--[[
attnlab.cp.a2a — Ulysses: all-to-all from sequence-sharded to head-sharded tensors, one full-sequence
attention per rank on h / cp heads, all-to-all back; the backward the same way. Part of attnlab.cp.
]]
local T = require "attnlab.tensor"
local shards = require "attnlab.cp.shards"
local blocks = require "attnlab.cp.blocks"

local split_opts, gather_full = blocks.split_opts, blocks.gather_full
local M = {}
local al -- set by install

---------------------------------------------------------------------------------------------------
-- a2a (Ulysses)
---------------------------------------------------------------------------------------------------
-- x[r]: local shards [.., H, D] -> per local rank the full sequence of its head group [.., H/cp, D]
local function a2a_to_heads(S, x, kv)
  local cp = S.cp
  local send = {}
  for _, r in ipairs(S.ranks) do
    local hh = x[r]:size(-2) / cp
    send[r] = {}
    for j = 1, cp do send[r][j] = x[r]:narrow(-2, (j - 1) * hh + 1, hh):contiguous() end
  end
  local recv = S.group:all_to_all(send)
  return gather_full(S, recv, kv)
end

-- y[r]: full sequence of rank r's head group -> per local rank its shard with all heads
local function a2a_to_seq(S, y, kv, h_total)
  local cp = S.cp
  local send = {}
  for _, r in ipairs(S.ranks) do send[r] = shards.split(y[r], split_opts(S, kv)) end
  local recv = S.group:all_to_all(send)
  local out = {}
  for _, r in ipairs(S.ranks) do
    local p1 = recv[r][1]
    local shape = p1:size()
    local hh = shape[#shape - 1]
    shape[#shape - 1] = hh * cp
    local t = al.empty(shape, { dtype = p1:dtype(), device = p1:device() })
    for j = 1, cp do t:narrow(-2, (j - 1) * hh + 1, hh):copy_(recv[r][j]) end
    out[r] = t
  end
  return out
end

local PASS = { "softmax_scale", "compute_dtype", "backend", "deterministic", "window_size", "bottom_right_diagonal",
  "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "max_seqlen_q", "max_seqlen_kv" }

local function a2a_forward(S)
  local Q, K, V = a2a_to_heads(S, S.q, false), a2a_to_heads(S, S.k, true), a2a_to_heads(S, S.v, true)
  local outs, ctxs = {}, {}
  for _, r in ipairs(S.ranks) do
    local a = { query_layer = Q[r], key_layer = K[r], value_layer = V[r], qkv_format = S.fmt,
      attn_mask_type = S.args.attn_mask_type or "causal" }
    for _, n in ipairs(PASS) do if S.args[n] ~= nil then a[n] = S.args[n] end end
    if S.fmt == "thd" then
      for _, n in ipairs { "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded" } do
        local x = a[n]
        if x ~= nil and not T.is_tensor(x) then a[n] = al.tensor(x, { dtype = "i32" }):to(S.device) end
      end
      a.cu_seqlens_kv = a.cu_seqlens_kv or a.cu_seqlens_q
      a.cu_seqlens_kv_padded = a.cu_seqlens_kv_padded or a.cu_seqlens_q_padded
      if a.attn_mask_type == "no_mask" then a.attn_mask_type = "padding" elseif a.attn_mask_type == "causal" then a.attn_mask_type = "padding_causal" end
    end
    local _, ctx = al.attention.forward(a)
    ctxs[r] = ctx
    outs[r] = ctx.out
  end
  local o = a2a_to_seq(S, outs, false)
  return o, ctxs
end

local function a2a_backward(S, ctxs, dout)
  local D = a2a_to_heads(S, dout, false)
  local gq, gk, gv = {}, {}, {}
  for _, r in ipairs(S.ranks) do
    local gr = al.attention.backward(ctxs[r], D[r])
    gq[r], gk[r], gv[r] = gr.query_layer, gr.key_layer, gr.value_layer
  end
  local dq, dk, dv = a2a_to_seq(S, gq, false), a2a_to_seq(S, gk, true), a2a_to_seq(S, gv, true)
  local res = {}
  for _, r in ipairs(S.ranks) do res[r] = { dq[r], dk[r], dv[r] } end
  return res
end

M.forward, M.backward = a2a_forward, a2a_backward
function M.install(a) al = a end

return M
