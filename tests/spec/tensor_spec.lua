-- The Lua tensor API: creation, queries, 1-based views, copies, errors, ownership, the FFI layout.
local al = require "attnlab"
local ffi = require "ffi"

describe("tensor creation", function()
  it("makes shapes from tables or numbers, with dtype and device options", function()
    local a = al.empty({2, 3, 4})
    assert.are.same({2, 3, 4}, a:size())
    assert.are.same({12, 4, 1}, a:stride())
    assert.equal("f32", a:dtype())
    assert.equal("cpu", a:device())
    local b = al.zeros(2, 5, {dtype = "bf16"})
    assert.are.same({2, 5}, b:size())
    assert.equal("bf16", b:dtype())
    assert.equal(0, b:totable()[2][5])
    local c = al.full({3}, 2.5, {dtype = "f64"})
    assert.are.same({2.5, 2.5, 2.5}, c:totable())
    assert.are.same({1, 1}, al.ones(2, {dtype = "i32"}):totable())
  end)

  it("arange covers stop, start/stop and steps", function()
    assert.are.same({0, 1, 2, 3}, al.arange(4):totable())
    assert.equal("i64", al.arange(4):dtype())
    assert.are.same({2, 4, 6}, al.arange(2, 8, 2):totable())
    local f = al.arange(0, 1, 0.25)
    assert.equal("f32", f:dtype())
    assert.are.same({0, 0.25, 0.5, 0.75}, f:totable())
  end)

  it("al.tensor reads nested tables and rejects ragged ones", function()
    local t = al.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = "f64"})
    assert.are.same({2, 3}, t:size())
    assert.are.same({{1, 2, 3}, {4, 5, 6}}, t:totable())
    assert.equal(6, t:select(1, 2):select(1, 3):item())
    assert.has_error(function() al.tensor({{1, 2}, {3}}) end,
      "tensor: data: ragged nested table at data[2]: expected 2 entries, got 1")
    assert.equal(true, al.tensor({true, false}):select(1, 1):item())
  end)

  it("randn is reproducible from the seed and not constant", function()
    al.manual_seed(1234)
    local a = al.randn({64}):totable()
    al.manual_seed(1234)
    local b = al.randn({64}):totable()
    assert.are.same(a, b)
    local c = al.randn({64}):totable()
    assert.are_not.same(a, c)
    local distinct = {}
    for _, v in ipairs(a) do distinct[v] = true end
    local n = 0
    for _ in pairs(distinct) do n = n + 1 end
    assert.is_true(n > 60)
  end)

  it("rejects bad options with messages naming the argument", function()
    assert.has_error(function() al.empty({2}, {dtype = "f17"}) end,
      "empty: dtype: expected one of f32 f64 f16 bf16 fp8_e4m3 fp8_e5m2 i32 i64 u8 bool, got f17")
    assert.has_error(function() al.zeros({2}, {device = "gpu"}) end,
      "zeros: device: expected 'cpu', 'cuda' or 'cuda:N', got gpu")
    local ok, err = pcall(al.empty, {2, -3})
    assert.is_false(ok)
    assert.matches("empty: expected non%-negative sizes, got %[2,%-3%]", err)
    ok, err = pcall(al.empty, {1, 2, 3, 4, 5, 6, 7, 8, 9})
    assert.is_false(ok)
    assert.matches("at most 8 dims", err)
  end)
end)

describe("fill_", function()
  -- contiguous tensors take a fast path (one element converted, its bytes repeated or memset), strided
  -- views the element-wise one: both must store exactly what a per-element conversion stores
  it("fills contiguous tensors and strided views of every dtype with the converted value", function()
    for _, dt in ipairs({ "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "fp8_e4m3", "fp8_e5m2" }) do
      for _, v in ipairs({ 0, 1.5, -2, 3 }) do
        local want = al.tensor({ v }, { dtype = dt }):totable()[1]   -- v converted to dt once
        local t = al.randn({ 5, 7 }):to(dt)
        t:fill_(v)
        for _, x in ipairs(t:flat_values()) do assert.equal(want, x, dt .. " contiguous " .. v) end
        local base = al.randn({ 6, 9 }):to(dt)
        local before = base:clone():flat_values()
        local view = base:narrow(2, 2, 5):narrow(1, 2, 4)   -- rows 2..5, columns 2..6
        view:fill_(v)
        local after = base:flat_values()
        for i = 1, 6 do
          for j = 1, 9 do
            local k = (i - 1) * 9 + j
            local inside = i >= 2 and i <= 5 and j >= 2 and j <= 6
            if inside then assert.equal(want, after[k], dt .. " view " .. v)
            else assert.equal(before[k], after[k], dt .. ": outside the view must stay") end
          end
        end
      end
    end
    local z = al.randn({ 3, 4 })
    z:fill_(-0.0)
    assert.equal(-math.huge, 1 / z:flat_values()[12])   -- -0 is not all-zero bytes: copied, not memset
  end)
end)

describe("tensor views", function()
  local base
  before_each(function()
    al.manual_seed(7)
    base = al.randn({2, 4, 3, 5, 6}, {dtype = "f64"})
  end)

  it("select is 1-based, negative from the end, and zero-copy", function()
    local k = base:select(3, 2)
    assert.are.same({2, 4, 5, 6}, k:size())
    assert.are.same({360, 90, 6, 1}, k:stride())
    assert.equal(30, k:storage_offset())
    assert.is_true(k:is_same_storage(base))
    assert.equal(ffi.cast("char *", base:data_ptr()) + 30 * 8, ffi.cast("char *", k:data_ptr()))
    local last = base:select(-3, -1)
    assert.equal(60, last:storage_offset())
    assert.equal(base:totable()[2][3][2][4][5], k:totable()[2][3][4][5])
  end)

  it("writes through a view land in the base", function()
    local v = base:select(1, 2):select(2, 1)
    v:fill_(42)
    assert.equal(42, base:totable()[2][3][1][5][6])
    assert.are_not.equal(42, base:totable()[2][3][2][5][6])
  end)

  it("narrow, transpose, permute, view, expand, unsqueeze, squeeze, unbind", function()
    local n = base:narrow(5, 2, 3)
    assert.are.same({2, 4, 3, 5, 3}, n:size())
    assert.equal(1, n:storage_offset())
    local t = base:transpose(1, 5)
    assert.are.same({6, 4, 3, 5, 2}, t:size())
    assert.is_false(t:is_contiguous())
    assert.equal(base:totable()[2][1][3][4][6], t:totable()[6][1][3][4][2])
    local p = base:permute(5, 4, 3, 2, 1)
    assert.are.same({1, 6, 30, 90, 360}, p:stride())
    local v = base:view(8, -1)
    assert.are.same({8, 90}, v:size())
    local e = al.arange(3):view(3, 1):expand(3, 4)
    assert.are.same({{0, 0, 0, 0}, {1, 1, 1, 1}, {2, 2, 2, 2}}, e:totable())
    assert.are.same({1, 0}, {e:stride(1), e:stride(2)})
    local u = base:unsqueeze(-1)
    assert.are.same({2, 4, 3, 5, 6, 1}, u:size())
    assert.are.same({2, 4, 3, 5, 6}, u:squeeze():size())
    local parts = base:unbind(3)
    assert.equal(3, #parts)
    assert.equal(10, parts[3]:storage_offset() / 6)
  end)

  it("view refuses impossible strides and reshape copies instead", function()
    local t = base:transpose(4, 5)
    assert.has_error(function() t:view(-1) end)
    local r, copied = t:reshape(-1)
    assert.is_true(copied)
    assert.is_false(r:is_same_storage(base))
    local r2, copied2 = base:reshape(-1)
    assert.is_false(copied2)
    assert.is_true(r2:is_same_storage(base))
  end)

  it("out-of-range dims and indices are clear errors", function()
    local ok, err = pcall(base.select, base, 3, 4)
    assert.is_false(ok)
    assert.matches("select: index 4 out of range for dim 3 of size 3", err)
    ok, err = pcall(base.select, base, 6, 1)
    assert.is_false(ok)
    assert.matches("select: dim 6 out of range for a tensor with 5 dims", err)
    ok, err = pcall(base.narrow, base, 2, 3, 3)
    assert.is_false(ok)
    assert.matches("narrow: range start 3 length 3 out of range for dim 2 of size 4", err)
    ok, err = pcall(base.permute, base, 1, 1, 2, 3, 4)
    assert.is_false(ok)
    assert.matches("appears twice", err)
    ok, err = pcall(base.transpose, base, 0, 1)
    assert.is_false(ok)
    assert.matches("transpose: dim0 0 out of range", err)
  end)

  it("as_strided is bounds-checked against the storage", function()
    local s = base:as_strided({2, 3}, {1, 2}, 5)
    assert.equal(base:view(-1):totable()[5 + 1 + 2 + 1], s:totable()[2][2])
    assert.has_error(function() base:as_strided({721}, {1}, 0) end)
  end)
end)

describe("tensor copies", function()
  it("contiguous returns self when already contiguous, clone always copies", function()
    local a = al.randn({3, 4})
    assert.equal(a, a:contiguous())
    local c = a:clone()
    assert.is_false(c:is_same_storage(a))
    assert.are.same(a:totable(), c:totable())
    local t = a:t():contiguous()
    assert.is_true(t:is_contiguous())
    assert.equal(a:totable()[2][3], t:totable()[3][2])
  end)

  it("copy_ converts dtypes and broadcasts", function()
    local src = al.tensor({1.5, -2.25, 3}, {dtype = "f64"})
    local dst = al.empty({2, 3}, {dtype = "bf16"})
    dst:copy_(src)
    assert.are.same({{1.5, -2.25, 3}, {1.5, -2.25, 3}}, dst:totable())
    local i = al.empty({3}, {dtype = "i32"}):copy_(al.tensor({1.9, -2.9, 7}))
    assert.are.same({1, -2, 7}, i:totable())
  end)

  it("to() converts dtype and returns self when nothing changes", function()
    local a = al.randn({5})
    assert.equal(a, a:to("f32"))
    local h = a:to("f16")
    assert.equal("f16", h:dtype())
    assert.is_true(math.abs(h:totable()[1] - a:totable()[1]) <= math.abs(a:totable()[1]) * 2 ^ -10)
    assert.has_error(function() a:to("f17") end)
  end)
end)

describe("ownership and memory", function()
  it("views keep the storage alive after the base handle is collected", function()
    local v
    do
      local base = al.arange(10, {dtype = "f64"})
      v = base:narrow(1, 4, 3)
    end
    collectgarbage()
    collectgarbage()
    assert.are.same({3, 4, 5}, v:totable())
  end)

  it("bytes in use return to where they were after tensors are collected", function()
    collectgarbage()
    collectgarbage()
    local before = al.memory().cpu
    local live = al.memory().storages
    do
      local big = {}
      for i = 1, 10 do big[i] = al.empty({1024, 256}) end
      -- while big holds them: 1 MiB more in use per tensor
      assert.is_true(al.memory().cpu >= before + #big * 1024 * 1024)
    end
    collectgarbage()
    collectgarbage()
    assert.equal(before, al.memory().cpu)
    assert.equal(live, al.memory().storages)
  end)

  it("free() releases early and a freed tensor errors instead of crashing", function()
    local t = al.zeros({4})
    t:free()
    local ok, err = pcall(t.select, t, 1, 1)
    assert.is_false(ok)
    assert.matches("released tensor", err)
  end)

  it("the GC is nudged above the soft limit", function()
    local T = require "attnlab.tensor"
    local old = T.get_soft_limit()
    T.set_soft_limit(8 * 1024 * 1024)
    local n0 = T.gc_stats.collections
    for _ = 1, 40 do al.empty({1024, 1024}) end -- 4 MiB each, never kept
    assert.is_true(T.gc_stats.collections > n0)
    assert.is_true(al.memory().cpu < 200 * 1024 * 1024)
    T.set_soft_limit(old)
  end)
end)

describe("the FFI boundary", function()
  it("hands NaNs with payloads to Lua as plain NaNs (LuaJIT cannot hold payloads)", function()
    local bits = al.empty({4}, {dtype = "i32"})
    local p = ffi.cast("uint32_t *", bits:data_ptr())
    p[0], p[1], p[2], p[3] = 0xFFFFFFFF, 0xFFC00001, 0x7FFFFFFF, 0x3F800000
    local f = al.empty({4}, {dtype = "f32"})
    ffi.copy(f:data_ptr(), bits:data_ptr(), 16)
    local v = f:totable()
    for i = 1, 3 do assert.is_true(v[i] ~= v[i], "element " .. i .. " is a NaN number") end
    assert.equal("number", type(v[1]))
    assert.equal(1, v[4])
    -- the decoders of every 16-bit pattern, negative NaNs included
    local n = 0
    for code = 0xFC01, 0xFFFF do
      local x = al.C.al_f16_bits_to_f32(code)
      if x ~= x then n = n + 1 end
    end
    assert.equal(0xFFFF - 0xFC01 + 1, n)
    -- the storage itself keeps every bit
    assert.equal(0xFFFFFFFF, ffi.cast("uint32_t *", f:data_ptr())[0])
  end)

  it("struct sizes seen by LuaJIT match C's", function()
    local names = {"al_tensor", "al_qkv_unpack_args", "al_attn_params"}
    local checked = 0
    for _, n in ipairs(names) do
      local csize = tonumber(al.C.al_sizeof(n))
      if csize >= 0 then
        assert.equal(csize, ffi.sizeof(n), n)
        checked = checked + 1
      end
    end
    assert.is_true(checked >= 1)
  end)

  it("the cuda namespace answers without a GPU", function()
    local ok, why = al.cuda.available()
    if not ok then
      assert.is_string(why)
      assert.is_true(#why > 0)
      assert.equal(0, al.cuda.device_count())
      local okc, err = pcall(al.zeros, {2}, {device = "cuda"})
      assert.is_false(okc)
      assert.matches("CUDA is not available", err)
      -- device_info (and its launch attributes) is an error that says why, not a crash
      local oki, erri = pcall(al.cuda.device_info, 0)
      assert.is_false(oki)
      assert.truthy(tostring(erri):find("cuda.device_info", 1, true) and tostring(erri):find("not available", 1, true), erri)
    else
      assert.is_true(al.cuda.device_count() >= 1)
      -- a device index past the last: an error naming it
      local n = al.cuda.device_count()
      local oki, erri = pcall(al.cuda.device_info, n)
      assert.is_false(oki)
      assert.truthy(tostring(erri):find("cuda:" .. n, 1, true), erri)
    end
  end)
end)
