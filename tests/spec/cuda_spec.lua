-- cuda_spec.lua — the CUDA plugin (src/cuda/) against the CPU oracle, on fresh random inputs, over
-- contiguous, transposed, narrowed (strided) and expanded (stride 0) inputs:
--   bit-exact: copy / to() for every dtype pair among f32 f64 f16 bf16 fp8_e4m3 fp8_e5m2 (with
--     specials, wide magnitudes, all 256 FP8 codes and all 65,536 f16 / bf16 patterns), fill,
--     arange, random fills (same seed -> same bits on both devices), max_dim, comparisons
--   tolerance (f32 ~1e-5, f16 1e-3, bf16 1.5e-2): element-wise, reductions, softmax, matmul
--   memory accounting, diff_stats (allclose / max_abs_diff / rmse on cuda), events, error paths.
-- Every test first checks al.cuda.available() and is pending without a GPU.
local al = require "attnlab"
local lffi = require "attnlab.ffi"
local ffi, C = lffi.ffi, lffi.C

local FLOATS = { "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2" }
local TOL = { f32 = 1e-5, f64 = 1e-12, f16 = 1e-3, bf16 = 1.5e-2 }
local seed = 7000
local function fresh_seed() seed = seed + 1; al.manual_seed(seed); return seed end

local function need_gpu()
  if not al.cuda.available() then pending("no GPU") return false end
  return true
end

-- Raw bytes of two tensors (any devices) equal, element for element in row-major order.
local function same_bits(want, got, what)
  assert.are.same(want:size(), got:size(), what)
  assert.are.equal(want:dtype(), got:dtype(), what)
  local a = want:to("cpu"):contiguous()
  local b = got:to("cpu"):contiguous()
  local n = a:numel() * a:element_size()
  local pa = ffi.cast("const uint8_t *", a:data_ptr())
  local pb = ffi.cast("const uint8_t *", b:data_ptr())
  for i = 0, n - 1 do
    if pa[i] ~= pb[i] then
      local es = a:element_size()
      local e = math.floor(i / es)
      error(string.format("%s: bits differ at element %d (byte %d): cpu 0x%02x, cuda 0x%02x", what or "same_bits",
        e, i, pa[i], pb[i]), 2)
    end
  end
end

local function close(want, got, tol, what)
  assert.are.same(want:size(), got:size(), what)
  assert.are.equal(want:dtype(), got:dtype(), what)
  local g = got:to("cpu")
  local ok = al.allclose(g, want, { atol = tol, rtol = tol })
  assert.is_true(ok, string.format("%s: max |diff| %g (tol %g)", what or "close", al.max_abs_diff(g, want), tol))
end

-- Values spread over many binades (subnormals, overflow for f16 and FP8), plus the specials.
local function wide_values(shape, dtype)
  fresh_seed()
  local x = al.randn(shape, { dtype = "f64" }) * (al.randn(shape, { dtype = "f64" }) * 7):exp()
  return x:to(dtype)
end
local SPECIALS = { 0 / 0, 1 / 0, -1 / 0, 0, -0.0, 1e-300, -1e-300, 1e300, 448, 449, 464, 57344, 61440, 65504,
  65520, 2 ^ -24, 2 ^ -25, 3 * 2 ^ -26, 2 ^ -9, 2 ^ -10, 2 ^ -16, 2 ^ -17, 1 + 2 ^ -8, 1 + 2 ^ -9, 3.5, -2.75 }

-- The same view on a CPU tensor and on its cuda copy: contiguous, transposed, narrowed, expanded.
-- gen(shape) makes a fresh CPU tensor; shape is 3-d {A, B, C}.
local function variants(shape, gen)
  local A, B, Cc = shape[1], shape[2], shape[3]
  local out = {}
  local x = gen({ A, B, Cc })
  out[#out + 1] = { "contiguous", x, x:cuda() }
  local bt = gen({ A, Cc, B })
  out[#out + 1] = { "transposed", bt:transpose(2, 3), bt:cuda():transpose(2, 3) }
  local bn = gen({ A, B, Cc + 5 })
  out[#out + 1] = { "narrowed", bn:narrow(3, 3, Cc), bn:cuda():narrow(3, 3, Cc) }
  local be = gen({ 1, B, Cc })
  out[#out + 1] = { "expanded", be:expand(A, B, Cc), be:cuda():expand(A, B, Cc) }
  return out
end

local function randn_gen(dtype, positive)
  return function(shape)
    fresh_seed()
    local t = al.randn(shape, { dtype = dtype })
    if positive then t = (t:abs() + 0.25):to(dtype) end
    return t
  end
end

describe("cuda #gpu", function()
  -- #oom: scripts/gpu_sanitize.sh excludes it (memcheck reports the refused cudaMalloc it provokes)
  it("an allocation larger than the device is an out-of-memory error; the device stays usable #oom", function()
    if not need_gpu() then return end
    local keep = al.randn({ 256, 256 }, { device = "cuda" })
    local keep_host = keep:to("cpu")
    al.cuda.empty_cache()
    local reserved = al.cuda.memory_reserved()
    local total = al.cuda.device_info(0).total_memory
    local ok, err = pcall(al.empty, { math.floor(total / 2) }, { device = "cuda" })   -- 2x the device, f32
    assert.is_false(ok)
    assert.truthy(tostring(err):find("out of memory", 1, true), tostring(err))
    collectgarbage()
    al.cuda.empty_cache()
    assert.equal(reserved, al.cuda.memory_reserved())
    local x = al.randn({ 64, 64 }, { device = "cuda" })
    local y = x:to("cpu")
    assert.equal(0, ((x * 2):to("cpu") - y * 2):abs():max())
    assert.equal(0, (keep:to("cpu") - keep_host):abs():max())   -- a live tensor is untouched
  end)

  it("reports its devices and rejects a device that does not exist", function()
    if not need_gpu() then return end
    local n = al.cuda.device_count()
    assert.is_true(n >= 1)
    local info = al.cuda.device_info(0)
    assert.is_true(#info.name > 0 and info.total_memory > 0)
    -- what launch shapes meet: every CUDA GPU has SMs and L2; sm_70 and later let a block opt in to 96 KB or more
    assert.is_true(info.multiprocessors >= 1 and info.l2_bytes > 0, tostring(info.multiprocessors) .. " / " .. info.l2_bytes)
    if info.capability[1] >= 7 then assert.is_true(info.smem_per_block_optin >= 96 * 1024) end
    if info.name:find("H100 80GB HBM3", 1, true) or info.name:find("H200", 1, true) then
      assert.equal(132, info.multiprocessors)
    end
    local ok, err = pcall(al.randn, { 2, 2 }, { device = "cuda:" .. n })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("cuda:" .. n, 1, true), tostring(err))
    if n < 8 then
      ok, err = pcall(al.zeros, { 3 }, { device = "cuda:7" })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("cuda:7", 1, true), tostring(err))
    end
  end)

  it("copies and converts bit-exactly for every float dtype pair and layout", function()
    if not need_gpu() then return end
    for _, sd in ipairs(FLOATS) do
      for _, dd in ipairs(FLOATS) do
        -- 61 x 37: not a multiple of the vector width, so the vector path and its tail both run
        for _, v in ipairs(variants({ 3, 61, 37 }, function(shape) return wide_values(shape, sd) end)) do
          local name, cpu_t, gpu_t = v[1], v[2], v[3]
          same_bits(cpu_t:to(dd), gpu_t:to(dd), sd .. "->" .. dd .. " " .. name)
        end
        local sp = al.tensor(SPECIALS, { dtype = "f64" }):to(sd)
        same_bits(sp:to(dd), sp:cuda():to(dd), sd .. "->" .. dd .. " specials")
      end
    end
  end)

  it("tiles transposed and permuted copies bit-exactly, converting on the way (any dtype pair)", function()
    if not need_gpu() then return end
    -- src or dst transposed, a batch dim outside or between the tiled dims; extents 67 and 130 are
    -- not multiples of the 64-element tile, so partial tiles run on both edges
    local all = { "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "u8", "bool" }
    local function into(dd, shape, dev, view, src)
      local d = al.empty(shape, { dtype = dd, device = dev })
      local v = view(d)
      v:copy_(src)
      return v
    end
    local T23 = function(t) return t:transpose(2, 3) end
    local P312 = function(t) return t:permute(3, 1, 2) end
    for _, sd in ipairs(all) do
      local xs
      if sd:match("^i") or sd == "u8" or sd == "bool" then
        fresh_seed()
        xs = (al.randn({ 2, 67, 130 }, { dtype = "f64" }) * 1000):to(sd)
      else
        xs = wide_values({ 2, 67, 130 }, sd)
      end
      local xg = xs:cuda()
      for _, dd in ipairs(all) do
        local what = sd .. "->" .. dd
        -- dst contiguous, src transposed in its two inner dims
        same_bits(into(dd, { 2, 130, 67 }, "cpu", function(t) return t end, T23(xs)),
          into(dd, { 2, 130, 67 }, "cuda", function(t) return t end, T23(xg)), what .. " src transposed")
        -- src contiguous, dst a transposed view
        same_bits(into(dd, { 2, 130, 67 }, "cpu", T23, xs), into(dd, { 2, 130, 67 }, "cuda", T23, xg),
          what .. " dst transposed")
        -- src permuted (3, 1, 2): dst's inner dim is src's middle one, the batch dim between
        same_bits(into(dd, { 130, 2, 67 }, "cpu", function(t) return t end, P312(xs)),
          into(dd, { 130, 2, 67 }, "cuda", function(t) return t end, P312(xg)), what .. " src permuted")
      end
    end
  end)

  it("copies integer and bool dtypes bit-exactly (saturating, truncating)", function()
    if not need_gpu() then return end
    local all = { "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "u8", "bool" }
    local x = (al.randn({ 7, 45 }, { dtype = "f64" }) * 3e9)
    local vals = al.tensor(SPECIALS, { dtype = "f64" })
    for _, sd in ipairs(all) do
      local s = x:to(sd)
      local sv = vals:to(sd)
      for _, dd in ipairs(all) do
        same_bits(s:to(dd), s:cuda():to(dd), sd .. "->" .. dd)
        same_bits(s:t():to(dd), s:cuda():t():to(dd), sd .. "->" .. dd .. " transposed")
        same_bits(sv:to(dd), sv:cuda():to(dd), sd .. "->" .. dd .. " specials")
      end
    end
  end)

  it("round-trips all 256 FP8 codes and all 65,536 f16 and bf16 patterns like the CPU", function()
    if not need_gpu() then return end
    local decoders = {
      fp8_e4m3 = { 256, C.al_e4m3_bits_to_f32 }, fp8_e5m2 = { 256, C.al_e5m2_bits_to_f32 },
      f16 = { 65536, C.al_f16_bits_to_f32 }, bf16 = { 65536, C.al_bf16_bits_to_f32 },
    }
    for fmt, d in pairs(decoders) do
      local n, dec = d[1], d[2]
      local buf = {}
      for code = 0, n - 1 do buf[code + 1] = tonumber(dec(code)) end
      local f = al.tensor(buf, { dtype = "f32" })
      local fg = f:cuda()
      -- the codes themselves: f32 -> fmt gives back every non-NaN code on both devices
      local enc_cpu, enc_gpu = f:to(fmt), fg:to(fmt)
      same_bits(enc_cpu, enc_gpu, "f32 -> " .. fmt .. " (all codes)")
      for _, dd in ipairs(FLOATS) do
        same_bits(f:to(dd), fg:to(dd), fmt .. " patterns as f32 -> " .. dd)
        same_bits(enc_cpu:to(dd), enc_gpu:to(dd), fmt .. " -> " .. dd)
      end
      -- decoding on the GPU gives the CPU's values exactly
      same_bits(enc_cpu:to("f64"), enc_gpu:to("f64"), fmt .. " -> f64")
    end
    -- every code decodes to itself: compare against the scalar C decoder through f64
    local codes = al.arange(0, 256, { dtype = "f64" })
    same_bits(codes:to("u8"), codes:cuda():to("u8"), "arange -> u8")
  end)

  it("fills and aranges with the CPU's bits", function()
    if not need_gpu() then return end
    local all = { "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "u8", "bool" }
    for _, dt in ipairs(all) do
      for _, v in ipairs({ 3.7, -1e10, 0.1, 500, 0 / 0 }) do
        same_bits(al.full({ 5, 9 }, v, { dtype = dt }), al.full({ 5, 9 }, v, { dtype = dt, device = "cuda" }),
          "full " .. dt .. " " .. v)
      end
      local a = al.empty({ 4, 6 }, { dtype = dt }):t()
      local g = al.empty({ 4, 6 }, { dtype = dt, device = "cuda" }):t()
      a:fill_(-2.5)
      g:fill_(-2.5)
      same_bits(a, g, "fill_ transposed " .. dt)
      same_bits(al.arange(-3.3, 40, 0.7, { dtype = dt }), al.arange(-3.3, 40, 0.7, { dtype = dt, device = "cuda" }),
        "arange " .. dt)
    end
  end)

  it("draws the same random bits on CPU and CUDA for the same seed", function()
    if not need_gpu() then return end
    for _, dt in ipairs({ "f32", "f64", "bf16", "f16", "fp8_e4m3", "fp8_e5m2" }) do
      for _, fn in ipairs({ "randn", "rand" }) do
        local s = fresh_seed()
        local a = al[fn]({ 33, 129 }, { dtype = dt })
        al.manual_seed(s)
        local b = al[fn]({ 33, 129 }, { dtype = dt, device = "cuda" })
        same_bits(a, b, fn .. " " .. dt)
        -- a strided view: element i is numbered row-major over the view
        local va = al.empty({ 20, 31 }, { dtype = dt }):t()
        local vb = al.empty({ 20, 31 }, { dtype = dt, device = "cuda" }):t()
        al.manual_seed(s)
        if fn == "randn" then va:normal_() else va:uniform_() end
        al.manual_seed(s)
        if fn == "randn" then vb:normal_() else vb:uniform_() end
        same_bits(va, vb, fn .. " " .. dt .. " transposed view")
      end
    end
  end)

  it("computes unary ops like the CPU", function()
    if not need_gpu() then return end
    for _, dt in ipairs({ "f32", "f64", "f16", "bf16" }) do
      for _, op in ipairs({ "neg", "abs", "exp", "log", "sqrt", "tanh" }) do
        local positive = op == "log" or op == "sqrt"
        for _, v in ipairs(variants({ 4, 33, 65 }, randn_gen(dt, positive))) do
          close(v[2][op](v[2]), v[3][op](v[3]), TOL[dt], op .. " " .. dt .. " " .. v[1])
        end
      end
    end
  end)

  it("computes binary ops, comparisons and where like the CPU, with broadcasting", function()
    if not need_gpu() then return end
    for _, dt in ipairs({ "f32", "f64", "f16", "bf16" }) do
      local va = variants({ 3, 40, 70 }, randn_gen(dt, true))
      local vb = variants({ 3, 40, 70 }, randn_gen(dt, false))
      for i = 1, #va do
        local a, ag = va[i][2], va[i][3]
        local b, bg = vb[(i % #vb) + 1][2], vb[(i % #vb) + 1][3]
        for _, op in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow" }) do
          close(al[op](a, b), al[op](ag, bg), TOL[dt] * (op == "pow" and 4 or 1), op .. " " .. dt .. " " .. va[i][1])
        end
        for _, op in ipairs({ "eq", "ne", "lt", "le", "gt", "ge" }) do
          same_bits(al[op](a, b), al[op](ag, bg), op .. " " .. dt .. " " .. va[i][1])
        end
        -- a row vector broadcast against the 3-d operand, and scalars on either side
        local r = a:narrow(1, 1, 1):narrow(2, 1, 1)
        close(al.add(b, r), al.add(bg, r:cuda()), TOL[dt], "broadcast add " .. dt)
        close(a * 2.5, ag * 2.5, TOL[dt], "tensor * scalar " .. dt)
        close(1 - a, 1 - ag, TOL[dt], "scalar - tensor " .. dt)
        close(2 / a, 2 / ag, TOL[dt], "scalar / tensor " .. dt)
        local cond = al.gt(a, b)
        same_bits(al.where(cond, a, b), al.where(cond:cuda(), ag, bg), "where " .. dt .. " " .. va[i][1])
      end
    end
  end)

  it("reduces like the CPU over any dims, including long reductions split across blocks", function()
    if not need_gpu() then return end
    for _, dt in ipairs({ "f32", "f64", "f16", "bf16" }) do
      for _, v in ipairs(variants({ 5, 37, 300 }, randn_gen(dt))) do
        for _, dims in ipairs({ false, 1, 3, -1, { 1, 3 }, { 2, 3 } }) do
          local d = dims or nil
          for _, op in ipairs({ "sum", "mean", "amax", "amin" }) do
            local tol = (op == "sum") and math.max(TOL[dt], 1e-4) * 10 or TOL[dt]
            close(v[2][op](v[2], d), v[3][op](v[3], d), tol, op .. " " .. dt .. " " .. v[1] .. " dims " .. tostring(dims))
          end
        end
      end
    end
    -- a long full reduction (partials + final pass) and a tall one (one thread per output)
    fresh_seed()
    local big = al.randn({ 3, 1000003 })
    close(big:sum(2), big:cuda():sum(2), 1e-3, "sum over 1e6")
    close(big:amax(), big:cuda():amax(), 0, "amax over 3e6")
    close(big:mean(), big:cuda():mean(), 1e-5, "mean over 3e6")
    local tall = al.randn({ 100000, 7 })
    close(tall:sum(2), tall:cuda():sum(2), 1e-5, "sum of short rows")
  end)

  it("finds max values and first indices like the CPU", function()
    if not need_gpu() then return end
    for _, dt in ipairs({ "f32", "f64", "bf16" }) do
      for _, v in ipairs(variants({ 6, 45, 2000 }, randn_gen(dt))) do
        for _, dim in ipairs({ 1, 2, 3 }) do
          local vc, ic = v[2]:max(dim, true)
          local vg, ig = v[3]:max(dim, true)
          same_bits(vc, vg, "max values " .. dt .. " " .. v[1] .. " dim " .. dim)
          same_bits(ic, ig, "max indices " .. dt .. " " .. v[1] .. " dim " .. dim)
        end
      end
    end
  end)

  it("computes softmax and log_softmax like the CPU along any dim", function()
    if not need_gpu() then return end
    for _, dt in ipairs({ "f32", "f64", "f16", "bf16" }) do
      for _, v in ipairs(variants({ 4, 50, 1500 }, randn_gen(dt))) do
        for _, dim in ipairs({ 1, 2, -1 }) do
          close(v[2]:softmax(dim), v[3]:softmax(dim), TOL[dt], "softmax " .. dt .. " " .. v[1] .. " dim " .. dim)
          close(v[2]:log_softmax(dim), v[3]:log_softmax(dim), math.max(TOL[dt], 1e-5) * 4,
            "log_softmax " .. dt .. " " .. v[1] .. " dim " .. dim)
        end
      end
    end
  end)

  it("multiplies batched matrices like the CPU over real strides", function()
    if not need_gpu() then return end
    local MT = { f32 = 1e-4, f64 = 1e-12, f16 = 1e-3, bf16 = 1.5e-2 }
    for _, dt in ipairs({ "f32", "f64", "f16", "bf16" }) do
      local function r(shape) fresh_seed() return al.randn(shape, { dtype = dt }) end
      local cases = {}
      local a, b = r({ 5, 17, 33 }), r({ 5, 33, 9 })
      cases[#cases + 1] = { "contiguous", a, b }
      cases[#cases + 1] = { "transposed a and b", r({ 5, 33, 17 }):transpose(2, 3), r({ 5, 9, 33 }):transpose(2, 3) }
      cases[#cases + 1] = { "narrowed", r({ 5, 17, 40 }):narrow(3, 4, 33), r({ 5, 33, 20 }):narrow(3, 2, 9) }
      cases[#cases + 1] = { "broadcast b", a, r({ 1, 33, 9 }):expand(5, 33, 9) }
      cases[#cases + 1] = { "no unit stride", r({ 5, 17, 66 }):as_strided({ 5, 17, 33 }, { 17 * 66, 66, 2 }, 0), b }
      cases[#cases + 1] = { "2-d", r({ 64, 48 }), r({ 48, 80 }) }
      cases[#cases + 1] = { "4-d broadcast in one batch dim", r({ 1, 3, 8, 16 }):expand(2, 3, 8, 16), r({ 2, 3, 16, 8 }) }
      cases[#cases + 1] = { "odd offset", r({ 1, 101 }):narrow(2, 2, 96):view(8, 12), r({ 12, 7 }) }
      for _, c in ipairs(cases) do
        local want = al.matmul(c[2], c[3])
        local got = al.matmul(c[2]:cuda(), c[3]:cuda())
        close(want, got, MT[dt], "matmul " .. dt .. " " .. c[1])
      end
    end
    -- mixed and FP8 operands go through f32 temporaries
    fresh_seed()
    local a8 = al.randn({ 16, 32 }):to("fp8_e4m3")
    local b8 = al.randn({ 32, 24 }):to("fp8_e4m3")
    local ok, want = pcall(al.matmul, a8, b8)
    assert.is_true(ok, tostring(want))
    -- one FP8 ulp is 2^-3 relative: the f32 sums may round across a boundary in a different order
    local tol = want:dtype():match("^fp8") and 0.13 or 1e-5
    close(want, al.matmul(a8:cuda(), b8:cuda()), tol, "matmul fp8")
  end)

  it("compares on the device with the CPU's NaN and tolerance rules (diff_stats)", function()
    if not need_gpu() then return end
    for _, dt in ipairs({ "f32", "f64", "bf16" }) do
      fresh_seed()
      local a = al.randn({ 300, 41 }, { dtype = dt })
      local b = (a + al.randn({ 300, 41 }, { dtype = dt }) * 1e-3):to(dt)
      local nan = al.full({ 300, 41 }, 0 / 0, { dtype = dt })
      local mask = al.gt(al.rand({ 300, 41 }), 0.9)
      a = al.where(mask, nan, a)
      b = al.where(mask, nan, b)
      local ag, bg = a:cuda(), b:cuda()
      for _, tol in ipairs({ 1e-1, 2e-3, 1e-5 }) do
        assert.are.equal(al.allclose(a, b, { atol = tol, rtol = tol }), al.allclose(ag, bg, { atol = tol, rtol = tol }),
          "allclose " .. dt .. " tol " .. tol)
      end
      assert.is_true(math.abs(al.max_abs_diff(a, b) - al.max_abs_diff(ag, bg)) <= 1e-12)
      assert.is_true(math.abs(al.rmse(a, b) - al.rmse(ag, bg)) <= 1e-9 * (1 + al.rmse(a, b)))
      assert.is_true(al.allclose(ag:t(), ag:t()), "a view equals itself with NaNs")
      local one_nan = ag:clone()
      one_nan:narrow(1, 1, 1):fill_(0 / 0)
      local m = al.max_abs_diff(bg:clone():fill_(1), one_nan)
      assert.is_true(m ~= m, "NaN against a number makes max_abs_diff NaN")
    end
  end)

  it("returns device memory when tensors are collected and keeps it cached for reuse", function()
    if not need_gpu() then return end
    collectgarbage(); collectgarbage()
    al.cuda.synchronize()
    local start = al.memory().cuda[0].in_use
    -- xs, y and z only hold their tensors while memory is measured; setting them to nil is the point (a
    -- dead stack slot still roots its tensor for LuaJIT's collector), not a dead store
    -- luacheck: push ignore 231 311
    do
      local xs = {}
      for i = 1, 10 do
        xs[i] = al.randn({ 256, 1000 + i }, { device = "cuda" })
        xs[i] = (xs[i] * 2):softmax(-1):sum(1)
      end
      local y = al.matmul(al.randn({ 4, 64, 32 }, { device = "cuda" }), al.randn({ 4, 32, 16 }, { device = "cuda" }):to("bf16"))
      assert.is_true(al.memory().cuda[0].in_use > start)
      assert.is_true(al.cuda.memory_reserved() >= al.memory().cuda[0].in_use)
      xs, y = nil, nil
    end
    collectgarbage(); collectgarbage()
    assert.are.equal(start, al.memory().cuda[0].in_use)
    local reserved = al.cuda.memory_reserved()
    -- the same sizes again come from the cache: nothing new is reserved
    local z = al.randn({ 256, 1001 }, { device = "cuda" })
    assert.are.equal(reserved, al.cuda.memory_reserved())
    z = nil
    -- luacheck: pop
    collectgarbage(); collectgarbage()
    al.cuda.empty_cache()
    assert.is_true(al.cuda.memory_reserved() < reserved)
  end)

  it("times work with events on the plugin's stream", function()
    if not need_gpu() then return end
    local x = al.randn({ 2048, 2048 }, { device = "cuda" })
    local e0, e1 = al.cuda.Event(), al.cuda.Event()
    e0:record()
    local y = al.matmul(x, x)
    e1:record()
    e1:synchronize()
    local ms = e0:elapsed_time(e1)
    assert.is_true(ms > 0 and ms < 10000, "elapsed " .. ms)
    assert.are.same({ 2048, 2048 }, y:size())
    local ok, err = pcall(function() return al.cuda.Event():elapsed_time(al.cuda.Event()) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("record", 1, true), tostring(err))
  end)
end)

describe("cuda streams #gpu", function()
  it("runs work on a user stream, orders streams with events, and restores the default", function()
    if not al.cuda.available() then pending("no GPU") return end
    assert.is_nil(al.cuda.current_stream())
    local s1, s2 = al.cuda.Stream(), al.cuda.Stream()
    al.manual_seed(99)
    local x = al.randn({512, 512}, {device = "cuda"})
    local y
    al.cuda.with_stream(s1, function()
      assert.equal(s1, al.cuda.current_stream())
      y = al.matmul(x, x) -- queued on s1
    end)
    assert.is_nil(al.cuda.current_stream())
    local done = al.cuda.Event():record(s1)
    s2:wait_event(done)
    local z
    al.cuda.with_stream(s2, function() z = y * 2 end) -- ordered after s1's matmul by the event
    s2:synchronize()
    assert.is_true(s1:query() and s2:query())
    local want = al.matmul(x:cpu(), x:cpu()) * 2
    assert.is_true(al.allclose(z:cpu(), want, {atol = 1e-3, rtol = 1e-4}))
    -- an error inside with_stream restores the previous stream
    local ok = pcall(al.cuda.with_stream, s1, function() error("boom") end)
    assert.is_false(ok)
    assert.is_nil(al.cuda.current_stream())
    -- a stream of another device is refused with a message
    local okd, err = pcall(al.cuda.set_stream, nil, 7)
    assert.is_false(okd)
    assert.matches("cuda:7", err)
  end)

  it("pools freed blocks per stream: memory in use returns after work on two streams", function()
    if not al.cuda.available() then pending("no GPU") return end
    collectgarbage(); collectgarbage()
    local before = al.memory().cuda[0].in_use
    local s = al.cuda.Stream()
    for _ = 1, 3 do
      al.cuda.with_stream(s, function() local t = al.randn({1024, 1024}, {device = "cuda"}); local _ = t + 1 end)
      local _ = al.randn({1024, 1024}, {device = "cuda"}) * 3
    end
    s:synchronize()
    collectgarbage(); collectgarbage()
    assert.equal(before, al.memory().cuda[0].in_use)
  end)
end)

describe("al.cuda.backend_info", function()
  it("names the argument for an unknown backend, and says why without CUDA", function()
    assert.has_error(function() al.cuda.backend_info("cpu") end,
      "cuda.backend_info: name: expected 'fused' or 'flash', got cpu")
    assert.has_error(function() al.cuda.backend_info() end,
      "cuda.backend_info: name: expected 'fused' or 'flash', got nil")
    if not HAS_GPU then
      local ok, err = pcall(al.cuda.backend_info, "fused")
      assert.is_false(ok)
      assert.truthy(tostring(err):find("cuda_backend_info", 1, true), tostring(err))
    end
  end)
end)

describe("al.cuda.backend_info #gpu", function()
  it("reports the cuDNN plans and the flash kernels compiled, with counts that follow the calls", function()
    if not need_gpu() then return end
    local text, builds = al.cuda.backend_info("fused")
    assert.truthy(text:find("cudnn=", 1, true), text)
    assert.truthy(builds >= 0, tostring(builds))
    local a = { query_layer = al.randn({ 1, 96, 2, 64 }, { dtype = "bf16", device = "cuda" }), key_layer = al.randn({ 1, 96, 2, 64 },
      { dtype = "bf16", device = "cuda" }), value_layer = al.randn({ 1, 96, 2, 64 }, { dtype = "bf16", device = "cuda" }),
      qkv_format = "bshd", attn_mask_type = "no_mask", softmax_scale = 0.0917, backend = "flash" }
    al.attention.forward(a)
    local ftext, compiled = al.cuda.backend_info("flash")
    assert.truthy(ftext:find("nvrtc=", 1, true) and ftext:find("d64 bf16 nomask", 1, true), ftext)
    assert.truthy(compiled >= 0, tostring(compiled))
  end)
end)

describe("al.cuda.time", function()
  it("checks its arguments before touching a device", function()
    assert.has_error(function() al.cuda.time(3) end, "cuda.time: fn: expected a function, got number")
    assert.has_error(function() al.cuda.time(function() end, { iters = 0 }) end,
      "cuda.time: iters: expected a positive integer, got 0")
    assert.has_error(function() al.cuda.time(function() end, { warmup = -1 }) end,
      "cuda.time: warmup: expected an integer >= 0, got -1")
  end)
end)

describe("al.cuda.time #gpu", function()
  it("calls fn warmup + iters times and returns the mean event time, which grows with the work", function()
    if not need_gpu() then return end
    local calls = 0
    local a = al.randn({ 1024, 1024 }, { device = "cuda" })
    local ms1 = al.cuda.time(function() calls = calls + 1; al.matmul(a, a) end, { warmup = 2, iters = 5 })
    -- warmup (2) + at least iters calls with a steady allocator (5) + iters timed (5)
    assert.is_true(calls >= 12 and calls <= 2 + 256 + 5, tostring(calls))
    assert.is_true(ms1 > 0, tostring(ms1))
    local ms8 = al.cuda.time(function() for _ = 1, 8 do al.matmul(a, a) end end, { warmup = 1, iters = 5 })
    assert.is_true(ms8 > 2 * ms1, string.format("8 matmuls %.4f ms vs 1 matmul %.4f ms", ms8, ms1))
  end)

  it("warms on while the caching allocator still grows, then times a steady state", function()
    if not need_gpu() then return end
    local calls, keep = 0, {}
    collectgarbage()
    al.cuda.empty_cache()   -- no cached block may serve the new ones
    -- the first 20 calls each keep a fresh 4 MiB block (a cudaMalloc each); later calls allocate nothing
    al.cuda.time(function()
      calls = calls + 1
      if calls <= 20 then keep[#keep + 1] = al.empty({ 1024 * 1024 }, { device = "cuda" }) end
    end, { warmup = 2, iters = 5 })
    -- 20 growing calls, then 5 calm ones end the warm-up, then 5 timed: 30
    assert.equal(30, calls)
  end)
end)
