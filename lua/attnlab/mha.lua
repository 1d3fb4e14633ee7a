--[[
attnlab.mha — al.nn.MultiheadAttention after TransformerEngine's MultiheadAttention
(te_dpa_semantics.md §2.5): a fused QKV projection whose output goes to DotProductAttention as one
declared packed buffer, with no copy and no layout detection.

  local mha = al.nn.MultiheadAttention{hidden_size = 256, num_attention_heads = 8, qkv_format = "bshd",
                                       attn_mask_type = "causal", attention_dropout = 0}
  local y = mha:forward(x)                  -- x [b, s, 256] (bshd), [s, b, 256] (sbhd) or [t, 256] (thd)
  local dx = mha:backward(x, dy)            -- accumulates every parameter gradient
  local params, grads = mha:parameters()
  -- a table input carries DPA's per-call arguments and the rest, TE's names:
  y = mha:forward{hidden_states = x, encoder_output = e, attention_mask = m, cu_seqlens_q = cu, ...,
                  inference_params = ip}

Arguments (TE's names): hidden_size, num_attention_heads, kv_channels (hidden_size / heads),
num_gqa_groups (heads), attention_type ("self" | "cross"), qkv_format ("sbhd"), qkv_weight_interleaved
(true), input_layernorm (false), normalization ("LayerNorm" | "RMSNorm"), layernorm_epsilon (1e-5),
bias (true), rotary (false | true | {rotary_base=, interleaved=, dim=}), qk_norm_type (or qk_norm:
"RMSNorm" | "LayerNorm" | "L2Normalization" | true), qk_norm_eps (1e-6), qk_norm_before_rope (false),
attention_dropout (0.1, TE's default), attn_mask_type ("causal"), window_size, softmax_type,
layer_number (1), backend, compute_dtype (DPA's: "f32" | "f64"), params_dtype ("f32"), device ("cpu"),
fp8_recipe (an al.fp8 recipe, default none).

FP8: fp8_recipe is handed to the core DotProductAttention, so FP8 covers the attention core only
(TE's fp8_dpa without fp8_mha): the QKV, query/key-value and output projections, the layernorm,
QK-norm and RoPE stay in high precision (params_dtype). The recipe's state is updated by every
forward (qkv, s, o slots) and backward (do, dp, dqkv slots) through the core attention.

The pass-through (TE's packed_dpa_eligible): self-attention with no RoPE, no QK-norm, no KV cache and
no GQA hands the projection output to DPA as qkv_layer, viewed [.., h, 3, d] with
qkv_interleave_dim = -2 when qkv_weight_interleaved (the weight's rows are ordered head by head,
q k v within a head), or [.., 3, h, d] with -3 otherwise; cross-attention hands the KV projection as
kv_layer ([.., hg, 2, d] / -2 or [.., 2, hg, d] / -3) next to the query. On the way back the
projection's gradient is the packed gradient DPA returns, viewed: no copy.
Otherwise (RoPE, QK-norm, a KV cache, GQA) it slices views of the projection output and does the
per-tensor work. Keys and values that stay untouched views go to DPA as the declared kv_layer; keys
that RoPE or QK-norm rewrote, and cached keys, go as separate tensors, which detection labels
*_hd_hd_hd: no deprecation warning on any path. With GQA and interleaved weights the rows are
[hg, h/hg + 2, d] per token (TE's layout): the queries of a group, then its key and value.
Set mha.pass_through = false to force the sliced path (for experiments and tests).

Context parallelism (docs/CONTEXT_PARALLEL.md): cp_group, cp_global_ranks, cp_stream, cp_comm_type
(constructor) or mha:set_context_parallel_group(...) go to the core DotProductAttention. The layernorm,
projections and QK-norm are per token and run on each rank's shard unchanged (the sliced path: packed
inputs are refused with CP); RoPE rotates each token by its global position, derived from the shard's
chunks (DualChunkSwap or load_balance = "contiguous"; thd: from cu_seqlens_q_padded). hidden_states and
grad_output are per-rank lists (by rank + 1) for a group with several local ranks, tensors for one local
rank; parameter gradients accumulate over the local ranks (a sum, as the data-parallel reduction that
includes the CP ranks would give: in a multi-process job all-reduce them over the group). Self-attention
only; no KV cache.
]]
local T = require "attnlab.tensor"

local M = {}

local function check_int(fname, name, v)
  if type(v) ~= "number" or v % 1 ~= 0 or v < 1 then
    error(string.format("%s: %s: expected a positive integer, got %s", fname, name, tostring(v)), 4)
  end
end

local function size_with(lead, ...)
  local s = {}
  for i = 1, #lead do s[i] = lead[i] end
  for i = 1, select("#", ...) do s[#s + 1] = select(i, ...) end
  return s
end

local function lead_of(t)
  local s = t:size()
  s[#s] = nil
  return s
end

-- per-call arguments handed to DotProductAttention unchanged
local DPA_ARGS = { "attention_mask", "attn_mask_type", "window_size", "bottom_right_diagonal", "cu_seqlens_q",
  "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "max_seqlen_q", "max_seqlen_kv",
  "core_attention_bias_type", "core_attention_bias", "alibi_slopes", "dropout_seed", "dropout_offset" }

function M.install(al)
  al.nn = al.nn or {}
  local MHA = {}
  MHA.__index = MHA

  local function new(_, cfg)
    local fname = "MultiheadAttention"
    if type(cfg) ~= "table" then error(fname .. ": expected a table of named arguments, got " .. type(cfg), 2) end
    local hidden, h = cfg.hidden_size, cfg.num_attention_heads
    check_int(fname, "hidden_size", hidden)
    check_int(fname, "num_attention_heads", h)
    local d = cfg.kv_channels
    if d == nil then
      if hidden % h ~= 0 then
        error(string.format("%s: hidden_size (%d) must be divisible by num_attention_heads (%d) unless kv_channels is given",
          fname, hidden, h), 2)
      end
      d = hidden / h
    end
    check_int(fname, "kv_channels", d)
    local ng = cfg.num_gqa_groups or h
    check_int(fname, "num_gqa_groups", ng)
    if h % ng ~= 0 then
      error(string.format("%s: num_attention_heads (%d) must be divisible by num_gqa_groups (%d)", fname, h, ng), 2)
    end
    local at = cfg.attention_type or "self"
    if at ~= "self" and at ~= "cross" then
      error(fname .. ": attention_type: expected 'self' or 'cross', got " .. tostring(at), 2)
    end
    local fmt = cfg.qkv_format or "sbhd"
    if fmt ~= "sbhd" and fmt ~= "bshd" and fmt ~= "thd" then
      error(fname .. ": qkv_format: expected 'sbhd', 'bshd' or 'thd', got " .. tostring(fmt), 2)
    end
    if cfg.fp8_recipe ~= nil and cfg.fp8_recipe ~= false then
      local fp8 = require "attnlab.fp8"
      if not fp8.is_recipe(cfg.fp8_recipe) then
        error(fname .. ": fp8_recipe: expected an al.fp8 recipe (al.fp8.DelayedScaling{...}, ...), got " ..
          type(cfg.fp8_recipe), 2)
      end
    end
    local norm = cfg.normalization or "LayerNorm"
    if norm ~= "LayerNorm" and norm ~= "RMSNorm" then
      error(fname .. ": normalization: expected 'LayerNorm' or 'RMSNorm', got " .. tostring(norm), 2)
    end
    local popts = { params_dtype = cfg.params_dtype or "f32", device = cfg.device or "cpu", bias = cfg.bias ~= false }
    local self = setmetatable({
      hidden_size = hidden, num_attention_heads = h, kv_channels = d, num_gqa_groups = ng, attention_type = at,
      qkv_format = fmt, qkv_weight_interleaved = cfg.qkv_weight_interleaved ~= false,
      input_layernorm = cfg.input_layernorm or false, normalization = norm,
      layer_number = cfg.layer_number or 1, pass_through = true, qk_norm_before_rope = cfg.qk_norm_before_rope or false,
      params_dtype = popts.params_dtype, device = popts.device,
    }, MHA)
    -- submodules in TE's order of creation (deterministic initialisation from the seed)
    if self.input_layernorm then
      self.layernorm = al.nn[norm]({ normalized_shape = hidden, eps = cfg.layernorm_epsilon or 1e-5,
        params_dtype = popts.params_dtype, device = popts.device })
    end
    if at == "self" then
      self.qkv = al.nn.Linear{ in_features = hidden, out_features = (h + 2 * ng) * d, bias = popts.bias,
        params_dtype = popts.params_dtype, device = popts.device }
    else
      self.query_layer = al.nn.Linear{ in_features = hidden, out_features = h * d, bias = popts.bias,
        params_dtype = popts.params_dtype, device = popts.device }
      self.key_value = al.nn.Linear{ in_features = hidden, out_features = 2 * ng * d, bias = popts.bias,
        params_dtype = popts.params_dtype, device = popts.device }
    end
    local qn = cfg.qk_norm_type
    if qn == nil then qn = cfg.qk_norm end
    if qn then
      local c = { eps = cfg.qk_norm_eps or 1e-6, params_dtype = popts.params_dtype, device = popts.device }
      self.q_norm = al.nn.QKNorm(qn, d, c)
      self.k_norm = al.nn.QKNorm(qn, d, c)
      self.qk_norm_type = qn == true and "RMSNorm" or qn
    end
    if cfg.rotary then
      local r = type(cfg.rotary) == "table" and cfg.rotary or {}
      self.rotary_emb = al.nn.RotaryEmbedding{ dim = r.dim or d, rotary_base = r.rotary_base, interleaved = r.interleaved }
    end
    self.core_attention = al.DotProductAttention{ num_attention_heads = h, kv_channels = d, num_gqa_groups = ng,
      attention_dropout = cfg.attention_dropout == nil and 0.1 or cfg.attention_dropout, qkv_format = fmt,
      attn_mask_type = cfg.attn_mask_type or "causal", window_size = cfg.window_size, softmax_type = cfg.softmax_type,
      backend = cfg.backend, softmax_scale = cfg.softmax_scale, compute_dtype = cfg.compute_dtype,
      fp8_recipe = cfg.fp8_recipe,    -- FP8 for the attention core only (fp8_dpa, not fp8_mha)
      cp_group = cfg.cp_group, cp_global_ranks = cfg.cp_global_ranks, cp_stream = cfg.cp_stream,
      cp_comm_type = cfg.cp_comm_type }
    self.fp8_recipe = cfg.fp8_recipe
    self.proj = al.nn.Linear{ in_features = h * d, out_features = hidden, bias = popts.bias,
      params_dtype = popts.params_dtype, device = popts.device }
    self.train = true
    return self
  end

  -------------------------------------------------------------------------------------------------
  -- slicing the projection output
  -------------------------------------------------------------------------------------------------
  -- Views of a self-attention projection output (or of its gradient, same shape):
  --   q (for GQA with interleaved weights: [.., hg, h/hg, d], else [.., h, d]), k, v [.., hg, d],
  --   kv (the packed KV part) and its interleave dim.
  function MHA:_views_self(mixed)
    local lead = lead_of(mixed)
    local h, ng, d = self.num_attention_heads, self.num_gqa_groups, self.kv_channels
    local r = {}
    if self.qkv_weight_interleaved then
      local npg = h / ng
      local g = mixed:view(size_with(lead, ng, npg + 2, d))
      if npg == 1 then r.q = g:select(-2, 1) else r.q = g:narrow(-2, 1, npg) end
      r.k, r.v = g:select(-2, npg + 1), g:select(-2, npg + 2)
      r.kv, r.kv_dim = g:narrow(-2, npg + 1, 2), -2
    else
      r.q = mixed:narrow(-1, 1, h * d):view(size_with(lead, h, d))
      local kvm = mixed:narrow(-1, h * d + 1, 2 * ng * d):view(size_with(lead, 2, ng, d))
      r.k, r.v = kvm:select(-3, 1), kvm:select(-3, 2)
      r.kv, r.kv_dim = kvm, -3
    end
    return r
  end

  function MHA:_views_kv(kvm)
    local lead = lead_of(kvm)
    local ng, d = self.num_gqa_groups, self.kv_channels
    if self.qkv_weight_interleaved then
      local g = kvm:view(size_with(lead, ng, 2, d))
      return { k = g:select(-2, 1), v = g:select(-2, 2), kv = g, kv_dim = -2 }
    end
    local g = kvm:view(size_with(lead, 2, ng, d))
    return { k = g:select(-3, 1), v = g:select(-3, 2), kv = g, kv_dim = -3 }
  end

  -- q as DPA wants it ([.., h, d]); a copy only for GQA with interleaved weights (as TE's reshape)
  function MHA:_q_heads(qv, lead)
    if qv:dim() == #lead + 3 then return qv:reshape(size_with(lead, self.num_attention_heads, self.kv_channels)) end
    return qv
  end

  -------------------------------------------------------------------------------------------------
  -- per-tensor work: QK-norm and RoPE as a chain of modules (backward walks it in reverse)
  -------------------------------------------------------------------------------------------------
  local function run_chain(chain, x)
    local ins = {}
    for i, st in ipairs(chain) do
      ins[i] = x
      x = st.mod:forward(x, st.opts)
    end
    return x, ins
  end
  local function back_chain(chain, ins, g)
    for i = #chain, 1, -1 do g = chain[i].mod:backward(ins[i], g, chain[i].opts) end
    return g
  end

  -- token positions for RoPE: flat list + shape over the token dims of a [.., h, d] tensor in `fmt`
  -- (bshd [b, s], sbhd [s, b], thd [t]); offsets[i] shifts sequence i (a KV cache's cached length).
  local function positions(fmt, lead, cu, offsets)
    local flat = {}
    if fmt == "thd" then
      local t = lead[1]
      if cu then
        for i = 1, #cu - 1 do
          local off = offsets and offsets[i] or 0
          for j = cu[i], cu[i + 1] - 1 do flat[j + 1] = off + j - cu[i] end
        end
        for j = 1, t do flat[j] = flat[j] or 0 end
      else
        for j = 1, t do flat[j] = j - 1 end
      end
      return { flat = flat, shape = { t } }
    end
    local b = fmt == "bshd" and lead[1] or lead[2]
    local s = fmt == "bshd" and lead[2] or lead[1]
    if not offsets then
      for j = 1, s do flat[j] = j - 1 end
      return { flat = flat, shape = fmt == "bshd" and { 1, s } or { s, 1 } }
    end
    for bi = 1, b do
      for j = 1, s do
        local v = offsets[bi] + j - 1
        if fmt == "bshd" then flat[(bi - 1) * s + j] = v else flat[(j - 1) * b + bi] = v end
      end
    end
    return { flat = flat, shape = fmt == "bshd" and { b, s } or { s, b } }
  end

  local function cu_list(cu)
    if cu == nil then return nil end
    local v = cu:flat_values()
    return v
  end

  function MHA:_chain(which, pos)
    local chain = {}
    local norm = which == "q" and self.q_norm or self.k_norm
    if norm and self.qk_norm_before_rope then chain[#chain + 1] = { mod = norm } end
    if self.rotary_emb then chain[#chain + 1] = { mod = self.rotary_emb, opts = { positions = pos } } end
    if norm and not self.qk_norm_before_rope then chain[#chain + 1] = { mod = norm } end
    return chain
  end

  -------------------------------------------------------------------------------------------------
  -- forward / backward
  -------------------------------------------------------------------------------------------------
  local function parse_input(fname, input)
    if T.is_tensor(input) then return { hidden_states = input } end
    if type(input) ~= "table" then error(fname .. ": expected a tensor or a table {hidden_states=, ...}, got " .. type(input), 3) end
    local x = input.hidden_states or input[1]
    if not T.is_tensor(x) then error(fname .. ": hidden_states: expected a tensor, got " .. type(x), 3) end
    return input, x
  end

  function MHA:_check_hidden(fname, x, name, level)
    local want = self.qkv_format == "thd" and 2 or 3
    if x:dim() ~= want or x:size(-1) ~= self.hidden_size then
      error(string.format("%s: %s: expected a %dD tensor [%s, %d] for qkv_format=%s, got [%s]", fname, name, want,
        self.qkv_format == "thd" and "t" or (self.qkv_format == "bshd" and "b, s" or "s, b"), self.hidden_size,
        self.qkv_format, table.concat(x:size(), ",")), level or 3)
    end
  end

  -------------------------------------------------------------------------------------------------
  -- context parallelism: per-token work per rank's shard, the core attention through al.cp
  -------------------------------------------------------------------------------------------------
  -- mha:set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type = "p2p"): TE's
  -- method, handed to the core DotProductAttention (cp_group nil: off). Returns the module.
  function MHA:set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
    self.core_attention:_set_cp("MultiheadAttention:set_context_parallel_group", 3, cp_group, cp_global_ranks,
      cp_stream, cp_comm_type)
    return self
  end

  -- RoPE positions of rank rr's (0-based) shard: local row j of a chunk slot holds global position
  -- chunk_id * c + j % c (thd: per sequence, from the global padded offsets cup)
  local function cp_positions(al_, fmt, lead, cp, lb, rr, cup)
    local ids = al_.cp.chunk_ids(cp, lb, rr)
    local nc = lb == "contiguous" and cp or 2 * cp
    local flat = {}
    if fmt == "thd" then
      local t = lead[1]
      for j = 1, t do flat[j] = 0 end
      for i = 1, #cup - 1 do
        local P = cup[i + 1] - cup[i]
        local c, off = P / nc, cup[i] / cp
        for j = 0, P / cp - 1 do flat[off + j + 1] = ids[math.floor(j / c) + 1] * c + j % c end
      end
      return { flat = flat, shape = { t } }
    end
    local sl = fmt == "bshd" and lead[2] or lead[1]
    local c = sl / #ids
    for j = 0, sl - 1 do flat[j + 1] = ids[math.floor(j / c) + 1] * c + j % c end
    return { flat = flat, shape = fmt == "bshd" and { 1, sl } or { sl, 1 } }
  end

  function MHA:_cp_forward(fname, input)
    local g = self.core_attention.cp_group
    local ranks = g.local_ranks
    local a, x
    if T.is_tensor(input) then a, x = {}, input
    elseif type(input) == "table" then
      if input.hidden_states ~= nil then a, x = input, input.hidden_states
      elseif T.is_tensor(input[1]) and T.is_tensor(input[2]) then a, x = {}, input -- a bare per-rank list
      else a, x = input, input[1] end
    else
      error(fname .. ": expected a tensor, a per-rank list or a table {hidden_states=, ...}, got " .. type(input), 3)
    end
    if self.attention_type ~= "self" then
      error(fname .. ": attention_type = 'cross' with context parallelism is not supported by MultiheadAttention " ..
        "(DotProductAttention with cp_group takes sharded queries, keys and values)", 3)
    end
    if a.inference_params ~= nil then
      error(fname .. ": inference_params: a KV cache is not supported with context parallelism", 3)
    end
    local xs, mode
    if T.is_tensor(x) then
      if #ranks ~= 1 then
        error(string.format("%s: hidden_states: cp_group drives %d ranks in this process (%s): expected a list of %d " ..
          "tensors by rank + 1, got a tensor", fname, #ranks, tostring(g), #ranks), 3)
      end
      xs, mode = { [ranks[1]] = x }, "tensor"
    elseif type(x) == "table" then
      if #ranks == g.size and #x ~= g.size then
        error(string.format("%s: hidden_states: expected a list of %d tensors (one per rank of cp_group), got %d", fname,
          g.size, #x), 3)
      end
      xs, mode = x, "list"
    else
      error(fname .. ": hidden_states: expected a tensor or a list of tensors by rank + 1, got " .. type(x), 3)
    end
    local wdev = self.proj.weight:device()
    for _, r in ipairs(ranks) do
      local xr = xs[r]
      if not T.is_tensor(xr) then
        error(string.format("%s: hidden_states[%d]: expected a tensor for rank %d, got %s", fname, r, r - 1, type(xr)), 3)
      end
      self:_check_hidden(fname, xr, mode == "list" and ("hidden_states[" .. r .. "]") or "hidden_states", 4)
      if xr:device() ~= wdev then
        error(string.format("%s: hidden_states[%d] is on %s, the module's parameters on %s (one module serves one " ..
          "device: run one process per GPU, scripts/attnlab-launch)", fname, r, xr:device(), wdev), 3)
      end
    end
    local fmt, lb = self.qkv_format, a.load_balance or "dual_chunk_swap"
    local cup
    if self.rotary_emb and fmt == "thd" then
      local c = a.cu_seqlens_q_padded
      if c == nil then error(fname .. ": RoPE with qkv_format=thd and context parallelism needs cu_seqlens_q_padded (the global padded offsets)", 3) end
      cup = T.is_tensor(c) and c:flat_values() or c
    end
    local st = { input = input, cp = true, mode = mode, group = g, ranks = {} }
    local Q, K, V = {}, {}, {}
    for _, r in ipairs(ranks) do
      local xr = xs[r]
      local ln = self.layernorm and self.layernorm:forward(xr) or xr
      local mixed = self.qkv:forward(ln)
      local vw = self:_views_self(mixed)
      local lead = lead_of(ln)
      local pos = self.rotary_emb and cp_positions(al, fmt, lead, g.size, lb, r - 1, cup)
      local qchain, kchain = self:_chain("q", pos), self:_chain("k", pos)
      local q2, qins = run_chain(qchain, self:_q_heads(vw.q, lead))
      local k2, kins = run_chain(kchain, vw.k)
      st.ranks[r] = { x = xr, ln = ln, mixed = mixed, qchain = qchain, qins = qins, kchain = kchain, kins = kins }
      -- keys and values left as views of the projection output are copied: al.cp cuts them into blocks, and
      -- views of one buffer would go to al.attention as undeclared packed inputs (a deprecation warning)
      Q[r], K[r], V[r] = q2, #kchain == 0 and vw.k:contiguous() or k2, vw.v:contiguous()
    end
    local dargs = {}
    for _, k in ipairs(DPA_ARGS) do dargs[k] = a[k] end
    dargs.load_balance, dargs.overlap, dargs.deterministic = a.load_balance, a.overlap, a.deterministic
    local one = ranks[1]
    if mode == "tensor" then
      dargs.query_layer, dargs.key_layer, dargs.value_layer = Q[one], K[one], V[one]
    else
      dargs.query_layer, dargs.key_layer, dargs.value_layer = Q, K, V
    end
    self.core_attention.train = self.train
    local ctx = self.core_attention:forward(dargs)
    local ctxs = mode == "tensor" and { [one] = ctx } or ctx
    local ys = {}
    for _, r in ipairs(ranks) do ys[r] = self.proj:forward(ctxs[r]) end
    st.dargs, st.ctxs = dargs, ctxs
    self.context = ctx
    local y = mode == "tensor" and ys[one] or ys
    self.output, self.state = y, st
    return y
  end

  function MHA:_cp_backward(fname, st, dy)
    local ranks = st.group.local_ranks
    local dys
    if st.mode == "tensor" then
      if not T.is_tensor(dy) then error(fname .. ": grad_output: expected a tensor, got " .. type(dy), 3) end
      dys = { [ranks[1]] = dy }
    else
      if type(dy) ~= "table" or T.is_tensor(dy) then
        error(fname .. ": grad_output: the forward took per-rank lists: expected a list of tensors by rank + 1, got " ..
          (T.is_tensor(dy) and "a tensor" or type(dy)), 3)
      end
      if #ranks == st.group.size and #dy ~= st.group.size then
        error(string.format("%s: grad_output: expected a list of %d tensors (one per rank of cp_group), got %d", fname,
          st.group.size, #dy), 3)
      end
      dys = dy
    end
    local dctx = {}
    for _, r in ipairs(ranks) do
      if not T.is_tensor(dys[r]) then
        error(string.format("%s: grad_output[%d]: expected a tensor for rank %d, got %s", fname, r, r - 1, type(dys[r])), 3)
      end
      dctx[r] = self.proj:backward(st.ctxs[r], dys[r])
    end
    local grads = self.core_attention:backward(st.dargs, st.mode == "tensor" and dctx[ranks[1]] or dctx)
    self.attention_gradients = grads
    local dxs = {}
    for _, r in ipairs(ranks) do
      local p = st.ranks[r]
      local gq, gk, gv = grads.query_layer, grads.key_layer, grads.value_layer
      if st.mode ~= "tensor" then gq, gk, gv = gq[r], gk[r], gv[r] end
      local dmixed = al.zeros_like(p.mixed)
      local dv = self:_views_self(dmixed)
      dv.q:copy_(back_chain(p.qchain, p.qins, gq):reshape(dv.q:size()))
      dv.k:copy_(back_chain(p.kchain, p.kins, gk))
      dv.v:copy_(gv)
      local dln = self.qkv:backward(p.ln, dmixed)
      dxs[r] = self.layernorm and self.layernorm:backward(p.x, dln) or dln
    end
    local dx = st.mode == "tensor" and dxs[ranks[1]] or dxs
    self.gradInput = dx
    return dx
  end

  function MHA:forward(input)
    local fname = "MultiheadAttention:forward"
    if self.core_attention.cp_group ~= nil then
      local y = self:_cp_forward(fname, input) -- (not a tail call: the error levels count this frame)
      return y
    end
    local a = parse_input(fname, input)
    local x = a.hidden_states or a[1]
    self:_check_hidden(fname, x, "hidden_states")
    local ip = a.inference_params
    local fmt = self.qkv_format
    local st = { x = x, input = input }
    local ln = x
    if self.layernorm then ln = self.layernorm:forward(x) end
    st.ln = ln

    local dargs = {}
    for _, k in ipairs(DPA_ARGS) do dargs[k] = a[k] end
    local eligible = self.pass_through and not self.rotary_emb and not self.q_norm and ip == nil
    local lead = lead_of(ln)
    local q, k, v, kvpack, kvdim
    if self.attention_type == "self" then
      local mixed = self.qkv:forward(ln)
      st.mixed = mixed
      if eligible and self.num_gqa_groups == self.num_attention_heads then
        -- the pass-through: one declared packed buffer, no copy, no detection
        local h, d = self.num_attention_heads, self.kv_channels
        if self.qkv_weight_interleaved then
          dargs.qkv_layer, dargs.qkv_interleave_dim = mixed:view(size_with(lead, h, 3, d)), -2
        else
          dargs.qkv_layer, dargs.qkv_interleave_dim = mixed:view(size_with(lead, 3, h, d)), -3
        end
        st.mode = "qkv"
      else
        local vw = self:_views_self(mixed)
        st.views = true
        q, k, v, kvpack, kvdim = self:_q_heads(vw.q, lead), vw.k, vw.v, vw.kv, vw.kv_dim
      end
    else
      local enc = a.encoder_output
      if not T.is_tensor(enc) then error(fname .. ": encoder_output: expected a tensor (attention_type = 'cross'), got " .. type(enc), 2) end
      self:_check_hidden(fname, enc, "encoder_output")
      if ip ~= nil then error(fname .. ": inference_params: a KV cache with attention_type = 'cross' is not supported", 2) end
      st.enc = enc
      local qm = self.query_layer:forward(ln)
      local kvm = self.key_value:forward(enc)
      st.qm, st.kvm = qm, kvm
      q = qm:view(size_with(lead, self.num_attention_heads, self.kv_channels))
      local vw = self:_views_kv(kvm)
      k, v, kvpack, kvdim = vw.k, vw.v, vw.kv, vw.kv_dim
      if eligible then
        dargs.query_layer, dargs.kv_layer, dargs.qkv_interleave_dim = q, kvpack, kvdim
        st.mode = "q_kv"
      end
    end

    if st.mode == nil then
      -- the sliced path: per-tensor work on views
      local offsets = ip and ip:get_seqlens_pre_step() or nil
      local cu_q = ip and ip.cu_seqlens_q_list or cu_list(a.cu_seqlens_q_padded or a.cu_seqlens_q)
      local cu_kv = ip and cu_q or cu_list(a.cu_seqlens_kv_padded or a.cu_seqlens_kv)
      if self.qkv_format == "thd" and self.rotary_emb and not cu_q then
        error(fname .. ": RoPE with qkv_format=thd needs cu_seqlens_q (or inference_params)", 2)
      end
      local qchain = self:_chain("q", self.rotary_emb and positions(fmt, lead, cu_q, offsets))
      local klead = k:size()
      klead[#klead], klead[#klead - 1] = nil, nil
      local kchain = self:_chain("k", self.rotary_emb and positions(fmt, klead, cu_kv, offsets))
      local q2, qins = run_chain(qchain, q)
      local k2, kins = run_chain(kchain, k)
      st.qchain, st.qins, st.kchain, st.kins = qchain, qins, kchain, kins
      if ip ~= nil then
        st.inference = true
        local out = ip:attention(self.layer_number, q2, k2, v, dargs, self.core_attention:_defaults())
        self.context = out
        local y = self.proj:forward(out)
        self.output, self.state = y, st
        return y
      end
      if #kchain == 0 then
        dargs.query_layer, dargs.kv_layer, dargs.qkv_interleave_dim = q2, kvpack, kvdim
        st.mode = "sliced_kv"
      else
        dargs.query_layer, dargs.key_layer, dargs.value_layer = q2, k2, v
        st.mode = "sliced"
      end
    end
    st.dargs = dargs
    self.core_attention.train = self.train
    local ctx = self.core_attention:forward(dargs)
    st.ctx = ctx
    self.context = ctx
    local y = self.proj:forward(ctx)
    self.output, self.state = y, st
    return y
  end
  MHA.updateOutput = MHA.forward

  -- Returns dL/d hidden_states (and dL/d encoder_output for cross-attention); accumulates the
  -- gradients of every parameter.
  function MHA:backward(input, dy)
    local fname = "MultiheadAttention:backward"
    local st = self.state
    if not st then error(fname .. ": call forward first", 2) end
    if input ~= st.input then error(fname .. ": input differs from the forward's input", 2) end
    if st.cp then
      local dx = self:_cp_backward(fname, st, dy) -- (not a tail call: the error levels count this frame)
      return dx
    end
    if st.inference then error(fname .. ": the forward ran with inference_params (a KV cache): inference only", 2) end
    if not T.is_tensor(dy) then error(fname .. ": grad_output: expected a tensor, got " .. type(dy), 2) end
    local dctx = self.proj:backward(st.ctx, dy)
    local grads = self.core_attention:backward(st.dargs, dctx)
    self.attention_gradients = grads
    local dln, denc
    if self.attention_type == "self" then
      local dmixed
      if st.mode == "qkv" then
        dmixed = grads.qkv_layer:view(st.mixed:size())        -- the packed gradient itself
      else
        dmixed = al.zeros_like(st.mixed)
        local dv = self:_views_self(dmixed)
        local dq = back_chain(st.qchain, st.qins, grads.query_layer)
        dv.q:copy_(dq:view(dv.q:size()))
        if st.mode == "sliced_kv" then
          dv.kv:copy_(grads.kv_layer)
        else
          dv.k:copy_(back_chain(st.kchain, st.kins, grads.key_layer))
          dv.v:copy_(grads.value_layer)
        end
      end
      self.grad_projection = dmixed
      dln = self.qkv:backward(st.ln, dmixed)
    else
      local dqm, dkvm
      if st.mode == "q_kv" then
        dqm = grads.query_layer:view(st.qm:size())
        dkvm = grads.kv_layer:view(st.kvm:size())
      else
        local dq = back_chain(st.qchain, st.qins, grads.query_layer)
        dqm = dq:reshape(st.qm:size())
        dkvm = al.zeros_like(st.kvm)
        local dv = self:_views_kv(dkvm)
        if st.mode == "sliced_kv" then
          dv.kv:copy_(grads.kv_layer)
        else
          dv.k:copy_(back_chain(st.kchain, st.kins, grads.key_layer))
          dv.v:copy_(grads.value_layer)
        end
      end
      self.grad_projection = dkvm
      dln = self.query_layer:backward(st.ln, dqm)
      denc = self.key_value:backward(st.enc, dkvm)
    end
    local dx = dln
    if self.layernorm then dx = self.layernorm:backward(st.x, dln) end
    self.gradInput = dx
    if denc then return dx, denc end
    return dx
  end

  function MHA:_modules()
    local list = {}
    local function add(m) if m then list[#list + 1] = m end end
    add(self.layernorm); add(self.qkv); add(self.query_layer); add(self.key_value)
    add(self.q_norm); add(self.k_norm); add(self.core_attention); add(self.proj)
    return list
  end

  function MHA:parameters()
    local ps, gs = {}, {}
    for _, m in ipairs(self:_modules()) do
      local p, g = m:parameters()
      for i = 1, #p do ps[#ps + 1] = p[i]; gs[#gs + 1] = g[i] end
    end
    return ps, gs
  end
  function MHA:zero_grad()
    for _, m in ipairs(self:_modules()) do
      if m.zero_grad then m:zero_grad() else m:zeroGradParameters() end
    end
  end
  MHA.zeroGradParameters = MHA.zero_grad
  function MHA:training() self.train = true return self end
  function MHA:evaluate() self.train = false return self end
  function MHA:__tostring()
    return string.format("al.nn.MultiheadAttention(hidden=%d, h=%d, hg=%d, d=%d, %s, %s%s%s%s)", self.hidden_size,
      self.num_attention_heads, self.num_gqa_groups, self.kv_channels, self.attention_type, self.qkv_format,
      self.qkv_weight_interleaved and ", interleaved" or "", self.rotary_emb and ", rope" or "",
      self.q_norm and (", qk_norm=" .. self.qk_norm_type) or "")
  end

  al.nn.MultiheadAttention = setmetatable({ methods = MHA }, { __call = new })
end

return M
