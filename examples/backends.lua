-- examples/backends.lua — which backend serves a call and why, correctness of every available backend
-- against the CPU oracle, and (on a GPU) a small speed sweep written as JSON lines and charted.
--   scripts/attnlab examples/backends.lua [--out DIR]
-- On a machine without a GPU only the CPU backend runs and the sweep times the CPU on small shapes.
local al = rawget(_G, "al") or require "attnlab"
local outdir = arg and arg[1] == "--out" and arg[2] or nil

al.manual_seed(1)
local b, s, h, d = 2, 64, 4, 32
local qkv = al.randn { b, s, 3, h, d }
local args = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal" }
local function with_backend(name)
  local a = {}
  for k, v in pairs(args) do a[k] = v end
  a.backend = name
  return a
end

print("== explain")
print((al.attention.explain(args)))

print("== every backend against the CPU (forward output and the packed gradient)")
local dout = al.randn { b, s, h * d }
local ref, ctx = al.attention.forward(with_backend("cpu"))
local ref_grad = al.attention.backward(ctx, dout).qkv_layer
for _, name in ipairs(al.attention.backends()) do
  if name ~= "cpu" then
    local ok, o, c = pcall(al.attention.forward, with_backend(name))
    if ok then
      local g = al.attention.backward(c, dout:to(o:device())).qkv_layer
      print(string.format("  %-8s out %.2e  dqkv %.2e", name, al.max_abs_diff(o:cpu(), ref), al.max_abs_diff(g:cpu(), ref_grad)))
    else
      print(string.format("  %-8s not run: %s", name, (tostring(o):gsub("^.-attention%.forward: ", ""))))
    end
  end
end

print("== speed sweep")
local gpu = al.cuda.available()
local device, dtype = gpu and "cuda" or "cpu", gpu and "bf16" or "f32"
local lens = gpu and { 512, 1024, 2048, 4096 } or { 64, 128, 256 }
local names = gpu and { "fused", "flash", "unfused" } or { "cpu" }
local path = (outdir or os.tmpname() .. "_d") .. "/backends.jsonl"
os.execute("mkdir -p '" .. path:match("^(.*)/") .. "'")
local w = al.results.jsonl(path)
local p = al.progress(#lens * #names, { label = "sweep" })
for _, sl in ipairs(lens) do
  local x = al.randn({ 1, sl, 3, 8, 64 }, { dtype = dtype, device = device })
  for _, name in ipairs(names) do
    local a = { qkv_layer = x, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal", backend = name }
    if pcall(al.attention.forward, a) then
      if gpu then al.cuda.synchronize() end
      local reps = gpu and 10 or 2
      local t0 = al.progress.clock()
      for _ = 1, reps do al.attention.forward(a) end
      if gpu then al.cuda.synchronize() end
      local t = (al.progress.clock() - t0) / reps
      w:write { backend = name, seq = sl, device = device, ms = t * 1e3, gflops = 4 * sl * sl * 8 * 64 / 2 / t / 1e9 }
    end
    p:step(1, name .. " s=" .. sl)
  end
end
p:done()
w:close()
local rows = al.results.read(path)
for _, r in ipairs(rows) do print(string.format("  %-8s s=%-5d %8.3f ms %9.2f GFLOP/s", r.backend, r.seq, r.ms, r.gflops)) end
local fig = al.results.chart(rows, { x = "seq", y = "gflops", series = "backend", xlog = 2, ylabel = "GFLOP/s",
  title = "causal forward, b=1 h=8 d=64 " .. dtype .. " on " .. device })
local svg = path:gsub("%.jsonl$", ".svg")
fig:save(svg)
print("  results: " .. path .. "   chart: " .. svg)
