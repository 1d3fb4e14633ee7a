-- math_spec.lua — tensor math (lua/attnlab/math.lua over src/math.c) against oracles computed here in
-- plain Lua from :totable(), on fresh random inputs, over contiguous, permuted, narrowed and expanded
-- (stride 0) inputs and f32/f64/f16/bf16. The #gpu block runs the same ops on cuda tensors and
-- compares them with the CPU results.
local al = require "attnlab"

-- Tolerance per result dtype (rtol = atol), TE's for half types.
local TOL = { f32 = 2e-6, f64 = 1e-13, f16 = 1e-3, bf16 = 8e-3 }
local DTYPES = { "f32", "f64", "f16", "bf16" }
local seed = 1000
local function fresh_seed() seed = seed + 1; al.manual_seed(seed) end

---------------------------------------------------------------------------------------------------
-- oracle helpers
---------------------------------------------------------------------------------------------------
local function flat(t)
  local nested, shape, out = t:totable(), t:size(), {}
  if #shape == 0 then return { nested }, shape end
  local function walk(x, d)
    if d > #shape then out[#out + 1] = x return end
    for i = 1, #x do walk(x[i], d + 1) end
  end
  walk(nested, 1)
  return out, shape
end

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

-- multi-index (1-based) of flat position p (1-based) in shape
local function unravel(p, shape)
  local idx, r = {}, p - 1
  for d = #shape, 1, -1 do
    idx[d] = r % shape[d] + 1
    r = math.floor(r / shape[d])
  end
  return idx
end

-- flat position of an out-index in an input of shape `s` broadcast to the out's rank
local function bpos(idx, s)
  local p, lead = 0, #idx - #s
  for d = 1, #s do
    local i = s[d] == 1 and 1 or idx[d + lead]
    p = p * s[d] + (i - 1)
  end
  return p + 1
end

local function broadcast(...)
  local shapes, n = { ... }, 0
  for _, s in ipairs(shapes) do n = math.max(n, #s) end
  local out = {}
  for d = 1, n do
    local e = 1
    for _, s in ipairs(shapes) do
      local v = s[d - (n - #s)]
      if v and v ~= 1 then e = v end
    end
    out[d] = e
  end
  return out
end

-- expected values of fn applied element-wise to tensors/numbers (broadcast)
local function ref_elementwise(fn, ...)
  local args, vals, shapes = { ... }, {}, {}
  for i, a in ipairs(args) do
    if type(a) == "number" then vals[i], shapes[i] = { a }, {}
    else vals[i], shapes[i] = flat(a) end
  end
  local shape = broadcast(unpack(shapes))
  local want = {}
  for p = 1, numel(shape) do
    local idx, xs = unravel(p, shape), {}
    for i = 1, #args do xs[i] = vals[i][bpos(idx, shapes[i])] end
    want[p] = fn(unpack(xs))
  end
  return want, shape
end

local function same_shape(got, want, what)
  assert.are.same(want, got, (what or "") .. " shape")
end

local function assert_close(got, want, tol, what)
  assert.are.equal(#want, #got, (what or "") .. ": element count")
  for i = 1, #want do
    local g, w = got[i], want[i]
    local ok = (g == w) or (g ~= g and w ~= w) or math.abs(g - w) <= tol + tol * math.abs(w)
    if not ok then
      error(string.format("%s: element %d: got %.9g, want %.9g (tol %g)", what or "values", i, g, w, tol), 2)
    end
  end
end

-- round a double to the given dtype, for oracles of ops on half types
local function round_to(v, dtype)
  if dtype == "f64" then return v end
  return al.tensor(v, { dtype = dtype }):item()
end

-- Input of a given shape (3-d) built in one of four layouts, all with the same logical shape.
local LAYOUTS = { "contiguous", "permuted", "narrowed", "expanded" }
local function make(layout, shape, dtype)
  fresh_seed()
  local A, B, Cc = shape[1], shape[2], shape[3]
  local o = { dtype = dtype }
  if layout == "contiguous" then return al.randn({ A, B, Cc }, o) end
  if layout == "permuted" then return al.randn({ Cc, A, B }, o):permute(2, 3, 1) end
  if layout == "narrowed" then return al.randn({ A, B + 3, Cc + 2 }, o):narrow(2, 2, B):narrow(3, 3, Cc) end
  if layout == "expanded" then return al.randn({ A, 1, Cc }, o):expand(A, B, Cc) end
  error("unknown layout " .. layout)
end

---------------------------------------------------------------------------------------------------
describe("math: element-wise", function()
  local BIN = {
    add = function(x, y) return x + y end,
    sub = function(x, y) return x - y end,
    mul = function(x, y) return x * y end,
    div = function(x, y) return x / y end,
    maximum = function(x, y) return math.max(x, y) end,
    minimum = function(x, y) return math.min(x, y) end,
  }

  for _, dtype in ipairs(DTYPES) do
    for _, la in ipairs(LAYOUTS) do
      it(string.format("binary ops on %s %s inputs, broadcast against a [3,1] tensor", dtype, la), function()
        local a = make(la, { 2, 3, 4 }, dtype)
        local bs = {
          make("contiguous", { 1, 3, 1 }, dtype):select(1, 1),   -- [3,1]: broadcast (stride 0)
          make("contiguous", { 2, 3, 4 }, dtype),                -- same shape: the dense fast path
        }
        for bi, b in ipairs(bs) do
          for name, fn in pairs(BIN) do
            local got = al[name](a, b)
            assert.are.equal(dtype, got:dtype())
            local want, shape = ref_elementwise(function(x, y) return round_to(fn(x, y), dtype) end, a, b)
            same_shape(got:size(), shape, name)
            assert_close(flat(got), want, TOL[dtype], name .. " " .. dtype .. " " .. la .. " b#" .. bi)
          end
        end
      end)
    end
  end

  it("operators and methods accept a number on either side", function()
    for _, dtype in ipairs({ "f32", "f64" }) do
      local a = make("permuted", { 2, 3, 4 }, dtype)
      local cases = {
        { a + 2.5, function(x) return x + 2.5 end }, { 2.5 + a, function(x) return 2.5 + x end },
        { a - 1.25, function(x) return x - 1.25 end }, { 1.25 - a, function(x) return 1.25 - x end },
        { a * 3, function(x) return x * 3 end }, { 3 * a, function(x) return 3 * x end },
        { a / 4, function(x) return x / 4 end }, { 4 / a, function(x) return 4 / x end },
        { -a, function(x) return -x end }, { a:abs() ^ 1.5, function(x) return math.abs(x) ^ 1.5 end },
        { 2 ^ a, function(x) return 2 ^ x end }, { a:sub(0.5), function(x) return x - 0.5 end },
        { al.sub(0.5, a), function(x) return 0.5 - x end }, { al.pow(a:abs(), 0.5), function(x) return math.abs(x) ^ 0.5 end },
      }
      for i, c in ipairs(cases) do
        assert.are.equal(dtype, c[1]:dtype())
        local want = ref_elementwise(function(x) return round_to(c[2](round_to(x, dtype)), dtype) end, a)
        assert_close(flat(c[1]), want, 4 * TOL[dtype], "case " .. i .. " " .. dtype)
      end
    end
  end)

  it("tensor ^ tensor and al.pow broadcast", function()
    local base = make("narrowed", { 2, 3, 4 }, "f64"):abs() + 0.5
    local ex = make("contiguous", { 1, 1, 4 }, "f64"):select(1, 1)
    local got = base ^ ex
    local want = ref_elementwise(function(x, y) return x ^ y end, base, ex)
    assert_close(flat(got), want, 1e-13, "pow")
    assert_close(flat(al.pow(base, ex)), want, 1e-13, "al.pow")
  end)

  for _, dtype in ipairs(DTYPES) do
    it("unary ops on " .. dtype .. " over every layout", function()
      local U = {
        neg = function(x) return -x end, abs = math.abs, exp = math.exp, tanh = function(x)
          local e = math.exp(2 * x) return (e - 1) / (e + 1) end,
      }
      local P = { log = math.log, sqrt = math.sqrt }   -- on positive inputs
      for _, la in ipairs(LAYOUTS) do
        local a = make(la, { 3, 2, 5 }, dtype)
        for name, fn in pairs(U) do
          local got = a[name](a)
          assert.are.equal(dtype, got:dtype())
          assert_close(flat(got), ref_elementwise(function(x) return round_to(fn(x), dtype) end, a),
            2 * TOL[dtype], name .. " " .. dtype .. " " .. la)
        end
        local pos = (a:abs() + 0.25)
        for name, fn in pairs(P) do
          local got = pos[name](pos)
          assert_close(flat(got), ref_elementwise(function(x) return round_to(fn(x), dtype) end, pos),
            2 * TOL[dtype], name .. " " .. dtype .. " " .. la)
        end
      end
    end)
  end

  it("comparisons give bool tensors and agree with Lua's", function()
    local x = make("permuted", { 2, 3, 4 }, "f32")
    local y = al.maximum(x, 0)      -- equal to x where x >= 0, so eq/ne see both outcomes
    local CMP = {
      eq = function(p, q) return p == q end, ne = function(p, q) return p ~= q end,
      lt = function(p, q) return p < q end, le = function(p, q) return p <= q end,
      gt = function(p, q) return p > q end, ge = function(p, q) return p >= q end,
    }
    local trues = 0
    for name, fn in pairs(CMP) do
      local got = x[name](x, y)
      assert.are.equal("bool", got:dtype())
      local want = ref_elementwise(function(p, q) return fn(p, q) and 1 or 0 end, x, y)
      assert.are.same(want, flat(got), name)
      for _, v in ipairs(want) do trues = trues + v end
      local gs = x[name](x, 0.25)
      assert.are.same(ref_elementwise(function(p) return fn(p, 0.25) and 1 or 0 end, x), flat(gs), name .. " scalar")
    end
    assert.is_true(trues > 0 and trues < 6 * 24)
  end)

  it("mixed dtypes promote, integers stay integers where exact", function()
    local i = al.arange(1, 7):view(2, 3)              -- i64
    local f = make("contiguous", { 1, 2, 3 }, "f16"):select(1, 1)
    assert.are.equal("i64", (i + i):dtype())
    assert.are.same({ { 2, 4, 6 }, { 8, 10, 12 } }, (i + i):totable())
    assert.are.equal("f32", (i / i):dtype())
    assert.are.equal("f32", (i + 0.5):dtype())
    assert.are.equal("i64", (i * 2):dtype())
    local g = i * f
    assert.are.equal("f32", g:dtype())
    assert_close(flat(g), ref_elementwise(function(x, y) return x * y end, i, f), 1e-6, "i64 * f16")
    local h = f + make("contiguous", { 1, 2, 3 }, "bf16"):select(1, 1)
    assert.are.equal("f32", h:dtype())
    assert.are.equal("f64", (make("contiguous", { 1, 2, 3 }, "f32") + make("contiguous", { 1, 2, 3 }, "f64")):dtype())
  end)

  it("where selects with broadcasting, numbers allowed", function()
    local x = make("narrowed", { 2, 3, 4 }, "f32")
    local cond = make("expanded", { 2, 3, 4 }, "f32"):gt(0)
    local b = make("contiguous", { 1, 1, 4 }, "f32"):select(1, 1)  -- [1,4]
    local got = al.where(cond, x, b)
    local want = ref_elementwise(function(c, p, q) return c ~= 0 and p or q end, cond, x, b)
    assert_close(flat(got), want, 0, "where")
    local got2 = al.where(cond, x, -1)
    assert_close(flat(got2), ref_elementwise(function(c, p) return c ~= 0 and p or -1 end, cond, x), 0, "where number")
    local got3 = cond:where(7, x)
    assert_close(flat(got3), ref_elementwise(function(c, p) return c ~= 0 and 7 or p end, cond, x), 0, "method where")
  end)
end)

---------------------------------------------------------------------------------------------------
describe("math: reductions", function()
  -- oracle: reduce flat values of shape over the (1-based, positive) dims set
  local function ref_reduce(t, dims, op)
    local vals, shape = flat(t)
    local red = {}
    if dims == nil then for d = 1, #shape do red[d] = true end
    else
      if type(dims) == "number" then dims = { dims } end
      for _, d in ipairs(dims) do red[d < 0 and #shape + d + 1 or d] = true end
    end
    local kshape = {}
    for d = 1, #shape do kshape[d] = red[d] and 1 or shape[d] end
    local acc, cnt = {}, {}
    for p = 1, #vals do
      local idx = unravel(p, shape)
      for d = 1, #shape do if red[d] then idx[d] = 1 end end
      local q = bpos(idx, kshape)
      local v = vals[p]
      if acc[q] == nil then acc[q], cnt[q] = v, 1
      else
        cnt[q] = cnt[q] + 1
        if op == "sum" or op == "mean" then acc[q] = acc[q] + v
        elseif op == "amax" then acc[q] = math.max(acc[q], v)
        else acc[q] = math.min(acc[q], v) end
      end
    end
    if op == "mean" then for q = 1, #acc do acc[q] = acc[q] / cnt[q] end end
    local squeezed = {}
    for d = 1, #shape do if not red[d] then squeezed[#squeezed + 1] = shape[d] end end
    return acc, kshape, squeezed
  end

  local DIMS = { { nil }, { 1 }, { -1 }, { { 1, 3 } }, { { -1, -2 } }, { { 2 } } }
  for _, dtype in ipairs(DTYPES) do
    for _, la in ipairs(LAYOUTS) do
      it(string.format("sum/mean/amax/amin on %s %s input over single, multiple, negative dims", dtype, la), function()
        local x = make(la, { 3, 4, 5 }, dtype)
        for _, op in ipairs({ "sum", "mean", "amax", "amin" }) do
          for _, dcase in ipairs(DIMS) do
            local dims = dcase[1]
            local want, kshape, squeezed = ref_reduce(x, dims, op)
            local tol = (op == "sum" or op == "mean") and TOL[dtype] * 8 or 0
            local what = op .. " " .. dtype .. " " .. la .. " dims " .. tostring(type(dims) == "table" and table.concat(dims, ",") or dims)
            for _, keep in ipairs({ false, true }) do
              local got = x[op](x, dims, keep)
              assert.are.equal(dtype, got:dtype())
              same_shape(got:size(), keep and kshape or squeezed, what)
              local w = {}
              for i, v in ipairs(want) do w[i] = round_to(v, dtype) end
              assert_close(flat(got), w, tol, what)
            end
          end
        end
      end)
    end
  end

  it("max(dim) gives values and 1-based i64 indices; max() a number", function()
    for _, la in ipairs(LAYOUTS) do
      local x = make(la, { 3, 4, 5 }, "f32")
      local tab = x:totable()
      for _, dim in ipairs({ 1, 2, 3, -1 }) do
        local v, i = x:max(dim)
        assert.are.equal("i64", i:dtype())
        local want = ref_reduce(x, dim, "amax")
        assert_close(flat(v), want, 0, "max values dim " .. dim .. " " .. la)
        -- every index points at its maximum
        local vv, ii = flat(v), flat(i)
        local d = dim < 0 and 3 + dim + 1 or dim
        local kshape = { 3, 4, 5 }
        kshape[d] = 1
        for p = 1, #ii do
          local idx = unravel(p, kshape)
          assert.is_true(ii[p] >= 1 and ii[p] <= ({ 3, 4, 5 })[d])
          idx[d] = ii[p]
          assert.are.equal(vv[p], tab[idx[1]][idx[2]][idx[3]])
        end
        local vk, ik = x:max(dim, true)
        same_shape(vk:size(), kshape)
        same_shape(ik:size(), kshape)
      end
      local all = ref_reduce(x, nil, "amax")[1]
      assert.are.equal(all, x:max())
      assert.are.equal(ref_reduce(x, nil, "amin")[1], x:min())
    end
  end)

  it("sum of integers gives i64, mean of integers f32", function()
    local i = al.arange(0, 12, { dtype = "i32" }):view(3, 4)
    local s = i:sum(2)
    assert.are.equal("i64", s:dtype())
    assert.are.same({ 6, 22, 38 }, s:totable())
    local m = i:mean(1)
    assert.are.equal("f32", m:dtype())
    assert.are.same({ 4, 5, 6, 7 }, m:totable())
    assert.are.equal(66, i:sum():item())
    assert.are.equal(0, i:sum():dim())
  end)
end)

---------------------------------------------------------------------------------------------------
describe("math: softmax", function()
  for _, dtype in ipairs(DTYPES) do
    it("softmax and log_softmax on " .. dtype .. " match the formula, rows sum to 1", function()
      for _, la in ipairs(LAYOUTS) do
        local x = make(la, { 3, 4, 6 }, dtype) * 3
        local vals, shape = flat(x)
        for _, dim in ipairs({ -1, 1, 2 }) do
          local d = dim < 0 and #shape + dim + 1 or dim
          local s, ls = x:softmax(dim), x:log_softmax(dim)
          assert.are.equal(dtype, s:dtype())
          -- oracle: max and sum over the dim for each position
          local want, lwant = {}, {}
          for p = 1, #vals do
            local idx = unravel(p, shape)
            local m = -math.huge
            for j = 1, shape[d] do idx[d] = j; m = math.max(m, vals[bpos(idx, shape)]) end
            local sum = 0
            for j = 1, shape[d] do idx[d] = j; sum = sum + math.exp(vals[bpos(idx, shape)] - m) end
            want[p] = round_to(math.exp(vals[p] - m) / sum, dtype)
            lwant[p] = round_to(vals[p] - m - math.log(sum), dtype)
          end
          local tol = dtype == "f64" and 1e-12 or math.max(TOL[dtype], 2e-6)
          assert_close(flat(s), want, tol, "softmax " .. dtype .. " " .. la .. " dim " .. dim)
          assert_close(flat(ls), lwant, 4 * tol, "log_softmax " .. dtype .. " " .. la .. " dim " .. dim)
          local sums = flat(s:to("f64"):sum(dim))
          for _, v in ipairs(sums) do assert.is_true(math.abs(v - 1) < 8 * tol, "row sum " .. v) end
        end
      end
    end)
  end

  it("is stable for large inputs", function()
    local x = al.tensor({ { 1000, 1001, 1002 }, { -1000, -1000, -1000 } })
    local s = x:softmax(2):totable()
    assert.is_true(math.abs(s[1][3] - 1 / (1 + math.exp(-1) + math.exp(-2))) < 1e-6)
    assert.is_true(math.abs(s[2][1] - 1 / 3) < 1e-6)
  end)
end)

---------------------------------------------------------------------------------------------------
describe("math: matmul", function()
  -- naive oracle with NumPy semantics
  local function ref_matmul(a, b)
    local av, as = flat(a)
    local bv, bs = flat(b)
    local a_vec, b_vec = #as == 1, #bs == 1
    if a_vec then as = { 1, as[1] } end
    if b_vec then bs = { bs[1], 1 } end
    local m, k, n = as[#as - 1], as[#as], bs[#bs]
    local abatch, bbatch = {}, {}
    for d = 1, #as - 2 do abatch[d] = as[d] end
    for d = 1, #bs - 2 do bbatch[d] = bs[d] end
    local batch = broadcast(abatch, bbatch)
    local out = {}
    for p = 1, math.max(numel(batch), 1) do
      local bidx = #batch > 0 and unravel(p, batch) or {}
      local abase = (#abatch > 0 and bpos(bidx, abatch) - 1 or 0) * m * k
      local bbase = (#bbatch > 0 and bpos(bidx, bbatch) - 1 or 0) * k * n
      for i = 1, m do
        for j = 1, n do
          local s = 0
          for l = 1, k do s = s + av[abase + (i - 1) * k + l] * bv[bbase + (l - 1) * n + j] end
          out[#out + 1] = s
        end
      end
    end
    local shape = {}
    for _, e in ipairs(batch) do shape[#shape + 1] = e end
    if not a_vec then shape[#shape + 1] = m end
    if not b_vec then shape[#shape + 1] = n end
    return out, shape
  end

  local function rn(shape, dtype) fresh_seed() return al.randn(shape, { dtype = dtype }) end

  local CASES = {
    { "2-d contiguous", function(dt) return rn({ 3, 5 }, dt), rn({ 5, 4 }, dt) end },
    { "transposed a (CblasTrans)", function(dt) return rn({ 5, 3 }, dt):t(), rn({ 5, 4 }, dt) end },
    { "transposed b (CblasTrans)", function(dt) return rn({ 3, 5 }, dt), rn({ 4, 5 }, dt):t() end },
    { "both transposed", function(dt) return rn({ 5, 3 }, dt):t(), rn({ 4, 5 }, dt):t() end },
    { "no unit stride (packed temporary)", function(dt)
      return rn({ 3, 5, 2 }, dt):select(3, 2), rn({ 5, 3, 4 }, dt):select(2, 3):narrow(2, 1, 4) end },
    { "narrowed rows (lda > k)", function(dt) return rn({ 3, 9 }, dt):narrow(2, 3, 5), rn({ 6, 4 }, dt):narrow(1, 2, 5) end },
    { "batched", function(dt) return rn({ 2, 3, 5 }, dt), rn({ 2, 5, 4 }, dt) end },
    { "broadcast batch", function(dt) return rn({ 2, 1, 3, 5 }, dt), rn({ 3, 5, 4 }, dt) end },
    { "expanded batch (stride 0)", function(dt) return rn({ 1, 3, 5 }, dt):expand(4, 3, 5), rn({ 4, 5, 2 }, dt) end },
    { "permuted batch", function(dt) return rn({ 3, 2, 5 }, dt):permute(2, 1, 3), rn({ 2, 4, 5 }, dt):transpose(2, 3) end },
    { "1-d x 2-d", function(dt) return rn({ 5 }, dt), rn({ 5, 4 }, dt) end },
    { "2-d x 1-d", function(dt) return rn({ 3, 5 }, dt), rn({ 5 }, dt) end },
    { "1-d x 1-d", function(dt) return rn({ 5 }, dt), rn({ 5 }, dt) end },
    { "3-d x 1-d", function(dt) return rn({ 2, 3, 5 }, dt), rn({ 5 }, dt) end },
    { "1-d x 3-d", function(dt) return rn({ 5 }, dt), rn({ 2, 5, 4 }, dt) end },
    { "strided 1-d", function(dt) return rn({ 10 }, dt):as_strided({ 5 }, { 2 }, 0), rn({ 3, 5 }, dt):t() end },
  }
  for _, dtype in ipairs(DTYPES) do
    for _, case in ipairs(CASES) do
      it(case[1] .. " " .. dtype, function()
        local a, b = case[2](dtype)
        local got = al.matmul(a, b)
        assert.are.equal(dtype, got:dtype())
        local want, shape = ref_matmul(a, b)
        same_shape(got:size(), shape, case[1])
        local tol = dtype == "f64" and 1e-12 or dtype == "f32" and 1e-5 or 2 * TOL[dtype]
        assert_close(flat(got), want, tol, case[1] .. " " .. dtype)
        assert_close(flat(a:matmul(b)), flat(got), 0, "method form")
      end)
    end
  end

  it("mixed f32 x f64 gives f64", function()
    local a, b = rn({ 3, 5 }, "f32"), rn({ 5, 2 }, "f64")
    local got = al.matmul(a, b)
    assert.are.equal("f64", got:dtype())
    assert_close(flat(got), (ref_matmul(a, b)), 1e-12, "mixed")
  end)
end)

---------------------------------------------------------------------------------------------------
describe("math: large inputs (work split across threads)", function()
  it("binary, unary, reductions and softmax on a permuted [40,33,64] tensor", function()
    fresh_seed()
    local x = al.randn({ 64, 40, 33 }):permute(2, 3, 1)        -- [40,33,64], no unit stride
    local y = al.randn({ 33, 64 })                             -- broadcast over the first dim
    assert_close(flat(x - y), ref_elementwise(function(p, q) return round_to(p - q, "f32") end, x, y), TOL.f32, "sub")
    assert_close(flat(x:exp()), ref_elementwise(function(p) return round_to(math.exp(p), "f32") end, x), 2 * TOL.f32, "exp")
    local c = x:contiguous()
    assert_close(flat(c * 0.5), ref_elementwise(function(p) return p * 0.5 end, c), 0, "dense scalar")
    local xv, shape = flat(x)
    local s = flat(x:sum({ 1, 3 }))
    local want = {}
    for p = 1, #xv do
      local j = unravel(p, shape)[2]
      want[j] = (want[j] or 0) + xv[p]
    end
    for j = 1, #want do want[j] = round_to(want[j], "f32") end
    assert_close(s, want, 1e-6, "sum")
    local sm = x:softmax(1)
    local sums = flat(sm:to("f64"):sum(1))
    assert.are.equal(33 * 64, #sums)
    for _, v in ipairs(sums) do assert.is_true(math.abs(v - 1) < 1e-5) end
    local v, i = x:max(1)
    local vv, ii = flat(v), flat(i)
    local tab = x:totable()
    for p = 1, #vv do
      local jj, kk = math.floor((p - 1) / 64) + 1, (p - 1) % 64 + 1
      assert.are.equal(vv[p], tab[ii[p]][jj][kk])
    end
  end)
end)

---------------------------------------------------------------------------------------------------
describe("math: comparison helpers", function()
  it("max_abs_diff, rmse and allclose agree with the oracle, across dtypes", function()
    local a = make("permuted", { 2, 3, 4 }, "f64")
    local b = a + make("narrowed", { 2, 3, 4 }, "f64") * 1e-3
    local av, bv = flat(a), flat(b)
    local mx, ss = 0, 0
    for i = 1, #av do
      local d = math.abs(av[i] - bv[i])
      mx = math.max(mx, d)
      ss = ss + d * d
    end
    assert.is_true(math.abs(al.max_abs_diff(a, b) - mx) < 1e-15)
    assert.is_true(math.abs(al.rmse(a, b) - math.sqrt(ss / #av)) < 1e-15)
    assert.is_true(al.allclose(a, b, { atol = mx, rtol = 0 }))
    assert.is_false(al.allclose(a, b, { atol = mx * 0.99, rtol = 0 }))
    assert.is_false(al.allclose(a, b))                     -- defaults 1e-8 / 1e-5
    assert.is_true(al.allclose(a, a:to("f32"), { atol = 1e-6, rtol = 1e-6 }))
    assert.is_true(a:allclose(a + 1e-9))
    -- broadcasting: a row against an expanded copy of itself
    local row = a:select(1, 1):select(1, 1)
    assert.are.equal(0, al.max_abs_diff(row:expand(3, 4), row))
  end)
end)

---------------------------------------------------------------------------------------------------
describe("math: errors", function()
  it("reports shapes that cannot broadcast", function()
    local a, b = al.randn(2, 3), al.randn(4)
    assert.has_error(function() local _ = a + b end, "add: shapes [2,3] and [4] cannot be broadcast (dim 1 from the end: 3 vs 4)")
    assert.has_error(function() al.maximum(a, al.randn(3, 3)) end)
  end)

  it("names both shapes on a matmul inner-dim mismatch", function()
    local ok, err = pcall(al.matmul, al.randn(2, 3), al.randn(4, 5))
    assert.is_false(ok)
    assert.truthy(err:find("matmul: inner dimensions differ: a [2,3] x b [4,5] (3 != 4)", 1, true), err)
    ok, err = pcall(al.matmul, al.arange(6):view(2, 3), al.randn(3, 2))
    assert.is_false(ok)
    assert.truthy(err:find("matmul: integer matmul is not supported (a is i64, b is f32)", 1, true), err)
    ok, err = pcall(al.matmul, al.randn(2, 3), 5)
    assert.is_false(ok)
    assert.truthy(err:find("matmul: b: expected a tensor, got a number", 1, true), err)
  end)

  it("rejects bad dims with 1-based messages", function()
    local x = al.randn(2, 3)
    assert.has_error(function() x:sum(3) end, "sum: dim 3 out of range for a tensor with 2 dims (expected 1..2 or -2..-1)")
    assert.has_error(function() x:mean({ 1, -2 }) end, "mean: dims: dim 1 appears twice (as 1 and -2)")
    assert.has_error(function() x:softmax(0) end, "softmax: dim 0 out of range for a tensor with 2 dims (expected 1..2 or -2..-1)")
    assert.has_error(function() x:softmax() end, "softmax: dim: expected the dim to normalise over (e.g. -1), got nothing")
    assert.has_error(function() x:max(-3) end, "max: dim -3 out of range for a tensor with 2 dims (expected 1..2 or -2..-1)")
    assert.has_error(function() x:amax("a") end, "amax: dims: expected nil, a dim or a table of dims, got a string")
    assert.has_error(function() x:amax({ 1.5 }) end, "amax: dim: expected an integer dim, got 1.5")
  end)

  it("rejects released tensors, bad operands and bad conditions", function()
    local x = al.randn(2, 3)
    local dead = al.randn(2, 3)
    dead:free()
    local ok, err = pcall(function() return x + dead end)
    assert.is_false(ok)
    assert.truthy(err:find("add: b: expected a tensor, got a released tensor", 1, true), err)
    ok, err = pcall(function() return dead:exp() end)
    assert.is_false(ok)
    assert.truthy(err:find("exp: a: expected a tensor, got a released tensor", 1, true), err)
    assert.has_error(function() al.add(1, 2) end, "add: expected at least one tensor, got a number and a number")
    assert.has_error(function() return x + "s" end, "add: b: expected a tensor or a number, got a string")
    assert.has_error(function() al.where(x, x, x) end, "where: cond must be a bool or u8 tensor, got f32")
    assert.has_error(function() al.allclose(x, x, 1) end, "allclose: opts: expected a table {atol=, rtol=}, got a number")
  end)

  it("device mismatch needs a GPU to test", function()
    if not HAS_GPU then pending("no GPU: device mismatch cannot be built") return end
    local ok, err = pcall(function() return al.randn(2) + al.randn(2):cuda() end)
    assert.is_false(ok)
    assert.truthy(err:find("add: a is on cpu, b is on cuda:0", 1, true), err)
  end)
end)

---------------------------------------------------------------------------------------------------
describe("math on cuda #gpu", function()
  local gpu_it = HAS_GPU and it or pending

  -- run f on CPU inputs and on their cuda copies; compare the results (several results allowed)
  local function both(tol, f, ...)
    local cpu_in, gpu_in = { ... }, {}
    for i, t in ipairs(cpu_in) do gpu_in[i] = al.is_tensor(t) and t:cuda() or t end
    local want = { f(unpack(cpu_in)) }
    local got = { f(unpack(gpu_in)) }
    for i = 1, #want do
      if al.is_tensor(want[i]) then
        assert.are.equal("cuda:0", got[i]:device())
        assert.are.same(want[i]:size(), got[i]:size())
        assert.are.equal(want[i]:dtype(), got[i]:dtype())
        assert.is_true(al.allclose(got[i], want[i], { atol = tol, rtol = tol }),
          "max diff " .. al.max_abs_diff(got[i], want[i]))
      else
        assert.is_true(math.abs(got[i] - want[i]) <= tol * (1 + math.abs(want[i])))
      end
    end
  end

  for _, dtype in ipairs(DTYPES) do
    gpu_it("element-wise ops on " .. dtype .. " (strided, broadcast)", function()
      local tol = math.max(TOL[dtype], 1e-6)
      for _, la in ipairs(LAYOUTS) do
        local a = make(la, { 2, 3, 4 }, dtype)
        local b = make("contiguous", { 1, 3, 1 }, dtype):select(1, 1)
        both(tol, function(x, y)
          return x + y, x - y, x * y, x / y, al.maximum(x, y), al.minimum(x, y), x:gt(y), x:eq(x), 2 - x, x * 3,
            -x, x:abs(), x:exp(), (x:abs() + 0.25):log(), (x:abs() + 0.25):sqrt(), x:tanh(), al.where(x:gt(0), x, y)
        end, a, b)
      end
    end)

    gpu_it("reductions, max, softmax on " .. dtype, function()
      local tol = math.max(4 * TOL[dtype], 1e-5)
      for _, la in ipairs(LAYOUTS) do
        local x = make(la, { 3, 4, 5 }, dtype)
        both(tol, function(t)
          local v, i = t:max(2)
          return t:sum(), t:sum({ 1, 3 }), t:mean(-1, true), t:amax(2), t:amin({ -1, -2 }), v, i,
            t:softmax(-1), t:log_softmax(1)
        end, x)
      end
    end)

    gpu_it("matmul on " .. dtype .. " (batched, broadcast, transposed, 1-d)", function()
      local tol = dtype == "f64" and 1e-10 or dtype == "f32" and 1e-4 or 4 * TOL[dtype]
      fresh_seed()
      local a = al.randn({ 2, 1, 8, 16 }, { dtype = dtype })
      local b = al.randn({ 3, 24, 16 }, { dtype = dtype }):transpose(-1, -2)
      local v = al.randn({ 16 }, { dtype = dtype })
      both(tol, function(p, q, r) return al.matmul(p, q), al.matmul(p, r), al.matmul(r, q) end, a, b, v)
    end)
  end

  gpu_it("comparison helpers across devices", function()
    local x = make("permuted", { 2, 3, 4 }, "f32")
    local g = x:cuda()
    assert.are.equal(0, al.max_abs_diff(g, x))
    assert.is_true(al.allclose(g:to("f16"), x, { atol = 1e-2, rtol = 1e-2 }))
    assert.is_true(al.max_abs_diff(g + 1e-3, x) > 0)
  end)
end)
