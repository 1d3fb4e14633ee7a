-- plot_spec.lua — al.plot's SVG checked structurally: well-formed XML (a small parser here, and
-- xmllint when installed), one element per series/bar/bin/cell, axis labels and titles present and
-- escaped, data mapped inside the plotting area; PNG through rsvg-convert/gnuplot when installed
-- (else the clear error); argument errors that name the argument.
local al = require "attnlab"

-- A minimal XML well-formedness check: every tag closed in order, attributes quoted, entities known.
local function parse_xml(s)
  local stack, counts, texts = {}, {}, {}
  local i = 1
  s = s:gsub("^<%?xml.-%?>%s*", "")
  while i <= #s do
    local lt = s:find("<", i, true)
    if not lt then
      assert(s:sub(i):match("^%s*$"), "text outside the root element")
      break
    end
    local text = s:sub(i, lt - 1)
    for amp in text:gmatch("&[^;]*;?") do
      assert(({ ["&amp;"] = 1, ["&lt;"] = 1, ["&gt;"] = 1, ["&quot;"] = 1, ["&apos;"] = 1 })[amp], "bad entity " .. amp)
    end
    if #stack > 0 and text:match("%S") then texts[#texts + 1] = { tag = stack[#stack].name, text = text } end
    local gt = s:find(">", lt, true)
    assert(gt, "unclosed tag at " .. lt)
    local tag = s:sub(lt + 1, gt - 1)
    if tag:sub(1, 1) == "/" then
      local name = tag:sub(2):match("^%s*([%w:_-]+)%s*$")
      local top = table.remove(stack)
      assert(top and top.name == name, "mismatched </" .. tostring(name) .. "> for <" .. tostring(top and top.name) .. ">")
    else
      local selfclose = tag:sub(-1) == "/"
      if selfclose then tag = tag:sub(1, -2) end
      local name, rest = tag:match("^([%w:_-]+)(.*)$")
      assert(name, "bad tag <" .. tag .. ">")
      local attrs = {}
      local stripped = rest:gsub('%s+([%w:_-]+)="([^"<]*)"', function(k, v)
        assert(attrs[k] == nil, "duplicate attribute " .. k)
        attrs[k] = v
        return ""
      end)
      assert(stripped:match("^%s*$"), "unquoted or malformed attributes in <" .. name .. rest .. ">")
      counts[name] = (counts[name] or 0) + 1
      local el = { name = name, attrs = attrs }
      counts[#counts + 1] = el
      if not selfclose then stack[#stack + 1] = el end
    end
    i = gt + 1
  end
  assert(#stack == 0, "unclosed <" .. (stack[1] and stack[1].name or "?") .. ">")
  return counts, texts
end

local function elements(counts, name, class)
  local out = {}
  for _, el in ipairs(counts) do
    if el.name == name and (class == nil or el.attrs.class == class) then out[#out + 1] = el end
  end
  return out
end

local function has_text(texts, class_text)
  for _, t in ipairs(texts) do if t.text == class_text then return true end end
  return false
end

local function have(prog) return os.execute("command -v " .. prog .. " >/dev/null 2>&1") == 0 end

describe("al.plot", function()
  it("line: one polyline per series with one point per value, labels, title and legend", function()
    local xs = { 128, 256, 512, 1024, 2048 }
    local y1, y2 = {}, {}
    for i = 1, #xs do y1[i] = math.random() * 10; y2[i] = math.random() * 5 end
    local fig = al.plot.line(xs, y1, { label = "fused <a&b>", xlabel = "seq len", ylabel = "TFLOP/s", title = "fwd", xlog = 2 })
    fig:line(xs, y2, { label = "unfused" })
    local svg = fig:svg()
    local counts, texts = parse_xml(svg)
    assert.equal(1, counts.svg)
    local lines = elements(counts, "polyline", "series")
    assert.equal(2, #lines)
    for _, l in ipairs(lines) do
      local n = 0
      for px, py in l.attrs.points:gmatch("([%d.-]+),([%d.-]+)") do
        n = n + 1
        px, py = tonumber(px), tonumber(py)
        assert.is_true(px >= 70 - 0.5 and px <= 620 + 0.5 and py >= 40 - 0.5 and py <= 345 + 0.5, "point outside the plot area")
      end
      assert.equal(#xs, n)
    end
    assert.is_true(has_text(texts, "seq len"))
    assert.is_true(has_text(texts, "TFLOP/s"))
    assert.is_true(has_text(texts, "fwd"))
    assert.is_true(has_text(texts, "fused &lt;a&amp;b&gt;"), "legend label escaped")
    assert.is_true(has_text(texts, "unfused"))
    -- log2 axis: ticks at the powers of two
    for _, t in ipairs({ "128", "256", "512", "1024", "2048" }) do assert.is_true(has_text(texts, t), "tick " .. t) end
    -- the larger y value is higher on the page (smaller y coordinate)
    local pts = {}
    for _, py in lines[1].attrs.points:gmatch("([%d.-]+),([%d.-]+)") do pts[#pts + 1] = tonumber(py) end
    local imax, imin = 1, 1
    for i = 1, #y1 do
      if y1[i] > y1[imax] then imax = i end
      if y1[i] < y1[imin] then imin = i end
    end
    assert.is_true(pts[imax] < pts[imin])
  end)

  it("line: y alone gets x = 1..n; tensors are accepted", function()
    al.manual_seed(3)
    local fig = al.plot.line(al.randn { 7 })
    local counts = parse_xml(fig:svg())
    local n = select(2, elements(counts, "polyline", "series")[1].attrs.points:gsub(",", ""))
    assert.equal(7, n)
  end)

  it("bar: one rect per bar (grouped: categories x groups)", function()
    local fig = al.plot.bar({ "cpu", "unfused", "fused" }, { { 1, 2 }, { 7.5, 6 }, { 12, 11 } }, { labels = { "fwd", "bwd" }, ylabel = "speed-up" })
    local counts, texts = parse_xml(fig:svg())
    assert.equal(6, #elements(counts, "rect", "bar"))
    for _, c in ipairs({ "cpu", "unfused", "fused", "speed-up", "fwd", "bwd" }) do assert.is_true(has_text(texts, c), c) end
    local single = parse_xml(al.plot.bar({ "a", "b", "c", "d" }, { 4, 3, 2, 1 }):svg())
    assert.equal(4, #elements(single, "rect", "bar"))
  end)

  it("hist: one rect per bin, counts adding up to the number of values", function()
    al.manual_seed(5)
    local x = al.randn { 500 }
    local fig = al.plot.hist(x, { bins = 12, xlabel = "value" })
    local counts, texts = parse_xml(fig:svg())
    local bars = elements(counts, "rect", "bar")
    assert.equal(12, #bars)
    local total = 0
    for _, c in ipairs(fig.hist.counts) do total = total + c end
    assert.equal(500, total)
    assert.is_true(has_text(texts, "value"))
    assert.is_true(has_text(texts, "count"))
  end)

  it("heatmap: one cell per entry, row 1 on top, colours ordered by value, masked cells grey", function()
    local m = {}
    for i = 1, 5 do
      m[i] = {}
      for j = 1, 7 do m[i][j] = j > i + 2 and -math.huge or (i * 7 + j) end
    end
    local fig = al.plot.heatmap(m, { xlabel = "key", ylabel = "query" })
    local counts, texts = parse_xml(fig:svg())
    local cells = elements(counts, "rect", "cell")
    assert.equal(35, #cells)
    assert.is_true(has_text(texts, "key") and has_text(texts, "query"))
    assert.equal("#cccccc", cells[7].attrs.fill)             -- m[1][7] = -inf
    assert.is_true(tonumber(cells[1].attrs.y) < tonumber(cells[8].attrs.y))   -- row 2 below row 1
    assert.equal(al.plot.colour(0), cells[1].attrs.fill)     -- the smallest finite value
    assert.equal(al.plot.colour(1), cells[35].attrs.fill)    -- the largest
  end)

  it("heatmap of attention probabilities from a tensor; big maps are pooled", function()
    al.manual_seed(7)
    local q, k = al.randn { 300, 8 }, al.randn { 200, 8 }
    local probs = al.matmul(q, k:t()):softmax(-1)
    local fig = al.plot.heatmap(probs)
    local counts = parse_xml(fig:svg())
    assert.equal(math.ceil(300 / 3) * math.ceil(200 / 2), #elements(counts, "rect", "cell"))
    assert.has_error(function() al.plot.heatmap(al.randn { 2, 3, 4 }) end)
    local ok, err = pcall(al.plot.heatmap, al.randn { 2, 3, 4 })
    assert.is_false(ok)
    assert.truthy(err:find("2-D", 1, true))
  end)

  it("figures print a summary and give a notebook MIME bundle", function()
    local fig = al.plot.line({ 1, 2, 3 }, { title = "t" })
    assert.truthy(tostring(fig):find("attnlab.plot line", 1, true))
    local b = fig:__display()
    assert.equal(fig:svg(), b["image/svg+xml"])
    assert.equal(tostring(fig), b["text/plain"])
  end)

  it("save: svg always; png through rsvg-convert or gnuplot, or a clear error", function()
    local fig = al.plot.hist({ 1, 2, 2, 3, 3, 3, 4 }, { bins = 4 })
    local path = os.tmpname()
    fig:save(path .. ".svg")
    local f = assert(io.open(path .. ".svg"))
    local svg = f:read("*a")
    f:close()
    assert.equal(fig:svg(), svg)
    if have("xmllint") then assert.equal(0, (os.execute("xmllint --noout " .. path .. ".svg"))) end
    os.remove(path .. ".svg")
    if have("rsvg-convert") or have("gnuplot") then
      for _, tool in ipairs({ "rsvg-convert", "gnuplot" }) do
        if have(tool) then
          al.plot.png_tool = tool
          fig:save(path .. ".png")
          al.plot.png_tool = nil
          local g = assert(io.open(path .. ".png", "rb"))
          local head = g:read(8)
          g:close()
          assert.equal("\137PNG\r\n\26\n", head, tool)
          os.remove(path .. ".png")
        end
      end
    else
      local ok, err = pcall(fig.save, fig, path .. ".png")
      assert.is_false(ok)
      assert.truthy(err:find("rsvg-convert", 1, true))
    end
    os.remove(path)
    assert.has_error(function() fig:save(path .. ".jpg") end)
  end)

  it("argument errors name the function and the argument", function()
    local ok, err = pcall(al.plot.line, { 1, 2 }, { 1, 2, 3 })
    assert.is_false(ok)
    assert.truthy(err:find("plot.line", 1, true) and err:find("x has 2", 1, true))
    ok, err = pcall(al.plot.bar, { "a" }, { 1, 2 })
    assert.truthy(not ok and err:find("plot.bar", 1, true))
    ok, err = pcall(al.plot.hist, { 1, 2 }, { bins = 0 })
    assert.truthy(not ok and err:find("bins", 1, true))
    ok, err = pcall(al.plot.line, "nope")
    assert.truthy(not ok and err:find("expected a list of numbers or a tensor", 1, true))
  end)
end)
