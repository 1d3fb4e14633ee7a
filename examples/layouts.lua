-- examples/layouts.lua — packed QKV/KV layouts, declared rather than detected.
--   scripts/attnlab examples/layouts.lua [out.svg]
-- Unpacks fused QKV buffers in both interleavings and a packed KV next to a separate query, shows that
-- q/k/v are zero-copy views (same storage, strided), compares the declared layout with the legacy
-- pointer-based detection (which warns), checks that packed and copied inputs give the same attention
-- output, and (with an argument) draws the attention map of one head to an SVG file.
local al = rawget(_G, "al") or require "attnlab"
local out_svg = arg and arg[1]

al.manual_seed(0)
local b, s, h, d = 2, 32, 4, 16

print("== declared packed QKV")
for _, case in ipairs({
  { "bshd", -3, { b, s, 3, h, d } }, { "bshd", -2, { b, s, h, 3, d } },
  { "sbhd", -3, { s, b, 3, h, d } }, { "sbhd", -2, { s, b, h, 3, d } },
}) do
  local fmt, dim, shape = case[1], case[2], case[3]
  local qkv = al.randn(shape)
  local q, k, v, layout = al.attention.unpack_qkv { qkv_layer = qkv, qkv_interleave_dim = dim, qkv_format = fmt }
  assert(q:is_same_storage(qkv) and k:is_same_storage(qkv) and v:is_same_storage(qkv), "views share the buffer")
  print(string.format("  qkv [%s] interleave %d -> %-6s q strides {%s}, k offset %d", table.concat(shape, ","), dim,
    layout, table.concat(q:stride(), ","), k:storage_offset()))
end

print("== packed KV with a separate query")
local query, kv = al.randn { s, b, h, d }, al.randn { s, b, 2, h, d }
print("  layout " .. select(4, al.attention.unpack_qkv { query_layer = query, kv_layer = kv, qkv_interleave_dim = -3 }))

print("== declared vs detected")
local qkv = al.randn { b, s, 3, h, d }
local q, k, v, declared = al.attention.unpack_qkv { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd" }
local warnings, detected = al.warnings.capture(al.attention.detect_layout, q, k, v, "bshd")
print(string.format("  declared %s, detected %s, %d warning(s): %s", declared, detected, #warnings,
  warnings[1] and warnings[1].category or "none"))

print("== the same attention from the packed buffer and from contiguous copies")
local args = { qkv_format = "bshd", attn_mask_type = "causal" }
local function with(t) local r = {} for x, y in pairs(args) do r[x] = y end for x, y in pairs(t) do r[x] = y end return r end
local o1 = al.attention.forward(with { qkv_layer = qkv, qkv_interleave_dim = -3 })
local o2 = al.attention.forward(with { query_layer = q:contiguous(), key_layer = k:contiguous(), value_layer = v:contiguous() })
local diff = al.max_abs_diff(o1, o2)
print(string.format("  max |packed - copies| = %.3g", diff))
assert(diff < 1e-5, "packed and copied inputs must agree")

if out_svg then
  local qh, kh = q:select(1, 1):select(2, 1), k:select(1, 1):select(2, 1)
  local probs = (al.matmul(qh, kh:t()) * (1 / math.sqrt(d))):softmax(-1)
  al.plot.heatmap(probs, { title = "batch 1, head 1 (no mask)", xlabel = "key", ylabel = "query" }):save(out_svg)
  print("  attention map written to " .. out_svg)
end
