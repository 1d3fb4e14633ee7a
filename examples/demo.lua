--[[
examples/demo.lua — attnlab's signature experiment (`make demo`).

One fused QKV projection buffer, [b, s, 3, h, d] (TE's bs3hd), is handed to DotProductAttention three
ways, on every attention backend this machine has:
  declared   qkv_layer = buffer, qkv_interleave_dim = -3   (TE PR #3200: no pointer detection)
  detected   query/key/value_layer = buffer:select(3, i)   (legacy: layout reverse-engineered, warns)
  separate   three contiguous copies                       (bshd_bshd_bshd, never warns)
For each it prints the layout string, the backend chosen (and why, from al.attention.explain), the
largest difference from the CPU oracle (the cpu backend in f64; itself checked against a naive Lua
implementation), whether a DeprecationWarning fired, and the time per call (forward + backward).
]]
package.path = "lua/?.lua;lua/?/init.lua;tests/spec/?.lua;" .. package.path
local al = require "attnlab"

local wall = al.clock

local B, S, H, D = 2, 256, 8, 64
local FMT, MASK = "bshd", "causal"
al.manual_seed(2024)
local qkv_cpu = al.randn({ B, S, 3, H, D })
print(string.format("attnlab %s — packed QKV [%d,%d,3,%d,%d] (%s, %s), TE DotProductAttention semantics", al.version,
  B, S, H, D, FMT, MASK))

-- the CPU oracle: f64 compute on f64 copies of the same numbers
local q64 = qkv_cpu:to("f64")
local oracle_out, oracle_ctx = al.attention.forward{ qkv_layer = q64, qkv_format = FMT, attn_mask_type = MASK,
  backend = "cpu", compute_dtype = "f64" }
local dout_cpu = al.randn(oracle_out:size())
local oracle_grad = al.attention.backward(oracle_ctx, dout_cpu:to("f64")).qkv_layer

-- ... checked once against a naive Lua implementation on one batch slice (small enough for plain Lua)
do
  local ok, naive = pcall(require, "attention_oracle")
  if ok then
    local small = q64:narrow(1, 1, 1):narrow(2, 1, 64)
    local a = { query_layer = small:select(3, 1):contiguous(), key_layer = small:select(3, 2):contiguous(),
      value_layer = small:select(3, 3):contiguous(),
      qkv_format = FMT, attn_mask_type = MASK }
    local want = naive.run(al, a)
    local _, ctx = al.attention.forward(setmetatable({ compute_dtype = "f64", backend = "cpu" }, { __index = a }))
    local got, m = ctx.out:flat_values(), 0
    for i = 1, #want do m = math.max(m, math.abs(got[i] - want[i])) end
    print(string.format("cpu oracle vs naive Lua attention (1x64 slice): max |diff| = %.2e", m))
  end
end

local function sync(t)
  if t:is_cuda() and al.cuda.synchronize then al.cuda.synchronize() end
end

local function ways(qkv)
  local q, k, v = qkv:select(3, 1), qkv:select(3, 2), qkv:select(3, 3)
  return {
    { "declared", { qkv_layer = qkv, qkv_interleave_dim = -3 } },
    { "detected", { query_layer = q, key_layer = k, value_layer = v } },
    { "separate", { query_layer = q:contiguous(), key_layer = k:contiguous(), value_layer = v:contiguous() } },
  }
end

local function grad_of(way, grads)
  if grads.qkv_layer then return grads.qkv_layer end
  -- reassemble [b,s,3,h,d] from the three gradients for the comparison
  local g = al.zeros({ B, S, 3, H, D }, { device = grads.query_layer:device(), dtype = grads.query_layer:dtype() })
  g:select(3, 1):copy_(grads.query_layer)
  g:select(3, 2):copy_(grads.key_layer)
  g:select(3, 3):copy_(grads.value_layer)
  return g
end

print(string.format("\n%-9s %-9s %-16s %-8s %-11s %-11s %-6s %9s", "backend", "input", "layout", "chosen", "max|out-o|",
  "max|grad-o|", "warn", "ms/call"))
local backends = al.attention.backends and al.attention.backends() or { "cpu" }
local gpu = al.cuda.available()
for _, be in ipairs(backends) do
  local qkv = qkv_cpu
  if be ~= "cpu" then
    if gpu then qkv = qkv_cpu:cuda() else qkv = nil end
  end
  if not qkv then
    print(string.format("%-9s (no usable GPU on this machine: skipped)", be))
  else
    for _, w in ipairs(ways(qkv)) do
      local name, extra = w[1], w[2]
      local args = { qkv_format = FMT, attn_mask_type = MASK, backend = be }
      for k2, v2 in pairs(extra) do args[k2] = v2 end
      local _, text, chosen = al.warnings.capture(al.attention.explain, args)   -- (its warning is counted below)
      if not chosen then
        local why = text:match("error: ([^\n]*)") or "unsupported"
        print(string.format("%-9s %-9s %s", be, name, why))
      else
        local warns, out, ctx = al.warnings.capture(al.attention.forward, args)
        local dout = be == "cpu" and dout_cpu or dout_cpu:cuda()
        local grads = al.attention.backward(ctx, dout)
        sync(out)
        local reps = 3
        local t0 = wall()
        for _ = 1, reps do
          local _, _, c2 = al.warnings.capture(al.attention.forward, args)
          al.attention.backward(c2, dout)
        end
        sync(out)
        local ms = (wall() - t0) / reps * 1e3
        local dout_o = al.max_abs_diff(out:to("f64"):cpu(), oracle_out)
        local dgrad = al.max_abs_diff(grad_of(name, grads):to("f64"):cpu(), oracle_grad)
        local fired = 0
        for _, wv in ipairs(warns) do if wv.category == "DeprecationWarning" then fired = fired + 1 end end
        print(string.format("%-9s %-9s %-16s %-8s %-11.2e %-11.2e %-6s %9.1f", be, name, ctx.layout, chosen, dout_o, dgrad,
          fired > 0 and "yes" or "no", ms))
      end
    end
    -- why this backend (the explain record of the declared call)
    local args = { qkv_layer = qkv, qkv_format = FMT, attn_mask_type = MASK }
    local text = al.attention.explain(args)
    if be == backends[#backends] or gpu then
      print("  selection without forcing:")
      for line in text:gmatch("[^\n]+") do print("    " .. line) end
    end
  end
end
