-- Layouts (issue 3): TE's vocabulary, declared packed inputs (al.attention.unpack_qkv), every
-- validation error, the no-detection proof, legacy detection (al.attention.detect_layout) and its edge
-- cases, the deprecation warning once per call site, and a property test: declared == detected.
local al = require "attnlab"
local ffi = require "ffi"

local THIS = "layout_spec.lua"

-- pcall fn; expect an error whose message contains needle and points at this file (error level).
local function err_of(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end
local function expect_err(needle, fn)
  local e = err_of(fn)
  assert.truthy(e:find(needle, 1, true), "message '" .. e .. "' lacks '" .. needle .. "'")
  assert.truthy(e:find(THIS, 1, true), "error not raised at the caller: " .. e)
end

local function addr(p) return tonumber(ffi.cast("intptr_t", p)) end

-- view must be buf:select(dim, i): same storage, pointer, strides without dim, same values.
local function check_view(view, buf, dim, i)
  local n = buf:dim()
  local d0 = dim < 0 and n + dim + 1 or dim
  assert.equal(buf:storage_id(), view:storage_id())
  assert.equal(addr(buf:data_ptr()) + (i - 1) * buf:stride()[d0] * buf:element_size(), addr(view:data_ptr()))
  local bs, bz, vs, vz = buf:stride(), buf:size(), view:stride(), view:size()
  local es, ez = {}, {}
  for d = 1, n do if d ~= d0 then es[#es + 1] = bs[d]; ez[#ez + 1] = bz[d] end end
  assert.are.same(es, vs)
  assert.are.same(ez, vz)
  -- values: compared with an independent walk of the buffer's storage through as_strided
  local oracle = buf:as_strided(ez, es, buf:storage_offset() + (i - 1) * bs[d0])
  assert.are.same(oracle:flat_values(), view:flat_values())
end

local function packed_shape(fmt, dim, n, b, s, h, d)
  local outer = fmt == "thd" and { b * s } or fmt == "bshd" and { b, s } or { s, b }
  if dim == -3 then outer[#outer + 1] = n; outer[#outer + 1] = h
  else outer[#outer + 1] = h; outer[#outer + 1] = n end
  outer[#outer + 1] = d
  return outer
end
local function plain_shape(fmt, b, s, h, d)
  local outer = fmt == "thd" and { b * s } or fmt == "bshd" and { b, s } or { s, b }
  outer[#outer + 1] = h; outer[#outer + 1] = d
  return outer
end

describe("layout vocabulary", function()
  local TE = { "sb3hd", "sbh3d", "sbhd_sb2hd", "sbhd_sbh2d", "sbhd_sbhd_sbhd", "bs3hd", "bsh3d", "bshd_bs2hd",
    "bshd_bsh2d", "bshd_bshd_bshd", "t3hd", "th3d", "thd_t2hd", "thd_th2d", "thd_thd_thd", "sbhd_bshd_bshd",
    "bshd_sbhd_sbhd", "thd_bshd_bshd", "thd_sbhd_sbhd", "paged_kv_bshd_bshd_bshd", "paged_kv_bshd_sbhd_sbhd",
    "paged_kv_sbhd_bshd_bshd", "paged_kv_sbhd_sbhd_sbhd", "paged_kv_thd_bshd_bshd", "paged_kv_thd_sbhd_sbhd" }

  it("has TE's 25 layouts in NVTE_QKV_Layout order, parsed and printed", function()
    assert.are.same(TE, al.layouts.names)
    for i, n in ipairs(TE) do
      assert.equal(i - 1, al.layouts.parse(n))
      assert.equal(n, al.layouts.name(i - 1))
    end
    assert.equal(7, al.layouts.parse("BSHD_BS2HD"))
    expect_err("layouts.parse: layout: expected one of TransformerEngine's 25 layout strings", function()
      al.layouts.parse("bhsd_bhsd_bhsd")
    end)
    assert.equal(al.layouts, al.layout)
  end)

  it("answers TE's queries", function()
    local L = al.layouts
    assert.equal("sbhd_2bshd", L.qkv_format("sbhd_bshd_bshd"))
    assert.equal("sbhd_2bshd", L.qkv_format("paged_kv_sbhd_bshd_bshd"))
    assert.equal("thd", L.q_format("paged_kv_thd_sbhd_sbhd"))
    assert.equal("sbhd", L.kv_format("paged_kv_thd_sbhd_sbhd"))
    assert.equal("bshd", L.qkv_format("bsh3d"))
    assert.equal("hd_h2d", L.group("thd_th2d"))
    assert.equal("3hd", L.group("sb3hd"))
    assert.equal("hd_hd_hd", L.group("thd_bshd_bshd"))
    assert.equal("paged_kv_hd_hd_hd", L.group("paged_kv_bshd_bshd_bshd"))
    assert.is_true(L.is_paged("paged_kv_thd_bshd_bshd"))
    assert.is_false(L.is_paged("thd_bshd_bshd"))
    assert.is_true(L.is_packed("bshd_bs2hd"))
    assert.is_false(L.is_packed("bshd_bshd_bshd"))
    assert.equal(3, L.packing("th3d"))
    assert.equal(2, L.packing("sbhd_sb2hd"))
    assert.equal(1, L.packing("sbhd_sbhd_sbhd"))
    assert.equal(-2, L.interleave_dim("bsh3d"))
    assert.equal(-3, L.interleave_dim("thd_t2hd"))
    assert.is_nil(L.interleave_dim("thd_thd_thd"))
    assert.equal("paged_kv_sbhd_sbhd_sbhd", L.paged("sbhd_sbhd_sbhd"))
    expect_err("has no paged_kv_ form", function() L.paged("thd_thd_thd") end)
    local q, kv = L.split_format("thd_2bshd")
    assert.equal("thd", q)
    assert.equal("bshd", kv)
  end)
end)

describe("declared packed inputs (unpack_qkv)", function()
  local CASES = {
    { "bshd", -3, 3, "bs3hd" }, { "bshd", -2, 3, "bsh3d" }, { "bshd", -3, 2, "bshd_bs2hd" },
    { "bshd", -2, 2, "bshd_bsh2d" }, { "sbhd", -3, 3, "sb3hd" }, { "sbhd", -2, 3, "sbh3d" },
    { "sbhd", -3, 2, "sbhd_sb2hd" }, { "sbhd", -2, 2, "sbhd_sbh2d" }, { "thd", -3, 3, "t3hd" },
    { "thd", -2, 3, "th3d" }, { "thd", -3, 2, "thd_t2hd" }, { "thd", -2, 2, "thd_th2d" },
  }
  for _, c in ipairs(CASES) do
    local fmt, dim, n, want = c[1], c[2], c[3], c[4]
    it(want .. ": exact string, zero-copy views of the buffer (" .. (n == 3 and "self" or "cross") .. ")", function()
      al.manual_seed(#want * 7 + n)
      local hk = n == 3 and 4 or 2
      local buf = al.randn(packed_shape(fmt, dim, n, 2, 5, hk, 8))
      local before = al.layouts.detect_calls()
      local q, k, v, layout
      if n == 3 then
        q, k, v, layout = al.attention.unpack_qkv{ qkv_layer = buf, qkv_interleave_dim = dim, qkv_format = fmt }
        check_view(q, buf, dim, 1)
        check_view(k, buf, dim, 2)
        check_view(v, buf, dim, 3)
      else
        local query = al.randn(plain_shape(fmt, 2, 7, 4, 8))
        q, k, v, layout = al.attention.unpack_qkv{ query_layer = query, kv_layer = buf, qkv_interleave_dim = dim,
          qkv_format = fmt }
        assert.is_true(rawequal(q, query))
        check_view(k, buf, dim, 1)
        check_view(v, buf, dim, 2)
      end
      assert.equal(want, layout)
      assert.equal(before, al.layouts.detect_calls())
    end)
  end

  it("a strided, offset buffer (a slice of a bigger one) keeps real strides and offsets", function()
    local big = al.randn({ 3, 6, 4, 5, 16 })
    local buf = big:select(1, 2):narrow(2, 2, 3):narrow(4, 3, 8):unsqueeze(1) -- [1,6,3,5,8], padded rows
    assert.is_true(buf:storage_offset() > 0)
    assert.is_false(buf:is_contiguous())
    local q, k, v, layout = al.attention.unpack_qkv{ qkv_layer = buf, qkv_interleave_dim = -3, qkv_format = "bshd" }
    assert.equal("bs3hd", layout)
    check_view(q, buf, -3, 1)
    check_view(k, buf, -3, 2)
    check_view(v, buf, -3, 3)
  end)

  it("h == 3: the explicit interleave dim decides what the shape cannot", function()
    local buf = al.randn({ 2, 4, 3, 3, 8 })
    local _, k3, _, l3 = al.attention.unpack_qkv{ qkv_layer = buf, qkv_interleave_dim = -3, qkv_format = "bshd" }
    local _, k2, _, l2 = al.attention.unpack_qkv{ qkv_layer = buf, qkv_interleave_dim = -2, qkv_format = "bshd" }
    assert.equal("bs3hd", l3)
    assert.equal("bsh3d", l2)
    check_view(k3, buf, -3, 2)
    check_view(k2, buf, -2, 2)
    assert.are_not.equal(addr(k3:data_ptr()), addr(k2:data_ptr()))
  end)

  it("qkv_format defaults to 'sbhd' and qkv_interleave_dim to -3", function()
    local _, _, _, layout = al.attention.unpack_qkv{ qkv_layer = al.randn({ 4, 2, 3, 2, 8 }) }
    assert.equal("sb3hd", layout)
  end)

  it("separate tensors come back as given with no layout (TE returns None)", function()
    local q, k, v = al.randn({ 2, 3, 4, 8 }), al.randn({ 2, 3, 4, 8 }), al.randn({ 2, 3, 4, 8 })
    local q2, k2, v2, layout = al.attention.unpack_qkv{ query_layer = q, key_layer = k, value_layer = v }
    assert.is_true(rawequal(q, q2) and rawequal(k, k2) and rawequal(v, v2))
    assert.is_nil(layout)
  end)

  it("never runs detection: the C detection counter does not move over 1000 declared calls", function()
    local buf, query = al.randn({ 7, 2, 2, 8 }), al.randn({ 5, 4, 8 })
    local before = al.layouts.detect_calls()
    for _ = 1, 1000 do
      al.attention.unpack_qkv{ query_layer = query, kv_layer = buf, qkv_interleave_dim = -2, qkv_format = "thd" }
      al.attention.unpack_qkv{ qkv_layer = al.randn({ 5, 3, 2, 8 }), qkv_interleave_dim = -3, qkv_format = "thd" }
    end
    assert.equal(before, al.layouts.detect_calls())
    al.warnings.capture(function()
      al.attention.detect_layout(query, buf:select(-2, 1), buf:select(-2, 2), "thd")
    end)
    assert.equal(before + 1, al.layouts.detect_calls()) -- the counter does count detection
  end)
end)

describe("unpack_qkv validation, in TE's order", function()
  local qkv, query, key, value, kv
  before_each(function()
    qkv = al.randn({ 2, 4, 3, 2, 8 })
    query, key, value = al.randn({ 2, 4, 4, 8 }), al.randn({ 2, 4, 4, 8 }), al.randn({ 2, 4, 4, 8 })
    kv = al.randn({ 2, 6, 2, 4, 8 })
  end)
  -- not a tail call, so the error's position is this file
  local U = function(t) return function() local q = al.attention.unpack_qkv(t); return q end end

  it("1. q, k, v required when nothing is packed", function()
    expect_err("unpack_qkv: query_layer, key_layer and value_layer are required unless packed inputs (qkv_layer " ..
      "or kv_layer) are provided; key_layer is missing", U{ query_layer = query, value_layer = value })
  end)
  it("2. qkv_layer and kv_layer are mutually exclusive", function()
    expect_err("unpack_qkv: qkv_layer and kv_layer are mutually exclusive", U{ qkv_layer = qkv, kv_layer = kv })
  end)
  it("3. no packed input with a KV cache (inference_params)", function()
    expect_err("unpack_qkv: packed inputs (qkv_layer/kv_layer) are not supported with KV caching (inference_params)",
      U{ qkv_layer = qkv, qkv_format = "bshd", inference_params = { is_paged = false } })
  end)
  it("4. qkv_interleave_dim is -3 or -2", function()
    expect_err("unpack_qkv: qkv_interleave_dim must be -3 (e.g. bs3hd) or -2 (e.g. bsh3d), got -1",
      U{ qkv_layer = qkv, qkv_interleave_dim = -1, qkv_format = "bshd" })
    expect_err("got 4", U{ qkv_layer = qkv, qkv_interleave_dim = 4, qkv_format = "bshd" })
    expect_err("got -2.5", U{ qkv_layer = qkv, qkv_interleave_dim = -2.5, qkv_format = "bshd" })
  end)
  it("5. the packed tensor's last stride is 1", function()
    expect_err("unpack_qkv: the packed tensor qkv_layer must have stride 1 in its last dimension, got strides " ..
      "(192, 48, 16, 1, 8)", U{ qkv_layer = qkv:transpose(4, 5), qkv_format = "bshd" })
    expect_err("the packed tensor kv_layer must have stride 1",
      U{ query_layer = query, kv_layer = kv:transpose(-1, -2), qkv_format = "bshd" })
  end)
  it("6. qkv_layer: q/k/v nil, rank for the format, size 3 at the interleave dim", function()
    expect_err("unpack_qkv: qkv_layer already packs Q, K and V: query_layer, key_layer and value_layer must be nil " ..
      "(got value_layer)", U{ qkv_layer = qkv, value_layer = value, qkv_format = "bshd" })
    expect_err("unpack_qkv: qkv_layer must be a 4D tensor for qkv_format='thd', got 5D (shape (2, 4, 3, 2, 8))",
      U{ qkv_layer = qkv, qkv_format = "thd" })
    expect_err("unpack_qkv: qkv_layer must be a 5D tensor for qkv_format='sbhd', got 4D",
      U{ qkv_layer = query, qkv_format = "sbhd" })
    expect_err("unpack_qkv: qkv_layer must have size 3 at dim -2 (qkv_interleave_dim), got shape (2, 4, 3, 2, 8)",
      U{ qkv_layer = qkv, qkv_interleave_dim = -2, qkv_format = "bshd" })
  end)
  it("7. kv_layer: query required, k/v nil, one more dim than query, size 2 at the interleave dim", function()
    expect_err("unpack_qkv: kv_layer packs only K and V: query_layer is required", U{ kv_layer = kv, qkv_format = "bshd" })
    expect_err("unpack_qkv: kv_layer already packs K and V: key_layer and value_layer must be nil (got key_layer)",
      U{ kv_layer = kv, query_layer = query, key_layer = key, qkv_format = "bshd" })
    expect_err("unpack_qkv: kv_layer must have one more dimension than query_layer, got kv_layer 4D (shape " ..
      "(2, 4, 4, 8)) and query_layer 4D", U{ kv_layer = key, query_layer = query, qkv_format = "bshd" })
    expect_err("unpack_qkv: kv_layer must have size 2 at dim -2 (qkv_interleave_dim), got shape (2, 6, 2, 4, 8)",
      U{ kv_layer = kv, query_layer = query, qkv_interleave_dim = -2, qkv_format = "bshd" })
  end)
  it("better than TE: rank vs qkv_format, batch, GQA heads, head dims, dtype, format, argument names", function()
    expect_err("unpack_qkv: query_layer must be a 4D tensor for qkv_format='bshd' ([b, s, h, d]), got 3D",
      U{ kv_layer = al.randn({ 8, 2, 2, 8 }), query_layer = al.randn({ 8, 4, 8 }), qkv_format = "bshd" })
    expect_err("same batch size (dim 2 of qkv_format='sbhd'), got 4 and 6",
      U{ kv_layer = kv, query_layer = query, qkv_format = "sbhd" })
    expect_err("unpack_qkv: the number of kv heads must divide the number of query heads (GQA), got 4 kv heads",
      U{ kv_layer = kv, query_layer = al.randn({ 2, 4, 6, 8 }), qkv_format = "bshd" })
    expect_err("unpack_qkv: query_layer and kv_layer must have the same head dim (last dim), got 16 and 8",
      U{ kv_layer = kv, query_layer = al.randn({ 2, 4, 4, 16 }), qkv_format = "bshd" })
    expect_err("unpack_qkv: kv_layer must have query_layer's dtype (f64), got f32",
      U{ kv_layer = kv, query_layer = al.randn({ 2, 4, 4, 8 }, { dtype = "f64" }), qkv_format = "bshd" })
    expect_err("unpack_qkv: qkv_format must be 'sbhd', 'bshd' or 'thd' with packed inputs, got 'sbhd_2bshd'",
      U{ qkv_layer = qkv, qkv_format = "sbhd_2bshd" })
    expect_err("unpack_qkv: qkv_format: expected one of sbhd, bshd, thd", U{ qkv_layer = qkv, qkv_format = "bhsd" })
    expect_err("unpack_qkv: unknown argument 'qkv_interleave'", U{ qkv_layer = qkv, qkv_interleave = -2 })
    expect_err("unpack_qkv: kv_layer: expected a tensor or nil, got table", U{ kv_layer = {}, query_layer = query })
    expect_err("unpack_qkv: expected a table of named arguments", function() al.attention.unpack_qkv(qkv) end)
  end)
end)

describe("legacy detection (detect_layout)", function()
  local function quiet(fn) return al.warnings.capture(fn) end

  it("labels separate tensors hd_hd_hd, mixed formats, and never warns for them", function()
    local q, k, v = al.randn({ 2, 5, 4, 8 }), al.randn({ 2, 5, 4, 8 }), al.randn({ 2, 5, 4, 16 })
    local l1, l2
    local ws = al.warnings.capture(function()
      l1 = al.attention.detect_layout(q, k, v, "bshd")
      l2 = al.attention.detect_layout(q, k, v, "sbhd_2bshd")
    end)
    assert.equal("bshd_bshd_bshd", l1)
    assert.equal("sbhd_bshd_bshd", l2)
    assert.equal(0, #ws)
    assert.equal("paged_kv_bshd_bshd_bshd", al.attention.detect_layout(q, k, v, "bshd", { is_paged = true }))
  end)

  it("recognises every packed layout from declared views, at offset 0 and inside a bigger buffer", function()
    for _, fmt in ipairs({ "sbhd", "bshd", "thd" }) do
      for _, dim in ipairs({ -3, -2 }) do
        local big = al.randn(packed_shape(fmt, dim, 3, 2, 5, 4, 8))
        local q, k, v, want = al.attention.unpack_qkv{ qkv_layer = big, qkv_interleave_dim = dim, qkv_format = fmt }
        quiet(function() assert.equal(want, al.attention.detect_layout(q, k, v, fmt)) end)
        -- big2[2] is the same packing at a non-zero storage offset (TE needs offset 0 and copies)
        local shp = packed_shape(fmt, dim, 3, 2, 5, 4, 8)
        table.insert(shp, 1, 2)
        local inner = al.randn(shp):select(1, 2)
        assert.is_true(inner:storage_offset() > 0)
        q, k, v = al.attention.unpack_qkv{ qkv_layer = inner, qkv_interleave_dim = dim, qkv_format = fmt }
        quiet(function() assert.equal(want, al.attention.detect_layout(q, k, v, fmt)) end)
      end
    end
  end)

  it("q, k, v at irregular offsets of one arena are separate tensors with real strides (TE raises)", function()
    local n1 = 2 * 5 * 4 * 8
    local arena = al.randn({ 3 * n1 + 37 })
    local st = { 160, 32, 8, 1 }
    local v = arena:as_strided({ 2, 5, 4, 8 }, st, 3)
    local k = arena:as_strided({ 2, 5, 4, 8 }, st, 3 + n1 + 11)
    local q = arena:as_strided({ 2, 5, 4, 8 }, st, 3 + 2 * n1 + 30)
    local ws = al.warnings.capture(function()
      assert.equal("bshd_bshd_bshd", al.attention.detect_layout(q, k, v, "bshd"))
    end)
    assert.equal(0, #ws)
  end)

  it("overlapping views at packed-looking offsets are not called packed", function()
    local x = al.randn({ 2, 7, 4, 8 })
    local a, b, c = x:narrow(2, 1, 5), x:narrow(2, 2, 5), x:narrow(2, 3, 5)
    quiet(function() assert.equal("bshd_bshd_bshd", al.attention.detect_layout(a, b, c, "bshd")) end)
  end)

  it("a last stride other than 1 is a clear error naming the tensor", function()
    local q, v = al.randn({ 2, 5, 8, 4 }), al.randn({ 2, 5, 8, 4 })
    local k = al.randn({ 2, 5, 4, 8 }):transpose(3, 4)
    expect_err("detect_layout: q, k and v must have stride 1 in their last dimension, got key_layer with strides " ..
      "(160, 32, 1, 8)", function() al.attention.detect_layout(q, k, v, "bshd") end)
    expect_err("detect_layout: query_layer must be a 3D tensor for q format 'thd', got 4D",
      function() al.attention.detect_layout(q, q, q, "thd") end)
    expect_err("detect_layout: key_layer and value_layer must have the same shape except the head dim",
      function() al.attention.detect_layout(q, q, al.randn({ 2, 6, 8, 4 }), "bshd") end)
    expect_err("detect_layout: value_layer: expected a tensor, got nil",
      function() al.attention.detect_layout(q, q, nil, "bshd") end)
  end)

  it("the GQA split x.split([h*d, hg*d, hg*d], -1) is a packed KV at an offset; the MHA split is bs3hd", function()
    local h, hg, d = 4, 2, 8
    local W = (h + 2 * hg) * d
    local x = al.randn({ 2, 5, W })
    local q = x:narrow(3, 1, h * d):view(2, 5, h, d)
    local k = x:narrow(3, h * d + 1, hg * d):view(2, 5, hg, d)
    local v = x:narrow(3, (h + hg) * d + 1, hg * d):view(2, 5, hg, d)
    quiet(function() assert.equal("bshd_bs2hd", al.attention.detect_layout(q, k, v, "bshd")) end)
    local y = al.randn({ 2, 5, 3 * h * d })
    local q2 = y:narrow(3, 1, h * d):view(2, 5, h, d)
    local k2 = y:narrow(3, h * d + 1, h * d):view(2, 5, h, d)
    local v2 = y:narrow(3, 2 * h * d + 1, h * d):view(2, 5, h, d)
    quiet(function() assert.equal("bs3hd", al.attention.detect_layout(q2, k2, v2, "bshd")) end)
  end)

  it("h == 1: 3hd and h3d are the same memory and TE's first match (3hd) wins", function()
    local buf = al.randn({ 2, 5, 1, 3, 8 })
    local q, k, v, l = al.attention.unpack_qkv{ qkv_layer = buf, qkv_interleave_dim = -2, qkv_format = "bshd" }
    assert.equal("bsh3d", l)
    quiet(function() assert.equal("bs3hd", al.attention.detect_layout(q, k, v, "bshd")) end)
  end)
end)

describe("deprecation warnings for detected packed layouts", function()
  local buf, q, k, v
  before_each(function()
    buf = al.randn({ 2, 5, 4, 2, 8 })
    q = al.randn({ 2, 6, 4, 8 })
    k, v = buf:select(4, 1), buf:select(4, 2)
  end)

  it("fire once per call site, name the layout, and point at kv_layer with qkv_interleave_dim", function()
    local ws = al.warnings.capture(function()
      for _ = 1, 3 do al.attention.detect_layout(q, k, v, "bshd") end -- one site, three calls
      al.attention.detect_layout(q, k, v, "bshd")                      -- a second site
    end)
    assert.equal(2, #ws)
    assert.equal("DeprecationWarning", ws[1].category)
    assert.truthy(ws[1].message:find("detected 'bshd_bsh2d'", 1, true))
    assert.truthy(ws[1].message:find("kv_layer (with qkv_interleave_dim=-2)", 1, true))
    assert.truthy(ws[1].where:find(THIS .. ":%d+$"))
    assert.are_not.equal(ws[1].where, ws[2].where)
    local qkv = al.randn({ 2, 5, 3, 4, 8 })
    local w2 = al.warnings.capture(function()
      al.attention.detect_layout(qkv:select(3, 1), qkv:select(3, 2), qkv:select(3, 3), "bshd")
    end)
    assert.truthy(w2[1].message:find("qkv_layer (with qkv_interleave_dim=-3)", 1, true))
  end)

  it("never fire for separate tensors", function()
    local ws = al.warnings.capture(function()
      for _ = 1, 3 do al.attention.detect_layout(q, al.randn({ 2, 5, 2, 8 }), al.randn({ 2, 5, 2, 8 }), "bshd") end
    end)
    assert.equal(0, #ws)
  end)

  it("follow the filter: always, ignore, error; print to stderr in the documented form", function()
    local old = al.warnings.filter("always")
    local ws = al.warnings.capture(function()
      for _ = 1, 3 do al.attention.detect_layout(q, k, v, "bshd") end
    end)
    assert.equal(3, #ws)
    al.warnings.filter("ignore")
    ws = al.warnings.capture(function() al.attention.detect_layout(q, k, v, "bshd") end)
    assert.equal(0, #ws)
    al.warnings.filter("error")
    expect_err("attnlab: DeprecationWarning: Relying on pointer-based detection", function()
      al.attention.detect_layout(q, k, v, "bshd")
    end)
    al.warnings.filter("once")
    local lines = {}
    local real = io.stderr
    -- luacheck: push ignore 122 (io.stderr swapped to capture the warning, restored below)
    io.stderr = { write = function(_, ...) lines[#lines + 1] = table.concat({ ... }) end }
    local ok, e = pcall(function()
      al.warnings.reset()
      al.attention.detect_layout(q, k, v, "bshd")
    end)
    io.stderr = real
    -- luacheck: pop
    al.warnings.filter(old)
    assert.is_true(ok, e)
    assert.equal(1, #lines)
    assert.truthy(lines[1]:find("^attnlab: DeprecationWarning: Relying on pointer%-based detection of packed q/k/v " ..
      "layouts %(detected 'bshd_bsh2d'%) is deprecated: .* %(at .*" .. THIS .. ":%d+%)\n$"))
    expect_err("warnings.filter: policy: expected 'once', 'always', 'ignore' or 'error', got loud",
      function() al.warnings.filter("loud") end)
  end)
end)

describe("property: declared and detected layouts agree", function()
  it("over random shapes, interleave dims, formats, slices and offsets", function()
    math.randomseed(20260723)
    al.manual_seed(3200)
    local fmts = { "sbhd", "bshd", "thd" }
    local agreed, trials = 0, 300
    for t = 1, trials do
      local fmt = fmts[math.random(3)]
      local dim = math.random(2) == 1 and -3 or -2
      local n = math.random(2) == 1 and 3 or 2
      local b, s, hq, d = math.random(3), math.random(6), math.random(4), math.random(9)
      local hk = n == 3 and hq or ((hq % 2 == 0 and math.random(2) == 1) and hq / 2 or hq)
      local shp = packed_shape(fmt, dim, n, b, s, hk, d)
      -- a bigger buffer, then narrow every dim at a random start: offsets, padding, odd strides
      local bigs = {}
      for i = 1, #shp do bigs[i] = shp[i] + math.random(0, 2) end
      local buf = al.randn(bigs)
      for i = 1, #shp do buf = buf:narrow(i, math.random(1, bigs[i] - shp[i] + 1), shp[i]) end
      local a = { qkv_interleave_dim = dim, qkv_format = fmt }
      if n == 3 then a.qkv_layer = buf
      else
        a.kv_layer = buf
        a.query_layer = al.randn(plain_shape(fmt, b, math.random(6), hq, d))
      end
      local q, k, v, declared = al.attention.unpack_qkv(a)
      local ok, detected = pcall(function()
        local r
        al.warnings.capture(function() r = al.attention.detect_layout(q, k, v, fmt) end)
        return r
      end)
      if ok then
        local want = declared
        local h = n == 3 and hq or hk
        if h == 1 and dim == -2 then want = al.layouts.name(al.layouts.parse(declared) - 1) end
        assert.equal(want, detected, ("trial %d: %s %s"):format(t, declared, table.concat(bigs, "x")))
        agreed = agreed + 1
      end
    end
    assert.equal(trials, agreed) -- detection succeeded (and agreed) every time
  end)
end)

-- Bit-identical outputs need the attention forward (attention.lua, another helper): run when present.
describe("declared, detected and separate inputs through the CPU forward", function()
  if not (al.attention and al.attention.forward) then
    pending("give bit-identical outputs (needs al.attention.forward)")
    return
  end
  it("give bit-identical outputs", function()
    al.manual_seed(77)
    for _, dim in ipairs({ -3, -2 }) do
      local shp = dim == -3 and { 2, 6, 3, 4, 8 } or { 2, 6, 4, 3, 8 }
      local qkv = al.randn(shp)
      local out1 = al.attention.forward{ qkv_layer = qkv, qkv_interleave_dim = dim, qkv_format = "bshd",
        attn_mask_type = "causal", backend = "cpu" }
      local q, k, v = qkv:select(dim, 1), qkv:select(dim, 2), qkv:select(dim, 3)
      local out2
      al.warnings.capture(function()
        out2 = al.attention.forward{ query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd",
          attn_mask_type = "causal", backend = "cpu" }
      end)
      local out3 = al.attention.forward{ query_layer = q:clone(), key_layer = k:clone(), value_layer = v:clone(),
        qkv_format = "bshd", attn_mask_type = "causal", backend = "cpu" }
      local f1, f2, f3 = out1:flat_values(), out2:flat_values(), out3:flat_values()
      assert.equal(#f1, #f3)
      local nonzero = 0
      for i = 1, #f1 do
        if f1[i] ~= 0 then nonzero = nonzero + 1 end
        assert(f1[i] == f2[i] and f1[i] == f3[i], "element " .. i .. " differs")
      end
      assert.is_true(nonzero > #f1 / 2)
    end
  end)
end)

describe("the declared path under the JIT", function()
  it("compiles: no trace aborts for NYI or inner loops inside layout.lua", function()
    local buf = al.randn({2, 16, 3, 4, 8})
    local a = { qkv_layer = buf, qkv_interleave_dim = -3, qkv_format = "bshd" }
    local u = al.attention.unpack_qkv
    local log = os.tmpname()
    local has_jv, jv = pcall(require, "jit.v")
    if not has_jv then pending("LuaJIT's jit.v module is not on package.path here") return end
    -- The first call scans the table's names with pairs() (an inner loop, by design, once per table).
    -- Made here, before tracing is logged: otherwise whether a hot counter starts a trace inside that
    -- one call depends on where the bytecode lies in memory (CI's ASan run once hit it).
    u(a)
    jit.flush()
    jv.start(log)
    for _ = 1, 20000 do u(a) end
    jv.off()
    local f = assert(io.open(log))
    local text = f:read("*a")
    f:close()
    os.remove(log)
    for line in text:gmatch("[^\n]+") do
      if line:find("TRACE ---", 1, true) and line:find("layout.lua", 1, true)
        and (line:find("NYI", 1, true) or line:find("inner loop", 1, true)) then
        error("the declared path aborts a trace: " .. line)
      end
    end
    -- and a fresh table with a misspelt name is still caught
    local ok, err = pcall(u, { qkv_layer = buf, qkv_interleave_dims = -3, qkv_format = "bshd" })
    assert.is_false(ok)
    assert.matches("unknown argument 'qkv_interleave_dims'", err)
  end)
end)
