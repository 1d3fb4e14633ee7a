--[[
attention_oracle.lua — a naive, independent attention oracle in plain Lua numbers, for small sizes.

It reads q, k, v (and masks, bias, cu_seqlens, slopes, offsets) with :totable(), materialises every
score, applies TransformerEngine's rules written out directly from te_dpa_semantics.md §3.2 (window
resolution, diagonal alignment, ALiBi with its own default-slope code, sink softmax, fully-masked rows
= 0), and returns the output as a flat row-major list in the shape the C forward returns before
flattening ([b,s,h,dv] | [s,b,h,dv] | [t,h,dv]), plus lse [b][h][i] and max_logit [h].
Dropout keep decisions come from al.C.al_attn_dropout_uniform (the documented Philox contract).
Nothing here calls the attention code under test.
]]
local O = {}

local function default_slopes(n)
  local p2 = 2 ^ math.floor(math.log(n) / math.log(2))
  local m0 = 2 ^ (-8 / p2)
  local s = {}
  for k = 1, p2 do s[k] = m0 ^ k end
  if p2 < n then
    local mh = 2 ^ (-4 / p2)
    local e = 1
    for k = 1, n - p2 do s[p2 + k] = mh ^ e; e = e + 2 end
  end
  return s
end
O.default_slopes = default_slopes

local MASK_ALIASES = { ["padding,causal"] = "padding_causal", ["causal,padding"] = "padding_causal",
  causal_padding = "padding_causal" }

function O.run(al, a)
  local fmt = a.qkv_format or "sbhd"
  local q, k, v = a.query_layer, a.key_layer, a.value_layer
  local mask = a.attn_mask_type or "causal"
  mask = MASK_ALIASES[mask] or mask
  local tq, tk, tv = q:totable(), k:totable(), v:totable()
  local qs, ks, vs = q:size(), k:size(), v:size()
  local nd = #qs
  local H, HG, DQK, DV = qs[nd - 1], ks[nd - 1], qs[nd], vs[nd]
  local B, SQ, SKV
  local qstart, kstart, qlen, klen = {}, {}, {}, {}
  local qvalid, kvalid
  if fmt == "thd" then
    local cq, ckv = a.cu_seqlens_q:totable(), a.cu_seqlens_kv:totable()
    local cqp = a.cu_seqlens_q_padded and a.cu_seqlens_q_padded:totable() or cq
    local ckp = a.cu_seqlens_kv_padded and a.cu_seqlens_kv_padded:totable() or ckv
    B = #cq - 1
    SQ, SKV = 0, 0
    for b = 1, B do
      qstart[b], kstart[b] = cqp[b], ckp[b]
      qlen[b], klen[b] = cq[b + 1] - cq[b], ckv[b + 1] - ckv[b]
      SQ, SKV = math.max(SQ, qlen[b]), math.max(SKV, klen[b])
    end
    SQ, SKV = a.max_seqlen_q or SQ, a.max_seqlen_kv or SKV
  else
    if fmt == "bshd" then B, SQ, SKV = qs[1], qs[2], ks[2] else B, SQ, SKV = qs[2], qs[1], ks[1] end
    for b = 1, B do qstart[b], kstart[b], qlen[b], klen[b] = 0, 0, SQ, SKV end
    if mask:find("padding") and a.cu_seqlens_q then
      local cq, ckv = a.cu_seqlens_q:totable(), a.cu_seqlens_kv:totable()
      for b = 1, B do qlen[b], klen[b] = cq[b + 1] - cq[b], ckv[b + 1] - ckv[b] end
    elseif mask:find("padding") and a.attention_mask then
      local mq, mk = a.attention_mask, a.attention_mask
      if type(mq) == "table" and not al.is_tensor(mq) then mq, mk = mq[1], mq[2] end
      mq, mk = mq:totable(), mk:totable()
      qvalid, kvalid = {}, {}
      for b = 1, B do
        qvalid[b], kvalid[b] = {}, {}
        qlen[b], klen[b] = 0, 0
        for i = 1, SQ do qvalid[b][i - 1] = mq[b][1][1][i] == 0; if qvalid[b][i - 1] then qlen[b] = qlen[b] + 1 end end
        for j = 1, SKV do kvalid[b][j - 1] = mk[b][1][1][j] == 0; if kvalid[b][j - 1] then klen[b] = klen[b] + 1 end end
      end
    end
  end
  local function row(t, b, i, h, start)
    if fmt == "bshd" then return t[b][i + 1][h]
    elseif fmt == "sbhd" then return t[i + 1][b][h]
    else return t[start + i + 1][h] end
  end
  -- window and diagonal (TE check_set_window_size / bottom_right_diagonal)
  local ws = a.window_size
  local wl, wr = -1, -1
  if ws then wl, wr = ws[1], ws[2] end
  local causal = mask:find("causal") ~= nil
  local br
  if causal then
    if wr ~= 0 then wr = 0 end
    br = mask:find("bottom_right") ~= nil
  else
    if wl == -1 and wr == 0 then wr = -1 end
    br = a.bottom_right_diagonal
    if br == nil then br = true end
  end
  local scale = a.softmax_scale or 1 / math.sqrt(DQK)
  local bias_type = a.core_attention_bias_type or "no_bias"
  local bias = a.core_attention_bias and a.core_attention_bias:totable()
  local bsz = a.core_attention_bias and a.core_attention_bias:size()
  local slopes
  if bias_type == "alibi" then
    if a.alibi_slopes then
      local st = a.alibi_slopes:totable()
      slopes = function(b, h) return type(st[1]) == "table" and st[b][h] or st[h] end
    else
      local ds = default_slopes(H)
      slopes = function(_, h) return ds[h] end
    end
  end
  local arb = mask == "arbitrary" and a.attention_mask
  local arbt, arbs
  if arb then arbt, arbs = arb:totable(), arb:size() end
  local function arb_at(b, h, i, j)
    local idx = { b, h, i + 1, j + 1 }
    local t = arbt
    local off = 4 - #arbs
    for d = 1, #arbs do
      local x = arbs[d] == 1 and 1 or idx[d + off]
      t = t[x]
    end
    return t ~= 0
  end
  local softmax_type = a.softmax_type or "vanilla"
  local offs = a.softmax_offset and a.softmax_offset:totable()
  local p = a.attention_dropout or 0
  local outsz = {}
  for i = 1, nd - 1 do outsz[i] = qs[i] end
  outsz[nd] = DV
  local total = 1
  for i = 1, nd do total = total * outsz[i] end
  local out = {}
  for i = 1, total do out[i] = 0 end
  local lse, maxlog = {}, {}
  for h = 1, H do maxlog[h] = -math.huge end
  local function oidx(b, i, h, d, start)
    if fmt == "bshd" then return (((b - 1) * SQ + i) * H + (h - 1)) * DV + d
    elseif fmt == "sbhd" then return ((i * B + (b - 1)) * H + (h - 1)) * DV + d
    else return ((start + i) * H + (h - 1)) * DV + d end
  end
  local group = H / HG
  for b = 1, B do
    lse[b] = {}
    local diag = br and (klen[b] - qlen[b]) or 0
    local qrows = qvalid and SQ or qlen[b]
    local krows = kvalid and SKV or klen[b]
    for h = 1, H do
      lse[b][h] = {}
      local hk = math.floor((h - 1) / group) + 1
      for i = 0, qrows - 1 do
        local qi = row(tq, b, i, h, qstart[b])
        local s = {}
        local m = -math.huge
        for j = 0, krows - 1 do
          local masked = (qvalid and not qvalid[b][i]) or (kvalid and not kvalid[b][j])
            or (wl >= 0 and j < i + diag - wl) or (wr >= 0 and j > i + diag + wr) or (arb and arb_at(b, h, i, j))
          if not masked then
            local kj = row(tk, b, j, hk, kstart[b])
            local dot = 0
            for d = 1, DQK do dot = dot + qi[d] * kj[d] end
            local sc
            if bias_type == "pre_scale_bias" or bias_type == "post_scale_bias" then
              local bv = bias[bsz[1] == 1 and 1 or b][bsz[2] == 1 and 1 or h][bsz[3] == 1 and 1 or i + 1][j + 1]
              sc = bias_type == "pre_scale_bias" and (dot + bv) * scale or dot * scale + bv
            else
              sc = dot * scale
            end
            if bias_type == "alibi" then sc = sc - slopes(b, h) * math.abs(j - i - diag) end
            s[j] = sc
            if sc > m then m = sc end
          end
        end
        if m > maxlog[h] then maxlog[h] = m end
        local sink = nil
        if softmax_type == "off-by-one" then sink = 0 elseif softmax_type == "learnable" then sink = offs[h] end
        local mm = m
        if sink and sink > mm then mm = sink end
        local z = 0
        for _, sc in pairs(s) do z = z + math.exp(sc - mm) end
        if sink then z = z + math.exp(sink - mm) end
        lse[b][h][i] = z > 0 and mm + math.log(z) or -math.huge
        if next(s) ~= nil then
          local acc = {}
          for d = 1, DV do acc[d] = 0 end
          for j, sc in pairs(s) do
            local pr = math.exp(sc - mm) / z
            if p > 0 then
              local idx = (((b - 1) * H + (h - 1)) * SQ + i) * SKV + j
              local u = al.C.al_attn_dropout_uniform(a.dropout_seed, a.dropout_offset, idx)
              pr = u < (1 - p) and pr / (1 - p) or 0
            end
            local vj = row(tv, b, j, hk, kstart[b])
            for d = 1, DV do acc[d] = acc[d] + pr * vj[d] end
          end
          for d = 1, DV do out[oidx(b, i, h, d, qstart[b])] = acc[d] end
        end
      end
    end
  end
  return out, lse, maxlog
end

return O
