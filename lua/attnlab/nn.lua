--[[
attnlab.nn — Torch7-style modules. al.DotProductAttention mirrors TransformerEngine's constructor
(te_dpa_semantics.md §3.1: names, defaults, checks) on top of al.attention.forward/backward.

  local dpa = al.DotProductAttention{num_attention_heads = 16, kv_channels = 64, qkv_format = "bshd",
                                     attn_mask_type = "causal"}
  local out = dpa:forward{qkv_layer = qkv, qkv_interleave_dim = -3}      -- (out, max_logit) with return_max_logit
  local grads = dpa:backward({qkv_layer = qkv, qkv_interleave_dim = -3}, dout)  -- also in dpa.gradients
  local params, grad_params = dpa:parameters()    -- the learnable softmax offset [h] (zeros, as TE)

Per-call arguments (attn_mask_type, window_size, qkv_format, ...) override the module's settings, as
in TE's forward. score_mod / mask_mod / block_mask (attention variants, docs/VARIANTS.md) are module
arguments and per-call arguments alike (false in a call switches the module's off); the gradients of
captured al.attention.param tensors come back in dpa.gradients.captures. Dropout applies in training mode only (dpa:training() / dpa:evaluate(); training is
the default, as torch.nn). Gradients of the learnable offset accumulate into dpa.grad_softmax_offset
until dpa:zeroGradParameters().
With inference_params (an al.nn.InferenceParams KV cache) the forward takes the path of
al.inference.forward with the module's settings (layer_number, default 1; packed inputs refused as in
TE) and is inference only.
Context parallelism (TE's arguments, docs/CONTEXT_PARALLEL.md): cp_group (an al.cp.SimGroup / NcclGroup),
cp_global_ranks, cp_stream, cp_comm_type ("p2p" | "all_gather" | "a2a") in the constructor or
dpa:set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type) (cp_group = nil: off).
With CP the forward runs al.cp.attention_forward on this process's shards: a group with several local
ranks (SimGroup, one-process NcclGroup) takes per-rank lists of query/key/value_layer (by rank + 1) and
returns per-rank outputs; a group with one local rank (scripts/attnlab-launch) takes and returns tensors.
The backward mirrors it (grads.query_layer etc. are per-rank lists or tensors).
]]
local M = {}

local T = require "attnlab.tensor"
local type, rawget, rawequal = type, rawget, rawequal -- (upvalues: fewer constants in the forward's trace)

local function check_int(fname, name, v, min)
  if type(v) ~= "number" or v % 1 ~= 0 or v < (min or 1) then
    error(string.format("%s: %s: expected an integer >= %d, got %s", fname, name, min or 1, tostring(v)), 4)
  end
end

function M.install(al)
  local DPA = {}
  DPA.__index = DPA

  local function new(_, cfg)
    local fname = "DotProductAttention"
    if type(cfg) ~= "table" then error(fname .. ": expected a table of named arguments, got " .. type(cfg), 2) end
    local h = cfg.num_attention_heads
    check_int(fname, "num_attention_heads", h)
    local kvc = cfg.kv_channels
    local dqk, dv
    if type(kvc) == "table" then dqk, dv = kvc[1], kvc[2] else dqk, dv = kvc, kvc end
    check_int(fname, "kv_channels", dqk)
    check_int(fname, "kv_channels (d_v)", dv)
    local ng = cfg.num_gqa_groups or h
    check_int(fname, "num_gqa_groups", ng)
    if h % ng ~= 0 then
      error(string.format("%s: num_attention_heads (%d) must be divisible by num_gqa_groups (%d)", fname, h, ng), 2)
    end
    local p = cfg.attention_dropout or 0
    if type(p) ~= "number" or p < 0 or p >= 1 then
      error(fname .. ": attention_dropout: expected a number in [0, 1), got " .. tostring(p), 2)
    end
    local st = cfg.softmax_type or "vanilla"
    if st ~= "vanilla" and st ~= "off-by-one" and st ~= "learnable" then
      error(fname .. ": softmax_type: expected 'vanilla', 'off-by-one' or 'learnable', got " .. tostring(st), 2)
    end
    local self = setmetatable({
      num_attention_heads = h, num_gqa_groups = ng, kv_channels = { dqk, dv },
      hidden_size_per_attention_head = dqk,
      attention_dropout = p, qkv_format = cfg.qkv_format or "sbhd", attn_mask_type = cfg.attn_mask_type or "causal",
      window_size = cfg.window_size, bottom_right_diagonal = cfg.bottom_right_diagonal,
      softmax_scale = cfg.softmax_scale or 1 / math.sqrt(dqk), softmax_type = st,
      return_max_logit = cfg.return_max_logit or false, backend = cfg.backend, compute_dtype = cfg.compute_dtype,
      fp8_recipe = cfg.fp8_recipe, train = true,
      score_mod = cfg.score_mod, mask_mod = cfg.mask_mod, block_mask = cfg.block_mask,
    }, DPA)
    if cfg.score_mod ~= nil and type(cfg.score_mod) ~= "function" then
      error(fname .. ": score_mod: expected a function(score, b, h, q_idx, kv_idx), got " .. type(cfg.score_mod), 2)
    end
    if cfg.mask_mod ~= nil and type(cfg.mask_mod) ~= "function" then
      error(fname .. ": mask_mod: expected a function(b, h, q_idx, kv_idx), got " .. type(cfg.mask_mod), 2)
    end
    self.cp_comm_type = cfg.cp_comm_type or "p2p"
    if cfg.cp_group ~= nil then
      self:_set_cp(fname, 3, cfg.cp_group, cfg.cp_global_ranks, cfg.cp_stream, cfg.cp_comm_type)
    end
    if st ~= "vanilla" then
      -- TE: a zeros buffer (off-by-one) or an nn.Parameter initialised to zeros (learnable), shape [h]
      self.softmax_offset = al.zeros({ h }, { dtype = "f32" })
      if st == "learnable" then self.grad_softmax_offset = al.zeros({ h }, { dtype = "f32" }) end
    end
    return self
  end

  -- the module's settings as defaults for al.attention
  -- (one table per module, brought up to date on every call from the current fields: settings changed
  -- between calls are always seen, and a forward allocates no defaults table. A field is written only
  -- when it changed (rawequal: a value's own __eq is never consulted): writing nil to an absent key
  -- costs a table insertion on every call in a trace; bench/host_path_instr.sh)
  function DPA:_defaults()
    local d = rawget(self, "_dflt")
    if d == nil then d = {}; rawset(self, "_dflt", d) end
    local v
    v = self.qkv_format if not rawequal(d.qkv_format, v) then d.qkv_format = v end
    v = self.attn_mask_type if not rawequal(d.attn_mask_type, v) then d.attn_mask_type = v end
    v = self.window_size if not rawequal(d.window_size, v) then d.window_size = v end
    v = self.bottom_right_diagonal if not rawequal(d.bottom_right_diagonal, v) then d.bottom_right_diagonal = v end
    v = self.softmax_scale if not rawequal(d.softmax_scale, v) then d.softmax_scale = v end
    v = self.softmax_type if not rawequal(d.softmax_type, v) then d.softmax_type = v end
    v = self.softmax_offset if not rawequal(d.softmax_offset, v) then d.softmax_offset = v end
    v = self.train and self.attention_dropout or 0 if not rawequal(d.attention_dropout, v) then d.attention_dropout = v end
    v = self.return_max_logit if not rawequal(d.return_max_logit, v) then d.return_max_logit = v end
    v = self.backend if not rawequal(d.backend, v) then d.backend = v end
    v = self.compute_dtype if not rawequal(d.compute_dtype, v) then d.compute_dtype = v end
    v = self.num_attention_heads if not rawequal(d.num_attention_heads, v) then d.num_attention_heads = v end
    v = self.num_gqa_groups if not rawequal(d.num_gqa_groups, v) then d.num_gqa_groups = v end
    v = self.kv_channels if not rawequal(d.kv_channels, v) then d.kv_channels = v end
    v = self.fp8_recipe if not rawequal(d.fp8_recipe, v) then d.fp8_recipe = v end
    v = self.score_mod if not rawequal(d.score_mod, v) then d.score_mod = v end
    v = self.mask_mod if not rawequal(d.mask_mod, v) then d.mask_mod = v end
    v = self.block_mask if not rawequal(d.block_mask, v) then d.block_mask = v end
    return d
  end

  -------------------------------------------------------------------------------------------------
  -- context parallelism (TE's set_context_parallel_group; the algorithms are al.cp's)
  -------------------------------------------------------------------------------------------------
  local CP_COMM = { p2p = true, all_gather = true, a2a = true }

  function DPA:_set_cp(fname, level, group, ranks, stream, comm)
    comm = comm or "p2p"
    if group == nil then
      self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = nil, nil, nil, comm
      return self
    end
    if type(group) ~= "table" or type(group.size) ~= "number" or type(group.sendrecv) ~= "function" or
      type(group.local_ranks) ~= "table" then
      error(fname .. ": cp_group: expected an al.cp.SimGroup or al.cp.NcclGroup (nil switches context parallelism " ..
        "off), got " .. tostring(group), level)
    end
    if not CP_COMM[comm] then
      error(fname .. ": cp_comm_type: expected 'p2p', 'all_gather' or 'a2a', got " .. tostring(comm) ..
        (comm == "a2a+p2p" and " (hierarchical a2a+p2p is not implemented)" or ""), level)
    end
    if ranks == nil then
      ranks = {}
      for i = 1, group.size do ranks[i] = i - 1 end
    else
      local ok = type(ranks) == "table" and #ranks == group.size
      local seen = {}
      for i = 1, ok and #ranks or 0 do
        local x = ranks[i]
        if type(x) ~= "number" or x < 0 or x % 1 ~= 0 or seen[x] then ok = false break end
        seen[x] = true
      end
      if not ok then
        error(string.format("%s: cp_global_ranks: expected a list of %d distinct global ranks (cp_group's size), got %s",
          fname, group.size, type(ranks) == "table" and ("a list of " .. #ranks) or type(ranks)), level)
      end
    end
    if stream ~= nil and type(stream) ~= "table" then
      error(fname .. ": cp_stream: expected an al.cuda.Stream or a list of them by rank + 1, got " .. type(stream), level)
    end
    self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = group, ranks, stream, comm
    return self
  end

  -- dpa:set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type = "p2p"): TE's method.
  -- cp_group nil switches context parallelism off (the plain path again). Returns the module.
  function DPA:set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
    self:_set_cp("DotProductAttention:set_context_parallel_group", 3, cp_group, cp_global_ranks, cp_stream, cp_comm_type)
    return self -- (not a tail call: the error levels count this frame)
  end

  local function kind_of(x)
    if x == nil then return nil end
    if T.is_tensor(x) then return "tensor" end
    if type(x) == "table" then return "list" end
    return type(x)
  end

  -- a CP error from al.cp, re-raised under the module's name at the user's call
  local function cp_rethrow(fname, e, level)
    local msg = tostring(e):gsub("^[^%s]-%.lua:%d+: ", ""):gsub("^cp%.attention_[a-z]+: ", "")
    error(fname .. ": " .. msg, level + 1)
  end

  -- module settings handed to al.cp.attention_forward (a per-call argument overrides the module's)
  local CP_SETTINGS = { "qkv_format", "attn_mask_type", "window_size", "bottom_right_diagonal", "softmax_scale", "backend",
    "compute_dtype", "num_attention_heads", "num_gqa_groups", "softmax_type", "score_mod", "mask_mod", "block_mask" }
  -- per-call arguments handed over unchanged (al.cp refuses the unsupported ones with its message)
  local CP_CALL = { "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "max_seqlen_q",
    "max_seqlen_kv", "deterministic", "load_balance", "overlap", "attention_mask", "core_attention_bias_type",
    "core_attention_bias", "alibi_slopes", "qkv_layer", "kv_layer", "softmax_offset" }

  function DPA:_cp_forward(input)
    local fname = "DotProductAttention:forward"
    local g = self.cp_group
    local nloc, all_local = #g.local_ranks, #g.local_ranks == g.size
    local names = { "query_layer", "key_layer", "value_layer" }
    local mode
    for _, n in ipairs(names) do
      local kd = kind_of(input[n])
      if kd ~= nil and kd ~= "tensor" and kd ~= "list" then
        error(string.format("%s: %s: expected a tensor or a list of tensors by rank + 1, got %s", fname, n, kd), 3)
      end
      if kd ~= nil then
        if mode ~= nil and kd ~= mode then
          error(fname .. ": query_layer/key_layer/value_layer: mixing per-rank lists and tensors: give all three as " ..
            "lists by rank + 1 (one entry per rank of this process) or all three as tensors (a group with one local rank)", 3)
        end
        mode = kd
      end
    end
    local a = { group = g, cp_comm_type = self.cp_comm_type, cp_stream = self.cp_stream }
    if mode == "tensor" then
      if nloc ~= 1 then
        error(string.format("%s: query_layer: cp_group drives %d ranks in this process (%s): expected per-rank lists " ..
          "of %d tensors by rank + 1, got a tensor", fname, nloc, tostring(g), nloc), 3)
      end
      local r = g.local_ranks[1]
      for _, n in ipairs(names) do if input[n] ~= nil then a[n] = { [r] = input[n] } end end
    elseif mode == "list" then
      for _, n in ipairs(names) do
        local x = input[n]
        if x ~= nil and all_local and #x ~= g.size then
          error(string.format("%s: %s: expected a list of %d tensors (one per rank of cp_group), got %d", fname, n,
            g.size, #x), 3)
        end
        a[n] = x
      end
    end
    local d = self:_defaults()
    for _, n in ipairs(CP_SETTINGS) do
      local v = input[n]
      if v == nil then v = d[n] end
      if v then a[n] = v end -- (false: a per-call switch-off of score_mod / mask_mod / block_mask)
    end
    for _, n in ipairs(CP_CALL) do a[n] = input[n] end
    if d.attention_dropout ~= 0 then a.attention_dropout = d.attention_dropout end
    if d.fp8_recipe then a.fp8_recipe = d.fp8_recipe end
    if input.return_max_logit or self.return_max_logit then a.return_max_logit = true end
    -- head dims against kv_channels, as the plain path checks them
    local r1 = g.local_ranks[1]
    local q1, k1, v1 = a.query_layer and a.query_layer[r1], a.key_layer and a.key_layer[r1], a.value_layer and a.value_layer[r1]
    if T.is_tensor(q1) and T.is_tensor(k1) and T.is_tensor(v1) then
      local dqk, dv = self.kv_channels[1], self.kv_channels[2]
      if q1:size(-1) ~= dqk or k1:size(-1) ~= dqk then
        error(string.format("%s: query/key head dim must equal kv_channels d_qk = %d, got %d and %d", fname, dqk,
          q1:size(-1), k1:size(-1)), 3)
      end
      if v1:size(-1) ~= dv then
        error(string.format("%s: value head dim must equal kv_channels d_v = %d, got %d", fname, dv, v1:size(-1)), 3)
      end
    end
    local ok, outs, ctx = pcall(al.cp.attention_forward, a)
    if not ok then cp_rethrow(fname, outs, 3) end
    local out = outs
    if mode == "tensor" then out = outs[g.local_ranks[1]] end
    self.ctx = { cp = ctx, args = input, mode = mode, group = g }
    self.output = out
    return out
  end

  function DPA:_cp_backward(dout)
    local fname = "DotProductAttention:backward"
    local c = self.ctx
    local g = c.group
    local d
    if c.mode == "list" then
      if type(dout) ~= "table" or T.is_tensor(dout) then
        error(fname .. ": grad_output: the forward took per-rank lists: expected a list of tensors by rank + 1, got " ..
          (T.is_tensor(dout) and "a tensor" or type(dout)), 3)
      end
      if #g.local_ranks == g.size and #dout ~= g.size then
        error(string.format("%s: grad_output: expected a list of %d tensors (one per rank of cp_group), got %d", fname,
          g.size, #dout), 3)
      end
      d = dout
    else
      if not T.is_tensor(dout) then
        error(fname .. ": grad_output: the forward took tensors (one local rank): expected a tensor, got " .. type(dout), 3)
      end
      d = { [g.local_ranks[1]] = dout }
    end
    local ok, grads = pcall(al.cp.attention_backward, c.cp, d)
    if not ok then cp_rethrow(fname, grads, 3) end
    local res
    if c.mode == "list" then
      res = { query_layer = {}, key_layer = {}, value_layer = {} }
      for _, r in ipairs(g.local_ranks) do
        for n, t in pairs(grads[r]) do res[n][r] = t end
      end
    else
      res = grads[g.local_ranks[1]]
    end
    self.gradients = res
    self.gradInput = res
    return res
  end

  local forward_with = al.attention._forward_with
  function DPA:forward(input)
    if type(input) ~= "table" then error("DotProductAttention:forward: expected a table of inputs, got " .. type(input), 2) end
    if self.cp_group ~= nil then
      if input.inference_params ~= nil then
        error("DotProductAttention:forward: inference_params: a KV cache is not supported with context parallelism " ..
          "(set_context_parallel_group(nil) switches it off)", 2)
      end
      self.inference = nil
      local out = self:_cp_forward(input) -- (not a tail call: the error levels count this frame)
      return out
    end
    if input.inference_params ~= nil then
      -- a KV cache: the same path as al.inference.forward with this module's settings (packed
      -- qkv_layer / kv_layer are refused there with TE's message); inference only, no ctx
      local ok, out = pcall(al.inference.forward, input, self)
      if not ok then error(out, 0) end
      self.ctx, self.output, self.max_logit, self.inference = nil, out, nil, true
      return out
    end
    if self.inference ~= nil then self.inference = nil end -- (a nil store to an absent key costs an insertion)
    local out, a, b = forward_with(input, self:_defaults(), 2)
    if self.return_max_logit or input.return_max_logit then
      self.ctx, self.output, self.max_logit = b, out, a
      return out, a
    end
    self.ctx, self.output = a, out
    return out
  end
  DPA.updateOutput = DPA.forward

  function DPA:backward(input, dout)
    if self.inference then
      error("DotProductAttention:backward: the forward ran with inference_params (a KV cache): inference only", 2)
    end
    if not self.ctx then error("DotProductAttention:backward: call forward first", 2) end
    if input ~= nil and input ~= self.ctx.args then
      -- Torch7 passes the input again; it must be the one the forward saw
      for _, k in ipairs({ "qkv_layer", "kv_layer", "query_layer", "key_layer", "value_layer" }) do
        if input[k] ~= self.ctx.args[k] then
          error("DotProductAttention:backward: input." .. k .. " differs from the forward's input", 2)
        end
      end
    end
    if self.ctx.cp then
      local grads = self:_cp_backward(dout) -- (not a tail call: the error levels count this frame)
      return grads
    end
    local grads = al.attention.backward(self.ctx, dout)
    if grads.softmax_offset and self.grad_softmax_offset then
      self.grad_softmax_offset:copy_(self.grad_softmax_offset:to("f64"):add(grads.softmax_offset:to("f64")))
    end
    self.gradients = grads
    self.gradInput = grads
    return grads
  end

  function DPA:parameters()
    if self.softmax_type == "learnable" then return { self.softmax_offset }, { self.grad_softmax_offset } end
    return {}, {}
  end
  function DPA:zeroGradParameters()
    if self.grad_softmax_offset then self.grad_softmax_offset:zero_() end
  end
  function DPA:training() self.train = true return self end
  function DPA:evaluate() self.train = false return self end
  function DPA:explain(input)
    return al.attention._explain_with(input, self:_defaults(), 2)
  end
  function DPA:__tostring()
    return string.format("al.DotProductAttention(h=%d, hg=%d, kv_channels=(%d,%d), %s, %s, softmax=%s, dropout=%g%s)",
      self.num_attention_heads, self.num_gqa_groups, self.kv_channels[1], self.kv_channels[2], self.qkv_format,
      self.attn_mask_type, self.softmax_type, self.attention_dropout,
      self.cp_group and string.format(", cp=%s over %d ranks", self.cp_comm_type, self.cp_group.size) or "")
  end

  al.DotProductAttention = setmetatable({ methods = DPA }, { __call = new })
  al.nn = al.nn or {}
  al.nn.DotProductAttention = al.DotProductAttention
end

return M
