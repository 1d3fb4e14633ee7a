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
]]
local M = {}

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
    if st ~= "vanilla" then
      -- TE: a zeros buffer (off-by-one) or an nn.Parameter initialised to zeros (learnable), shape [h]
      self.softmax_offset = al.zeros({ h }, { dtype = "f32" })
      if st == "learnable" then self.grad_softmax_offset = al.zeros({ h }, { dtype = "f32" }) end
    end
    return self
  end

  -- the module's settings as defaults for al.attention
  -- (one table per module, refilled on every call from the current fields: settings changed between
  -- calls are always seen, and a forward allocates no defaults table; bench/host_overhead.lua)
  function DPA:_defaults()
    local d = rawget(self, "_dflt")
    if d == nil then d = {}; rawset(self, "_dflt", d) end
    d.qkv_format, d.attn_mask_type, d.window_size = self.qkv_format, self.attn_mask_type, self.window_size
    d.bottom_right_diagonal, d.softmax_scale = self.bottom_right_diagonal, self.softmax_scale
    d.softmax_type, d.softmax_offset = self.softmax_type, self.softmax_offset
    d.attention_dropout, d.return_max_logit = self.train and self.attention_dropout or 0, self.return_max_logit
    d.backend, d.compute_dtype = self.backend, self.compute_dtype
    d.num_attention_heads, d.num_gqa_groups = self.num_attention_heads, self.num_gqa_groups
    d.kv_channels, d.fp8_recipe = self.kv_channels, self.fp8_recipe
    d.score_mod, d.mask_mod, d.block_mask = self.score_mod, self.mask_mod, self.block_mask
    return d
  end

  function DPA:forward(input)
    if type(input) ~= "table" then error("DotProductAttention:forward: expected a table of inputs, got " .. type(input), 2) end
    if input.inference_params ~= nil then
      -- a KV cache: the same path as al.inference.forward with this module's settings (packed
      -- qkv_layer / kv_layer are refused there with TE's message); inference only, no ctx
      local ok, out = pcall(al.inference.forward, input, self)
      if not ok then error(out, 0) end
      self.ctx, self.output, self.max_logit, self.inference = nil, out, nil, true
      return out
    end
    self.inference = nil
    local out, a, b = al.attention._forward_with(input, self:_defaults(), 2)
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
    return string.format("al.DotProductAttention(h=%d, hg=%d, kv_channels=(%d,%d), %s, %s, softmax=%s, dropout=%g)",
      self.num_attention_heads, self.num_gqa_groups, self.kv_channels[1], self.kv_channels[2], self.qkv_format,
      self.attn_mask_type, self.softmax_type, self.attention_dropout)
  end

  al.DotProductAttention = setmetatable({ methods = DPA }, { __call = new })
  al.nn = al.nn or {}
  al.nn.DotProductAttention = al.DotProductAttention
end

return M
