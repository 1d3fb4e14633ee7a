--[[
attnlab.inference — a KV cache for incremental decoding, after TransformerEngine's InferenceParams
(te_dpa_semantics.md §3.2): non-paged or paged storage, pre_step with per-sequence step lengths,
prefill with thd, then one token at a time.

  local ip = al.nn.InferenceParams{max_batch_size = 4, max_sequence_length = 128, num_heads_kv = 2,
                                   head_dim_k = 64, dtype = "f32", is_paged = false}
  ip:pre_step{{7, 12}, {9, 5}}        -- ordered {seq_id, step_len} pairs (or {[7]=12, [9]=5}: ids sorted)
  local out = mha:forward{hidden_states = x, inference_params = ip}   -- x holds the 17 new tokens (thd)
  ip:pre_step{{7, 1}, {9, 1}}         -- decode: one token each; a sequence left out has finished
  -- DPA level: out = al.inference.forward{query_layer = q, key_layer = k, value_layer = v,
  --                                       inference_params = ip, layer_number = 1, qkv_format = "thd",
  --                                       attn_mask_type = "padding_causal"}

Semantics (TE): the batch order after pre_step is the order of the step (ip.seq_ids); new q/k/v rows
follow it (thd: sequences back to back per ip.cu_seqlens_q; bshd [b, s, ..] / sbhd: the first
step_len rows of each entry). Sequences absent from a step have finished: their cache slots (non-
paged, compacted so that slots follow the batch order) or pages (paged, back on the free list) are
released. The attention mask must be a padding mask ("KV caching requires padding mask!");
padding_causal becomes padding_causal_bottom_right, so a token sees every cached token before it.
Packed inputs (qkv_layer/kv_layer) are refused with TE's message.
Storage: non-paged caches are [max_batch_size, max_sequence_length, hg, d] per layer (bshd); paged
caches are [total_num_pages, page_size, hg, d] per layer with a page table per sequence
(ip:page_table() gives it as an i32 tensor). The attention reads the cache through a thd view with
padded offsets (cu_seqlens_kv_padded = slot * stride), so a non-paged cache is never copied; a paged
cache is gathered into a non-paged buffer first (what TE's unfused backend does).
]]
local T = require "attnlab.tensor"

local M = {}

local function check_int(fname, name, v, min)
  if type(v) ~= "number" or v % 1 ~= 0 or v < (min or 1) then
    error(string.format("%s: %s: expected an integer >= %d, got %s", fname, name, min or 1, tostring(v)), 4)
  end
end

function M.install(al)
  al.nn = al.nn or {}
  local IP = {}
  IP.__index = IP

  local function new(_, cfg)
    local fname = "InferenceParams"
    if type(cfg) ~= "table" then error(fname .. ": expected a table of named arguments, got " .. type(cfg), 2) end
    check_int(fname, "max_batch_size", cfg.max_batch_size)
    check_int(fname, "max_sequence_length", cfg.max_sequence_length)
    check_int(fname, "num_heads_kv", cfg.num_heads_kv)
    check_int(fname, "head_dim_k", cfg.head_dim_k)
    local dv = cfg.head_dim_v or cfg.head_dim_k
    check_int(fname, "head_dim_v", dv)
    local self = setmetatable({
      max_batch_size = cfg.max_batch_size, max_sequence_length = cfg.max_sequence_length,
      num_heads_kv = cfg.num_heads_kv, head_dim_k = cfg.head_dim_k, head_dim_v = dv,
      dtype = cfg.dtype or "f32", device = cfg.device or "cpu", is_paged = cfg.is_paged or false,
      caches = {}, seq_ids = {}, sequences = {}, step_lens = {}, pre_lens = {}, batch_size = 0,
    }, IP)
    if self.is_paged then
      check_int(fname, "page_size", cfg.page_size)
      check_int(fname, "total_num_pages", cfg.total_num_pages)
      self.page_size, self.total_num_pages = cfg.page_size, cfg.total_num_pages
      self.max_pages_per_seq = math.ceil(self.max_sequence_length / self.page_size)
      self.pages = {}
      self.free_pages = {}
      for i = self.total_num_pages - 1, 0, -1 do self.free_pages[#self.free_pages + 1] = i end
    end
    return self
  end

  function IP:reset()
    self.caches, self.seq_ids, self.sequences, self.step_lens, self.pre_lens, self.batch_size = {}, {}, {}, {}, {}, 0
    if self.is_paged then
      self.pages = {}
      self.free_pages = {}
      for i = self.total_num_pages - 1, 0, -1 do self.free_pages[#self.free_pages + 1] = i end
    end
  end

  -- {{id, len}, ...} or {[id] = len} -> ordered list of {id, len}
  local function step_list(step)
    if type(step) ~= "table" then
      error("InferenceParams:pre_step: expected {{seq_id, step_len}, ...} or {[seq_id] = step_len}, got " .. type(step), 3)
    end
    local list = {}
    if #step > 0 and type(step[1]) == "table" then
      for i, e in ipairs(step) do list[i] = { e[1], e[2] } end
    else
      for id, len in pairs(step) do list[#list + 1] = { id, len } end
      table.sort(list, function(a, b)
        if type(a[1]) == type(b[1]) then return a[1] < b[1] end
        return tostring(a[1]) < tostring(b[1])
      end)
    end
    return list
  end

  local function i32(al_, list, device)
    return al_.tensor(list, { dtype = "i32", device = device })
  end

  -- Allocate the cache of one layer (zeros).
  function IP:allocate_memory(layer_number)
    local c = self.caches[layer_number]
    if c then return c end
    local o = { dtype = self.dtype, device = self.device }
    local hg = self.num_heads_kv
    if self.is_paged then
      c = { k = al.zeros({ self.total_num_pages, self.page_size, hg, self.head_dim_k }, o),
            v = al.zeros({ self.total_num_pages, self.page_size, hg, self.head_dim_v }, o) }
    else
      c = { k = al.zeros({ self.max_batch_size, self.max_sequence_length, hg, self.head_dim_k }, o),
            v = al.zeros({ self.max_batch_size, self.max_sequence_length, hg, self.head_dim_v }, o) }
    end
    self.caches[layer_number] = c
    return c
  end

  function IP:pre_step(step)
    local fname = "InferenceParams:pre_step"
    local list = step_list(step)
    if #list == 0 then error(fname .. ": the step holds no sequence", 2) end
    if #list > self.max_batch_size then
      error(string.format("%s: %d sequences exceed max_batch_size = %d", fname, #list, self.max_batch_size), 2)
    end
    local seen = {}
    for _, e in ipairs(list) do
      local id, len = e[1], e[2]
      if id == nil or seen[id] then error(fname .. ": sequence id " .. tostring(id) .. " is missing or repeated", 2) end
      seen[id] = true
      if type(len) ~= "number" or len % 1 ~= 0 or len < 1 then
        error(fname .. ": step_len of sequence " .. tostring(id) .. ": expected an integer >= 1, got " .. tostring(len), 2)
      end
      local total = (self.sequences[id] or 0) + len
      if total > self.max_sequence_length then
        error(string.format("%s: sequence %s would reach %d tokens, beyond max_sequence_length = %d", fname,
          tostring(id), total, self.max_sequence_length), 2)
      end
    end
    -- finished sequences: gone from the step
    local old_slot = {}
    for i, id in ipairs(self.seq_ids) do old_slot[id] = i end
    for _, id in ipairs(self.seq_ids) do
      if not seen[id] then
        self.sequences[id] = nil
        if self.is_paged then
          for _, p in ipairs(self.pages[id]) do self.free_pages[#self.free_pages + 1] = p end
          self.pages[id] = nil
        end
      end
    end
    local ids, pre, lens = {}, {}, {}
    for i, e in ipairs(list) do
      ids[i], lens[i] = e[1], e[2]
      pre[i] = self.sequences[e[1]] or 0
    end
    if self.is_paged then
      for i, id in ipairs(ids) do
        local pages = self.pages[id] or {}
        local need = math.ceil((pre[i] + lens[i]) / self.page_size)
        while #pages < need do
          local p = table.remove(self.free_pages)
          if p == nil then
            error(string.format("%s: out of pages (total_num_pages = %d, page_size = %d)", fname,
              self.total_num_pages, self.page_size), 2)
          end
          pages[#pages + 1] = p
        end
        self.pages[id] = pages
      end
    else
      -- compact: slot i holds the i-th sequence of the batch (continuing sequences move if needed)
      local moved = false
      for i, id in ipairs(ids) do if old_slot[id] and old_slot[id] ~= i then moved = true end end
      if moved then
        for layer, c in pairs(self.caches) do
          local nk, nv = al.zeros_like(c.k), al.zeros_like(c.v)
          for i, id in ipairs(ids) do
            local o = old_slot[id]
            if o then
              nk:select(1, i):copy_(c.k:select(1, o))
              nv:select(1, i):copy_(c.v:select(1, o))
            end
          end
          self.caches[layer] = { k = nk, v = nv }
        end
      end
    end
    for i, id in ipairs(ids) do self.sequences[id] = pre[i] + lens[i] end
    self.seq_ids, self.pre_lens, self.step_lens, self.batch_size = ids, pre, lens, #ids
    local cq, ckv = { 0 }, { 0 }
    local mq, mkv = 0, 0
    for i = 1, #ids do
      cq[i + 1] = cq[i] + lens[i]
      ckv[i + 1] = ckv[i] + pre[i] + lens[i]
      mq = math.max(mq, lens[i])
      mkv = math.max(mkv, pre[i] + lens[i])
    end
    self.cu_seqlens_q_list, self.cu_seqlens_kv_list = cq, ckv
    self.cu_seqlens_q = i32(al, cq, self.device)
    self.cu_seqlens_kv = i32(al, ckv, self.device)
    self.max_seqlen_q, self.max_seqlen_kv = mq, mkv
    return self.sequences
  end

  -- TE's get_seqlens_pre_step: the cached length of each sequence of the batch before this step.
  function IP:get_seqlens_pre_step()
    local t = {}
    for i, v in ipairs(self.pre_lens) do t[i] = v end
    return t
  end

  -- The page table of the current batch: i32 [batch_size, max_pages_per_seq], unused entries -1.
  function IP:page_table()
    if not self.is_paged then error("InferenceParams:page_table: the cache is not paged (is_paged = false)", 2) end
    local rows = {}
    for i, id in ipairs(self.seq_ids) do
      local r = {}
      for j = 1, self.max_pages_per_seq do r[j] = self.pages[id][j] or -1 end
      rows[i] = r
    end
    return al.tensor(rows, { dtype = "i32", device = self.device })
  end

  -- rows of the i-th sequence's new tokens in a [.., hg, d] tensor of the given format
  function IP:_new_rows(x, fmt, i)
    local len = self.step_lens[i]
    if fmt == "thd" then return x:narrow(1, self.cu_seqlens_q_list[i] + 1, len) end
    if fmt == "bshd" then return x:select(1, i):narrow(1, 1, len) end
    return x:select(2, i):narrow(1, 1, len)
  end

  local function check_new(fname, self, x, name, fmt, d)
    if not T.is_tensor(x) then error(fname .. ": " .. name .. ": expected a tensor, got " .. type(x), 4) end
    local want_nd = fmt == "thd" and 3 or 4
    if x:dim() ~= want_nd then
      error(string.format("%s: %s: expected a %dD tensor for qkv_format=%s, got %dD", fname, name, want_nd, fmt, x:dim()), 4)
    end
    if x:size(-2) ~= self.num_heads_kv or x:size(-1) ~= d then
      error(string.format("%s: %s: expected [.., %d, %d] (num_heads_kv, head_dim), got [%s]", fname, name,
        self.num_heads_kv, d, table.concat(x:size(), ",")), 4)
    end
    if fmt == "thd" then
      if x:size(1) < self.cu_seqlens_q_list[self.batch_size + 1] then
        error(string.format("%s: %s holds %d tokens, the step has %d", fname, name, x:size(1),
          self.cu_seqlens_q_list[self.batch_size + 1]), 4)
      end
    else
      local bd, sd = fmt == "bshd" and 1 or 2, fmt == "bshd" and 2 or 1
      if x:size(bd) ~= self.batch_size or x:size(sd) < self.max_seqlen_q then
        error(string.format("%s: %s: expected batch %d and at least %d tokens per sequence, got [%s]", fname, name,
          self.batch_size, self.max_seqlen_q, table.concat(x:size(), ",")), 4)
      end
    end
  end

  -- Write this step's new k and v into the cache of `layer_number`; returns the keys and values to
  -- attend to as non-paged [batch_size, S, hg, d] tensors (S = the row stride of a sequence).
  function IP:step(layer_number, new_k, new_v, qkv_format)
    local fname = "InferenceParams:step"
    if self.batch_size == 0 then error(fname .. ": call pre_step first", 2) end
    local fmt = qkv_format or "bshd"
    check_new(fname, self, new_k, "new_k", fmt, self.head_dim_k)
    check_new(fname, self, new_v, "new_v", fmt, self.head_dim_v)
    local c = self:allocate_memory(layer_number)
    local b = self.batch_size
    if not self.is_paged then
      for i = 1, b do
        local pre, len = self.pre_lens[i], self.step_lens[i]
        c.k:select(1, i):narrow(1, pre + 1, len):copy_(self:_new_rows(new_k, fmt, i))
        c.v:select(1, i):narrow(1, pre + 1, len):copy_(self:_new_rows(new_v, fmt, i))
      end
      return c.k:narrow(1, 1, b), c.v:narrow(1, 1, b)
    end
    local ps = self.page_size
    for i = 1, b do
      local id = self.seq_ids[i]
      local pre, len = self.pre_lens[i], self.step_lens[i]
      local rk, rv = self:_new_rows(new_k, fmt, i), self:_new_rows(new_v, fmt, i)
      local done = 0
      while done < len do
        local pos = pre + done
        local page = self.pages[id][math.floor(pos / ps) + 1]
        local off = pos % ps
        local run = math.min(ps - off, len - done)
        c.k:select(1, page + 1):narrow(1, off + 1, run):copy_(rk:narrow(1, done + 1, run))
        c.v:select(1, page + 1):narrow(1, off + 1, run):copy_(rv:narrow(1, done + 1, run))
        done = done + run
      end
    end
    return self:convert_paged_to_nonpaged(layer_number)
  end

  -- Gather the pages of the batch into [batch_size, max_pages_per_seq * page_size, hg, d] (zeros past
  -- each sequence's end), as TE's unfused backend does before attending.
  function IP:convert_paged_to_nonpaged(layer_number)
    local c = self.caches[layer_number]
    if not c then error("InferenceParams:convert_paged_to_nonpaged: no cache for layer " .. tostring(layer_number), 2) end
    local ps, b = self.page_size, self.batch_size
    local o = { dtype = self.dtype, device = self.device }
    local S = self.max_pages_per_seq * ps
    local k = al.zeros({ b, S, self.num_heads_kv, self.head_dim_k }, o)
    local v = al.zeros({ b, S, self.num_heads_kv, self.head_dim_v }, o)
    for i = 1, b do
      local id = self.seq_ids[i]
      local total = self.sequences[id]
      for j, page in ipairs(self.pages[id]) do
        local n = math.min(ps, total - (j - 1) * ps)
        if n > 0 then
          k:select(1, i):narrow(1, (j - 1) * ps + 1, n):copy_(c.k:select(1, page + 1):narrow(1, 1, n))
          v:select(1, i):narrow(1, (j - 1) * ps + 1, n):copy_(c.v:select(1, page + 1):narrow(1, 1, n))
        end
      end
    end
    return k, v
  end

  -- Attention of this step's queries over the cache (TE's DotProductAttention.forward with
  -- inference_params). q: [t, h, d] (thd) or [b, s, h, d] / [s, b, h, d]; k, v: the new tokens in the
  -- same format. Returns the output flattened like DPA's ([t, h*dv], [b, s, h*dv], [s, b, h*dv]).
  -- `defaults` are a DotProductAttention's settings (dpa:_defaults()) or nil.
  function IP:attention(layer_number, q, k, v, args, defaults)
    local fname = "InferenceParams:attention"
    args = args or {}
    defaults = defaults or {}
    local fmt = args.qkv_format or defaults.qkv_format or "sbhd"
    local mask = args.attn_mask_type or defaults.attn_mask_type or "causal"
    if not tostring(mask):find("padding", 1, true) then
      error(fname .. ": KV caching requires padding mask! (attn_mask_type = " .. tostring(mask) ..
        "; use padding or padding_causal)", 3)
    end
    if mask == "padding_causal" or mask == "padding,causal" or mask == "causal,padding" or mask == "causal_padding" then
      mask = "padding_causal_bottom_right"
    end
    if not T.is_tensor(q) then error(fname .. ": query_layer: expected a tensor, got " .. type(q), 3) end
    local kc, vc = self:step(layer_number, k, v, fmt)
    local b, S = self.batch_size, kc:size(2)
    local kt = kc:view(b * S, kc:size(3), kc:size(4))
    local vt = vc:view(b * S, vc:size(3), vc:size(4))
    local kvpad = {}
    for i = 0, b do kvpad[i + 1] = i * S end
    local a = {}
    for key, val in pairs(args) do a[key] = val end
    a.inference_params, a.layer_number = nil, nil
    a.qkv_format, a.attn_mask_type = "thd", mask
    a.key_layer, a.value_layer = kt, vt
    a.cu_seqlens_q, a.cu_seqlens_kv = self.cu_seqlens_q, self.cu_seqlens_kv
    a.cu_seqlens_kv_padded = i32(al, kvpad, self.device)
    a.max_seqlen_q, a.max_seqlen_kv = nil, S
    local s
    if fmt == "thd" then
      a.query_layer = q
    else
      local qb = fmt == "bshd" and q or q:transpose(1, 2)
      s = qb:size(2)
      a.query_layer = qb:reshape({ b * s, qb:size(3), qb:size(4) })
      local qpad = {}
      for i = 0, b do qpad[i + 1] = i * s end
      a.cu_seqlens_q_padded = i32(al, qpad, self.device)
      a.max_seqlen_q = s
    end
    local out = al.attention._forward_with(a, defaults, 2)
    if fmt == "thd" then return out end
    out = out:view(b, s, out:size(2))
    if fmt == "sbhd" then out = out:transpose(1, 2):contiguous() end
    return out
  end

  function IP:__tostring()
    return string.format("al.nn.InferenceParams(max_batch_size=%d, max_sequence_length=%d, hg=%d, d=(%d,%d), %s%s, batch=%d)",
      self.max_batch_size, self.max_sequence_length, self.num_heads_kv, self.head_dim_k, self.head_dim_v, self.dtype,
      self.is_paged and string.format(", paged %dx%d", self.total_num_pages, self.page_size) or "", self.batch_size)
  end

  al.nn.InferenceParams = setmetatable({ methods = IP }, { __call = new })

  -- DotProductAttention with a KV cache: the usual DPA arguments plus inference_params and
  -- layer_number (default 1); `dpa` (optional) supplies a module's settings. Packed inputs are
  -- refused with TE's message.
  al.inference = al.inference or {}
  function al.inference.forward(args, dpa)
    if type(args) ~= "table" then error("inference.forward: expected a table of named arguments, got " .. type(args), 2) end
    local ip = args.inference_params
    if ip == nil or getmetatable(ip) ~= IP then
      error("inference.forward: inference_params: expected an al.nn.InferenceParams, got " .. type(ip), 2)
    end
    if args.qkv_layer ~= nil or args.kv_layer ~= nil then
      -- TE's _unpack_packed_qkv check 3 (raises its message)
      al.attention.unpack_qkv{ qkv_layer = args.qkv_layer, kv_layer = args.kv_layer, query_layer = args.query_layer,
        key_layer = args.key_layer, value_layer = args.value_layer, qkv_interleave_dim = args.qkv_interleave_dim,
        qkv_format = args.qkv_format or (dpa and dpa.qkv_format), inference_params = ip }
    end
    local q, k, v = args.query_layer, args.key_layer, args.value_layer
    if q == nil or k == nil or v == nil then
      error("inference.forward: query_layer, key_layer and value_layer are required", 2)
    end
    local a = {}
    for key, val in pairs(args) do a[key] = val end
    a.query_layer, a.key_layer, a.value_layer = nil, nil, nil
    local out = ip:attention(args.layer_number or 1, q, k, v, a, dpa and dpa:_defaults() or nil)
    return out
  end
end

return M
