--[[
attnlab.plot — line, bar, heatmap and histogram figures, written as SVG by Lua (no dependency), and
as PNG through rsvg-convert (Debian librsvg2-bin) or gnuplot (gnuplot-nox) when one is installed.

  local fig = al.plot.line({128, 256, 512}, {1.1, 2.3, 4.0}, {label = "fused", xlabel = "seq len",
                            ylabel = "TFLOP/s", xlog = 2, title = "forward"})
  fig:line({128, 256, 512}, {0.9, 1.8, 3.1}, {label = "unfused"})   -- another series on the same axes
  fig:save("tflops.svg")                  -- or .png (rsvg-convert or gnuplot; a clear error if neither)
  al.plot.heatmap(probs:select(1, b):select(1, h), {xlabel = "key", ylabel = "query"})  -- attention map
  al.plot.bar({"cpu", "unfused"}, {1.0, 7.5}, {ylabel = "speed-up"})
  al.plot.hist(x, {bins = 40})

Data may be Lua lists or tensors (any dtype, any device: values are read back to the CPU). A figure
prints as a one-line summary in the REPL; in a notebook (the attnlab kernel) it is shown as an image:
its __display method returns the MIME bundle {["image/svg+xml"] = svg, ["text/plain"] = summary}.
fig:show() displays it in a notebook, and elsewhere writes a temporary .svg and says where.
]]
local M = {}

local concat, format, floor, log, min, max = table.concat, string.format, math.floor, math.log, math.min, math.max

local PALETTE = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf" }
M.PALETTE = PALETTE

-- The display hook: the notebook kernel sets M.display_hook(bundle) so fig:show() reaches the notebook.
M.display_hook = nil

---------------------------------------------------------------------------------------------------
-- data
---------------------------------------------------------------------------------------------------
local function is_tensor(x)
  if type(x) ~= "cdata" then return false end
  local ok, T = pcall(require, "attnlab.tensor")
  return ok and T.is_tensor(x)
end

-- A 1-D list of numbers from a list or a tensor (a tensor is flattened).
local function numbers(x, fname, argname)
  if is_tensor(x) then
    if x:is_cuda() then x = x:cpu() end
    if x:dtype() ~= "f64" then x = x:to("f64") end
    local n = x:numel()
    return x:contiguous():view(n):totable()
  end
  if type(x) ~= "table" then
    error(format("%s: %s: expected a list of numbers or a tensor, got %s", fname, argname, type(x)), 3)
  end
  local out = {}
  for i = 1, #x do
    local v = tonumber(x[i])
    if v == nil then
      error(format("%s: %s[%d]: expected a number, got %s", fname, argname, i, type(x[i])), 3)
    end
    out[i] = v
  end
  return out
end

-- A matrix (list of rows) from a 2-D tensor or a table of tables.
local function matrix(x, fname)
  if is_tensor(x) then
    if x:dim() ~= 2 then
      error(format("%s: expected a 2-D tensor (pick a batch and a head first, e.g. probs:select(1, b):select(1, h)), got %d dims [%s]",
        fname, x:dim(), concat(x:size(), ",")), 3)
    end
    if x:is_cuda() then x = x:cpu() end
    return x:to("f64"):contiguous():totable()
  end
  if type(x) ~= "table" or type(x[1]) ~= "table" then
    error(fname .. ": expected a 2-D tensor or a table of rows, got " .. type(x), 3)
  end
  local ncol = #x[1]
  for i = 1, #x do
    if type(x[i]) ~= "table" or #x[i] ~= ncol then
      error(format("%s: row %d has %s values, expected %d (rows must have equal length)", fname, i,
        type(x[i]) == "table" and #x[i] or "no", ncol), 3)
    end
  end
  return x
end

local function finite(v) return v == v and v ~= math.huge and v ~= -math.huge end

---------------------------------------------------------------------------------------------------
-- SVG text
---------------------------------------------------------------------------------------------------
local function xml(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;",
    ["'"] = "&apos;" }))
end
M.escape = xml

local function fmt_num(v)
  if v == 0 then return "0" end
  local a = math.abs(v)
  if a < 1e6 and v == floor(v) then return format("%d", v) end   -- 16384, not 1.638e+04
  if a >= 1e5 or a < 1e-3 then return (format("%.2g", v):gsub("e%+?(%-?)0*(%d)", "e%1%2")) end
  local s = format("%.4g", v)
  return s
end
M.format_number = fmt_num

-- "Nice" tick positions covering [lo, hi] (about n of them).
local function nice_ticks(lo, hi, n)
  if hi <= lo then hi = lo + 1 end
  local raw = (hi - lo) / (n or 5)
  local mag = 10 ^ floor(log(raw, 10))
  local step
  for _, m in ipairs({ 1, 2, 2.5, 5, 10 }) do
    step = m * mag
    if step >= raw then break end
  end
  local ticks = {}
  local t = math.ceil(lo / step - 1e-9) * step
  while t <= hi + step * 1e-9 do
    ticks[#ticks + 1] = math.abs(t) < step * 1e-9 and 0 or t
    t = t + step
  end
  return ticks, step
end
M.nice_ticks = nice_ticks

-- An axis maps data values to pixels; log axes use `base` (2, 10, ...).
local function make_axis(lo, hi, p0, p1, base, nticks, integer)
  local ax = { p0 = p0, p1 = p1, base = base }
  if base then
    if lo <= 0 then error("plot: a log axis needs positive values, got " .. fmt_num(lo), 4) end
    local l0, l1 = log(lo, base), log(hi, base)
    if l1 - l0 < 1e-12 then l0, l1 = l0 - 0.5, l1 + 0.5 end
    ax.lo, ax.hi = l0, l1
    ax.map = function(v) return p0 + (log(v, base) - l0) / (l1 - l0) * (p1 - p0) end
    ax.ticks = {}
    for e = math.ceil(l0 - 1e-9), floor(l1 + 1e-9) do ax.ticks[#ax.ticks + 1] = base ^ e end
    if #ax.ticks < 2 then ax.ticks = { lo, hi } end
  else
    if hi - lo < 1e-300 then lo, hi = lo - 0.5, hi + 0.5 end
    local ticks = nice_ticks(lo, hi, nticks or 5)
    if integer then
      local it = {}
      for _, t in ipairs(ticks) do if t == floor(t) then it[#it + 1] = t end end
      ticks = it
    end
    ax.lo, ax.hi = lo, hi
    ax.map = function(v) return p0 + (v - lo) / (hi - lo) * (p1 - p0) end
    ax.ticks = ticks
  end
  return ax
end

local Svg = {}
Svg.__index = Svg
local function svg_new(w, h)
  local s = setmetatable({ w = w, h = h, parts = {} }, Svg)
  s:add(format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
    w, h, w, h))
  s:add(format('<rect class="background" x="0" y="0" width="%d" height="%d" fill="white"/>', w, h))
  return s
end
function Svg:add(str) self.parts[#self.parts + 1] = str end
function Svg:text(x, y, str, attrs)
  self:add(format('<text x="%.1f" y="%.1f"%s>%s</text>', x, y, attrs and (" " .. attrs) or "", xml(str)))
end
function Svg:finish()
  self:add("</svg>")
  return concat(self.parts, "\n") .. "\n"
end

---------------------------------------------------------------------------------------------------
-- figures
---------------------------------------------------------------------------------------------------
local Figure = {}
Figure.__index = Figure
M.Figure = Figure

local function new_figure(kind, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("plot." .. kind .. ": opts: expected a table, got " .. type(opts), 3) end
  return setmetatable({
    kind = kind, series = {},
    width = opts.width or (kind == "heatmap" and 520 or 640), height = opts.height or (kind == "heatmap" and 480 or 400),
    title = opts.title, xlabel = opts.xlabel, ylabel = opts.ylabel,
    xlog = opts.xlog == true and 10 or opts.xlog, ylog = opts.ylog == true and 10 or opts.ylog,
    ymin = opts.ymin, ymax = opts.ymax,
  }, Figure)
end

-- The plotting area inside the margins.
local function frame(fig, right_extra)
  local l, r, t, b = 70, 20 + (right_extra or 0), fig.title and 40 or 20, 55
  return l, fig.width - r, t, fig.height - b
end

local function draw_axes(s, fig, xa, ya, x0, x1, y0, y1, xtick_labels)
  s:add(format('<rect class="plot-area" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>',
    x0, y0, x1 - x0, y1 - y0))
  s:add('<g class="grid" stroke="#ddd" stroke-width="1">')
  for _, t in ipairs(ya.ticks) do
    local y = ya.map(t)
    if y >= y0 - 0.5 and y <= y1 + 0.5 then s:add(format('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>', x0, y, x1, y)) end
  end
  s:add("</g>")
  s:add('<g class="yticks" text-anchor="end">')
  for _, t in ipairs(ya.ticks) do
    local y = ya.map(t)
    if y >= y0 - 0.5 and y <= y1 + 0.5 then s:text(x0 - 6, y + 4, fmt_num(t), 'class="tick"') end
  end
  s:add("</g>")
  s:add('<g class="xticks" text-anchor="middle">')
  if xtick_labels then
    for _, xl in ipairs(xtick_labels) do s:text(xl[1], y1 + 16, xl[2], 'class="tick"') end
  else
    for _, t in ipairs(xa.ticks) do
      local x = xa.map(t)
      if x >= x0 - 0.5 and x <= x1 + 0.5 then
        s:add(format('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>', x, y1, x, y1 + 4))
        s:text(x, y1 + 16, fmt_num(t), 'class="tick"')
      end
    end
  end
  s:add("</g>")
  if fig.xlabel then s:text((x0 + x1) / 2, fig.height - 14, fig.xlabel, 'class="xlabel" text-anchor="middle" font-size="13"') end
  if fig.ylabel then
    local cy = (y0 + y1) / 2
    s:text(16, cy, fig.ylabel, format('class="ylabel" text-anchor="middle" font-size="13" transform="rotate(-90 16 %.1f)"', cy))
  end
  if fig.title then s:text(fig.width / 2, 24, fig.title, 'class="title" text-anchor="middle" font-size="15" font-weight="bold"') end
end

local function draw_legend(s, fig, x1, y0, x0)
  local named = {}
  for i, se in ipairs(fig.series) do if se.label then named[#named + 1] = { i, se } end end
  if #named == 0 then return end
  local wmax = 0
  for _, e in ipairs(named) do wmax = max(wmax, #tostring(e[2].label)) end
  local w, h = 34 + 7 * wmax, 6 + 18 * #named
  -- top left for lines (curves tend to rise to the right), top right otherwise
  local lx, ly = (fig.kind == "line") and (fig.legend_x or 0) or (x1 - w - 8), y0 + 8
  s:add(format('<g class="legend"><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="white" fill-opacity="0.85" stroke="#999"/>',
    lx, ly, w, h))
  for j, e in ipairs(named) do
    local y = ly + 3 + 18 * (j - 1) + 9
    s:add(format('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>', lx + 6, y, lx + 26, y,
      e[2].color, e[2].dash and (' stroke-dasharray="' .. xml(e[2].dash) .. '"') or ""))
    s:text(lx + 30, y + 4, e[2].label, 'class="legend-label"')
  end
  s:add("</g>")
end

local function yrange(fig, lo, hi, zero_based)
  if zero_based and not fig.ylog then lo = min(lo, 0) end
  lo, hi = fig.ymin or lo, fig.ymax or hi
  local pad = (hi - lo) * 0.05
  if not fig.ylog and not fig.ymax and hi > lo then hi = hi + pad end
  if not fig.ylog and not fig.ymin and hi > lo and not zero_based then lo = lo - pad end
  return lo, hi
end

-- fig:line(x, y, opts) adds a series: x and y lists or tensors of equal length (y alone: x = 1..n).
-- opts: label (legend), color, marker (default true for up to 30 points), dash (true or an SVG
-- stroke-dasharray such as "6,3": a dashed line, e.g. a peer's curve beside ours).
function Figure:line(x, y, opts)
  if self.kind ~= "line" then error("fig:line: this is a " .. self.kind .. " figure; lines go on line figures", 2) end
  local function is_opts(t) return type(t) == "table" and not is_tensor(t) and t[1] == nil and next(t) ~= nil end
  if x ~= nil and (y == nil or (is_opts(y) and opts == nil)) then
    x, y, opts = nil, x, y      -- fig:line(y) or fig:line(y, opts)
  end
  local ys = numbers(y, "plot.line", "y")
  local xs
  if x == nil then
    xs = {}
    for i = 1, #ys do xs[i] = i end
  else
    xs = numbers(x, "plot.line", "x")
  end
  if #xs ~= #ys then error(format("plot.line: x has %d values and y has %d; they must match", #xs, #ys), 2) end
  if #ys == 0 then error("plot.line: y: expected at least one value, got none", 2) end
  opts = opts or {}
  self.series[#self.series + 1] = { x = xs, y = ys, label = opts.label,
    color = opts.color or PALETTE[(#self.series) % #PALETTE + 1], marker = opts.marker,
    dash = opts.dash == true and "6,4" or opts.dash }
  return self
end

function Figure:svg_line()
  local s = svg_new(self.width, self.height)
  local x0, x1, y0, y1 = frame(self)
  local xlo, xhi, ylo, yhi = math.huge, -math.huge, math.huge, -math.huge
  for _, se in ipairs(self.series) do
    for i = 1, #se.x do
      if finite(se.x[i]) and finite(se.y[i]) and (not self.ylog or se.y[i] > 0) then
        xlo, xhi = min(xlo, se.x[i]), max(xhi, se.x[i])
        ylo, yhi = min(ylo, se.y[i]), max(yhi, se.y[i])
      end
    end
  end
  if xlo > xhi then xlo, xhi, ylo, yhi = 0, 1, 0, 1 end
  ylo, yhi = yrange(self, ylo, yhi, false)
  local xa = make_axis(xlo, xhi, x0, x1, self.xlog, 6)
  local ya = make_axis(ylo, yhi, y1, y0, self.ylog, 5)
  draw_axes(s, self, xa, ya, x0, x1, y0, y1)
  for i, se in ipairs(self.series) do
    local pts = {}
    for j = 1, #se.x do
      if finite(se.x[j]) and finite(se.y[j]) then
        pts[#pts + 1] = format("%.1f,%.1f", xa.map(se.x[j]), ya.map(se.y[j]))
      end
    end
    s:add(format('<polyline class="series" data-series="%d"%s points="%s" fill="none" stroke="%s" stroke-width="2"%s/>',
      i, se.label and (' data-label="' .. xml(se.label) .. '"') or "", concat(pts, " "), se.color,
      se.dash and (' stroke-dasharray="' .. xml(se.dash) .. '"') or ""))
    local marker = se.marker
    if marker == nil then marker = #se.x <= 30 end
    if marker then
      s:add(format('<g class="markers" fill="%s">', se.color))
      for _, p in ipairs(pts) do
        local px, py = p:match("([^,]+),(.+)")
        s:add(format('<circle cx="%s" cy="%s" r="3"/>', px, py))
      end
      s:add("</g>")
    end
  end
  self.legend_x = x0 + 8
  draw_legend(s, self, x1, y0)
  return s:finish()
end

-- Bars: one value per category, or a list of values per category (grouped; opts.labels names them).
function Figure:svg_bar()
  local s = svg_new(self.width, self.height)
  local x0, x1, y0, y1 = frame(self)
  local cats, groups = self.categories, self.ngroups
  local lo, hi = math.huge, -math.huge
  for _, vs in ipairs(self.values) do
    for _, v in ipairs(vs) do if finite(v) then lo, hi = min(lo, v), max(hi, v) end end
  end
  if lo > hi then lo, hi = 0, 1 end
  lo, hi = yrange(self, lo, hi, true)
  local ya = make_axis(lo, hi, y1, y0, self.ylog, 5)
  local n = #cats
  local slot = (x1 - x0) / n
  local bw = slot * 0.8 / groups
  local labels = {}
  for i = 1, n do labels[i] = { x0 + slot * (i - 0.5), cats[i] } end
  draw_axes(s, self, nil, ya, x0, x1, y0, y1, labels)
  local base = ya.map(self.ylog and ya.ticks[1] or max(lo, min(0, hi)))
  s:add('<g class="bars">')
  for i = 1, n do
    for g = 1, groups do
      local v = self.values[i][g]
      if v and finite(v) then
        local x = x0 + slot * (i - 1) + slot * 0.1 + bw * (g - 1)
        local y = ya.map(v)
        local top, h = min(y, base), math.abs(y - base)
        s:add(format('<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s: %s</title></rect>',
          x, top, bw, h, self.series[g].color, xml(cats[i]), fmt_num(v)))
      end
    end
  end
  s:add("</g>")
  draw_legend(s, self, x1, y0)
  return s:finish()
end

function Figure:svg_hist()
  local s = svg_new(self.width, self.height)
  local x0, x1, y0, y1 = frame(self)
  local h = self.hist
  local cmax = 0
  for _, c in ipairs(h.counts) do cmax = max(cmax, c) end
  local xa = make_axis(h.lo, h.hi, x0, x1, nil, 6)
  local ya = make_axis(0, (self.ymax or cmax * 1.05), y1, y0, nil, 5, true)
  draw_axes(s, self, xa, ya, x0, x1, y0, y1)
  s:add('<g class="bars">')
  for i, c in ipairs(h.counts) do
    local a, b = h.lo + (i - 1) * h.width, h.lo + i * h.width
    local px0, px1, py = xa.map(a), xa.map(b), ya.map(c)
    s:add(format('<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="white" stroke-width="0.5"><title>[%s, %s): %d</title></rect>',
      px0, py, max(px1 - px0, 0.5), y1 - py, PALETTE[1], fmt_num(a), fmt_num(b), c))
  end
  s:add("</g>")
  return s:finish()
end

-- A perceptual colour map (viridis, sampled at 9 points and interpolated).
local VIRIDIS = { { 68, 1, 84 }, { 72, 40, 120 }, { 62, 74, 137 }, { 49, 104, 142 }, { 38, 130, 142 },
  { 31, 158, 137 }, { 53, 183, 121 }, { 110, 206, 88 }, { 181, 222, 43 }, { 253, 231, 37 } }
local function colour(t)
  if t ~= t then return "#cccccc" end
  t = min(max(t, 0), 1) * (#VIRIDIS - 1)
  local i = min(floor(t), #VIRIDIS - 2)
  local f = t - i
  local a, b = VIRIDIS[i + 1], VIRIDIS[i + 2]
  return format("#%02x%02x%02x", floor(a[1] + (b[1] - a[1]) * f + 0.5), floor(a[2] + (b[2] - a[2]) * f + 0.5),
    floor(a[3] + (b[3] - a[3]) * f + 0.5))
end
M.colour = colour

function Figure:svg_heatmap()
  local s = svg_new(self.width, self.height)
  local x0, x1, y0, y1 = frame(self, 60)
  local m, nr, nc = self.cells, self.rows, self.cols
  local lo, hi = self.vmin, self.vmax
  local cw, ch = (x1 - x0) / nc, (y1 - y0) / nr
  s:add('<g class="cells" shape-rendering="crispEdges">')
  for i = 1, nr do
    for j = 1, nc do
      local v = m[i][j]
      local t = finite(v) and (hi > lo and (v - lo) / (hi - lo) or 0.5) or 0 / 0
      s:add(format('<rect class="cell" x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"/>',
        x0 + (j - 1) * cw, y0 + (i - 1) * ch, cw + 0.05, ch + 0.05, colour(t)))
    end
  end
  s:add("</g>")
  s:add(format('<rect class="plot-area" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>',
    x0, y0, x1 - x0, y1 - y0))
  -- index ticks (1-based, in the original matrix's coordinates)
  local function index_ticks(n, orig)
    local t = nice_ticks(1, orig, 5)
    local out = {}
    for _, v in ipairs(t) do if v >= 1 and v <= orig and v == floor(v) then out[#out + 1] = v end end
    if out[1] ~= 1 then table.insert(out, 1, 1) end
    return out
  end
  s:add('<g class="xticks" text-anchor="middle">')
  for _, v in ipairs(index_ticks(nc, self.orig_cols)) do
    s:text(x0 + (v - 0.5) / self.orig_cols * (x1 - x0), y1 + 16, fmt_num(v), 'class="tick"')
  end
  s:add("</g>")
  s:add('<g class="yticks" text-anchor="end">')
  for _, v in ipairs(index_ticks(nr, self.orig_rows)) do
    s:text(x0 - 6, y0 + (v - 0.5) / self.orig_rows * (y1 - y0) + 4, fmt_num(v), 'class="tick"')
  end
  s:add("</g>")
  -- colour bar
  local bx, bw, steps = x1 + 16, 14, 32
  s:add('<g class="colorbar">')
  for k = 1, steps do
    local t = (k - 0.5) / steps
    local y = y1 - k * (y1 - y0) / steps
    s:add(format('<rect x="%.1f" y="%.2f" width="%d" height="%.2f" fill="%s"/>', bx, y, bw, (y1 - y0) / steps + 0.05, colour(t)))
  end
  s:text(bx + bw + 4, y0 + 10, fmt_num(hi), 'class="tick"')
  s:text(bx + bw + 4, y1, fmt_num(lo), 'class="tick"')
  s:add("</g>")
  if self.xlabel then s:text((x0 + x1) / 2, self.height - 14, self.xlabel, 'class="xlabel" text-anchor="middle" font-size="13"') end
  if self.ylabel then
    local cy = (y0 + y1) / 2
    s:text(16, cy, self.ylabel, format('class="ylabel" text-anchor="middle" font-size="13" transform="rotate(-90 16 %.1f)"', cy))
  end
  local title = self.title
  if self.pooled then title = (title and (title .. " ") or "") .. format("(%dx%d shown as %dx%d means)", self.orig_rows, self.orig_cols, nr, nc) end
  if title then s:text(self.width / 2, 24, title, 'class="title" text-anchor="middle" font-size="15" font-weight="bold"') end
  return s:finish()
end

-- fig:svg() -> the figure as an SVG document (a string).
function Figure:svg()
  return self["svg_" .. self.kind](self)
end

---------------------------------------------------------------------------------------------------
-- PNG through an external program
---------------------------------------------------------------------------------------------------
local function have(prog)
  local p = io.popen("command -v " .. prog .. " 2>/dev/null")
  local s = p:read("*a")
  p:close()
  return s:match("%S") ~= nil
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local d = f:read("*a")
  f:close()
  return d
end

local function write_file(path, data, fname)
  local f, err = io.open(path, "wb")
  if not f then error(fname .. ": cannot write " .. tostring(path) .. ": " .. tostring(err), 3) end
  f:write(data)
  f:close()
end

local function shq(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function gp_str(s) return '"' .. tostring(s):gsub('[\\"]', "\\%0") .. '"' end

-- The figure as a gnuplot script that draws it into `out` (pngcairo).
function Figure:gnuplot_script(out)
  local g = { format("set terminal pngcairo size %d,%d enhanced font 'DejaVu Sans,10'", self.width, self.height),
    "set output " .. gp_str(out), "set grid", "set key top right" }
  if self.title then g[#g + 1] = "set title " .. gp_str(self.title) end
  if self.xlabel then g[#g + 1] = "set xlabel " .. gp_str(self.xlabel) end
  if self.ylabel then g[#g + 1] = "set ylabel " .. gp_str(self.ylabel) end
  if self.xlog then g[#g + 1] = "set logscale x " .. self.xlog end
  if self.ylog then g[#g + 1] = "set logscale y " .. self.ylog end
  if self.ymin or self.ymax then g[#g + 1] = format("set yrange [%s:%s]", self.ymin or "*", self.ymax or "*") end
  local data = {}
  if self.kind == "line" then
    local plots = {}
    for _, se in ipairs(self.series) do
      plots[#plots + 1] = format("'-' using 1:2 with linespoints lw 2 lc rgb %s%s title %s", gp_str(se.color),
        se.dash and " dt 2" or "", se.label and gp_str(se.label) or '""')
      for i = 1, #se.x do data[#data + 1] = format("%.17g %.17g", se.x[i], se.y[i]) end
      data[#data + 1] = "e"
    end
    g[#g + 1] = "plot " .. concat(plots, ", ")
  elseif self.kind == "bar" then
    g[#g + 1] = "set style data histogram"
    g[#g + 1] = "set style histogram clustered gap 1"
    g[#g + 1] = "set style fill solid border -1"
    if not self.ymin then g[#g + 1] = "set yrange [0:*]" end
    local plots = {}
    for k, se in ipairs(self.series) do
      plots[#plots + 1] = format("'-' using 2:xtic(1) lc rgb %s title %s", gp_str(se.color), se.label and gp_str(se.label) or '""')
      for i, c in ipairs(self.categories) do
        data[#data + 1] = format("%s %.17g", gp_str(c), self.values[i][k] or 0)
      end
      data[#data + 1] = "e"
    end
    g[#g + 1] = "plot " .. concat(plots, ", ")
  elseif self.kind == "hist" then
    g[#g + 1] = "set style fill solid 0.8 border rgb 'white'"
    g[#g + 1] = "set boxwidth " .. format("%.17g", self.hist.width)
    g[#g + 1] = "plot '-' using 1:2 with boxes lc rgb " .. gp_str(PALETTE[1]) .. " notitle"
    for i, c in ipairs(self.hist.counts) do
      data[#data + 1] = format("%.17g %d", self.hist.lo + (i - 0.5) * self.hist.width, c)
    end
    data[#data + 1] = "e"
  elseif self.kind == "heatmap" then
    g[#g + 1] = "set yrange [] reverse"
    local pal = {}
    for k, c in ipairs(VIRIDIS) do pal[k] = format("%d '#%02x%02x%02x'", k - 1, c[1], c[2], c[3]) end
    g[#g + 1] = "set palette defined (" .. concat(pal, ", ") .. ")"      -- the SVG's colour map
    g[#g + 1] = format("set cbrange [%.17g:%.17g]", self.vmin, self.vmax)
    g[#g + 1] = "plot '-' matrix using ($1+1):($2+1):3 with image notitle"
    for i = 1, self.rows do
      local row = {}
      for j = 1, self.cols do
        local v = self.cells[i][j]
        row[j] = finite(v) and format("%.9g", v) or "NaN"
      end
      data[#data + 1] = concat(row, " ")
    end
    data[#data + 1] = "e"
    data[#data + 1] = "e"
  end
  return concat(g, "\n") .. "\n" .. concat(data, "\n") .. "\n"
end

-- The figure as PNG bytes. Uses rsvg-convert (the SVG, pixel for pixel) when installed, else gnuplot.
-- M.png_tool = "rsvg-convert" | "gnuplot" forces one.
function Figure:png()
  local tmp = os.tmpname()
  local ok_tool
  local tool = M.png_tool
  if tool == nil then
    if have("rsvg-convert") then tool = "rsvg-convert" elseif have("gnuplot") then tool = "gnuplot" end
  end
  if tool == nil then
    os.remove(tmp)
    error("plot: PNG needs rsvg-convert (apt-get install librsvg2-bin) or gnuplot (apt-get install gnuplot-nox);"
      .. " neither is installed. SVG works without them: fig:save('x.svg') or fig:svg()", 2)
  end
  local png = tmp .. ".png"
  local cmd
  if tool == "rsvg-convert" then
    write_file(tmp, self:svg(), "fig:png")
    cmd = "rsvg-convert -f png -o " .. shq(png) .. " " .. shq(tmp)
  elseif tool == "gnuplot" then
    write_file(tmp, self:gnuplot_script(png), "fig:png")
    cmd = "gnuplot " .. shq(tmp)
  else
    os.remove(tmp)
    error("plot: png_tool: expected 'rsvg-convert' or 'gnuplot', got " .. tostring(tool), 2)
  end
  local p = io.popen(cmd .. " 2>&1")
  local msg = p:read("*a")
  p:close()
  ok_tool = read_file(png)
  os.remove(tmp)
  os.remove(png)
  if not ok_tool or #ok_tool < 8 or ok_tool:sub(2, 4) ~= "PNG" then
    error("plot: " .. tool .. " did not produce a PNG: " .. (msg ~= "" and msg or "no message"), 2)
  end
  return ok_tool
end

-- fig:save(path): .svg writes SVG; .png writes PNG (rsvg-convert or gnuplot); .gp writes the gnuplot
-- script (with its data inline) that draws the figure. Returns path.
function Figure:save(path)
  if type(path) ~= "string" then error("fig:save: path: expected a file name ending in .svg, .png or .gp, got " .. type(path), 2) end
  local ext = path:match("%.(%w+)$")
  ext = ext and ext:lower()
  if ext == "svg" then write_file(path, self:svg(), "fig:save")
  elseif ext == "png" then write_file(path, self:png(), "fig:save")
  elseif ext == "gp" then write_file(path, self:gnuplot_script(path:gsub("%.gp$", ".png")), "fig:save")
  else
    error("fig:save: path: expected a name ending in .svg, .png or .gp, got " .. path, 2)
  end
  return path
end

function Figure:__tostring()
  local what
  if self.kind == "line" then what = format("%d series", #self.series)
  elseif self.kind == "bar" then what = format("%d bars", #self.categories * self.ngroups)
  elseif self.kind == "hist" then what = format("%d bins of %d values", #self.hist.counts, self.hist.n)
  else what = format("%dx%d", self.orig_rows, self.orig_cols) end
  return format("<attnlab.plot %s: %s%s, %dx%d px; fig:save('x.svg'|'x.png')>", self.kind, what,
    self.title and (", '" .. self.title .. "'") or "", self.width, self.height)
end

-- The notebook display hook: a MIME bundle.
function Figure:__display()
  return { ["image/svg+xml"] = self:svg(), ["text/plain"] = tostring(self) }
end

-- fig:show(): in a notebook, display now; elsewhere write a temporary .svg and print its path.
function Figure:show()
  if M.display_hook then
    M.display_hook(self:__display())
    return nil
  end
  local path = os.tmpname() .. ".svg"
  self:save(path)
  print("figure written to " .. path)
  return path
end

---------------------------------------------------------------------------------------------------
-- constructors
---------------------------------------------------------------------------------------------------

-- al.plot.line(x, y, opts) or al.plot.line(y, opts): a line figure with one series (add more with
-- fig:line). opts: title, xlabel, ylabel, xlog (true or a base, e.g. 2), ylog, ymin, ymax, width,
-- height, label, color, marker, dash.
function M.line(x, y, opts)
  if (y == nil or (type(y) == "table" and not is_tensor(y) and y[1] == nil and next(y) ~= nil)) and opts == nil then
    x, y, opts = nil, x, y
  end
  local fig = new_figure("line", opts)
  return fig:line(x, y, opts)
end

-- al.plot.figure(opts): an empty line figure to add series to with fig:line(x, y, {label=}).
function M.figure(opts) return new_figure("line", opts) end

-- al.plot.bar(categories, values, opts): one bar per category; values[i] may be a list (grouped bars,
-- opts.labels names the groups). opts as for line, plus labels.
function M.bar(categories, values, opts)
  opts = opts or {}
  if type(categories) ~= "table" then error("plot.bar: categories: expected a list of names, got " .. type(categories), 2) end
  if type(values) ~= "table" and not is_tensor(values) then
    error("plot.bar: values: expected a list of numbers (or of lists, for grouped bars) or a tensor, got " .. type(values), 2)
  end
  local fig = new_figure("bar", opts)
  local vals, groups = {}, 1
  if is_tensor(values) or type(values[1]) ~= "table" then
    local flat = numbers(values, "plot.bar", "values")
    for i = 1, #flat do vals[i] = { flat[i] } end
  else
    for i = 1, #values do
      vals[i] = numbers(values[i], "plot.bar", "values[" .. i .. "]")
      groups = max(groups, #vals[i])
    end
  end
  if #vals ~= #categories then
    error(format("plot.bar: %d categories but %d values; they must match", #categories, #vals), 2)
  end
  if #vals == 0 then error("plot.bar: values: expected at least one value, got none", 2) end
  fig.categories, fig.values, fig.ngroups = {}, vals, groups
  for i = 1, #categories do fig.categories[i] = tostring(categories[i]) end
  local labels = opts.labels or (opts.label and { opts.label }) or {}
  for g = 1, groups do
    fig.series[g] = { label = labels[g], color = (opts.colors and opts.colors[g]) or PALETTE[(g - 1) % #PALETTE + 1] }
  end
  return fig
end

-- al.plot.hist(values, opts): a histogram. opts.bins (default: Sturges' rule, at most 60), opts.range
-- {lo, hi}; non-finite values are left out (and counted in the summary line). Other opts as for line.
function M.hist(values, opts)
  opts = opts or {}
  local v = numbers(values, "plot.hist", "values")
  local fin, dropped = {}, 0
  for i = 1, #v do if finite(v[i]) then fin[#fin + 1] = v[i] else dropped = dropped + 1 end end
  if #fin == 0 then error("plot.hist: values: expected at least one finite value, got " .. #v .. " values, none finite", 2) end
  local lo, hi = math.huge, -math.huge
  for _, x in ipairs(fin) do lo, hi = min(lo, x), max(hi, x) end
  if opts.range then lo, hi = opts.range[1], opts.range[2] end
  if hi <= lo then lo, hi = lo - 0.5, hi + 0.5 end
  local bins = opts.bins or min(60, math.ceil(log(#fin, 2)) + 1)
  if type(bins) ~= "number" or bins < 1 or bins ~= floor(bins) then
    error("plot.hist: bins: expected a positive integer, got " .. tostring(bins), 2)
  end
  local counts = {}
  for i = 1, bins do counts[i] = 0 end
  local w = (hi - lo) / bins
  for _, x in ipairs(fin) do
    if x >= lo and x <= hi then
      local b = min(floor((x - lo) / w) + 1, bins)
      counts[b] = counts[b] + 1
    end
  end
  local fig = new_figure("hist", opts)
  fig.hist = { lo = lo, hi = hi, width = w, counts = counts, n = #fin, dropped = dropped }
  fig.ylabel = fig.ylabel or "count"
  return fig
end

-- al.plot.heatmap(m, opts): a 2-D tensor or table of rows as coloured cells (row 1 on top), with a
-- colour bar; for attention maps pass probs for one batch and head (probs:select(1, b):select(1, h)).
-- Matrices larger than opts.max_cells (default 128) per side are shown as block means. Non-finite
-- cells (masked -inf scores) are grey. opts.vmin/vmax fix the colour range.
function M.heatmap(m, opts)
  opts = opts or {}
  local rows = matrix(m, "plot.heatmap")
  local nr, nc = #rows, #rows[1]
  if nr == 0 or nc == 0 then error("plot.heatmap: expected a non-empty matrix", 2) end
  local cap = opts.max_cells or 128
  local fr, fc = math.ceil(nr / cap), math.ceil(nc / cap)
  local cells = rows
  if fr > 1 or fc > 1 then
    cells = {}
    for i = 1, math.ceil(nr / fr) do
      cells[i] = {}
      for j = 1, math.ceil(nc / fc) do
        local sum, n = 0, 0
        for a = (i - 1) * fr + 1, min(i * fr, nr) do
          for b = (j - 1) * fc + 1, min(j * fc, nc) do
            local v = rows[a][b]
            if finite(v) then sum, n = sum + v, n + 1 end
          end
        end
        cells[i][j] = n > 0 and sum / n or 0 / 0
      end
    end
  end
  local lo, hi = math.huge, -math.huge
  for i = 1, #cells do
    for j = 1, #cells[i] do
      local v = cells[i][j]
      if finite(v) then lo, hi = min(lo, v), max(hi, v) end
    end
  end
  if lo > hi then lo, hi = 0, 1 end
  local fig = new_figure("heatmap", opts)
  fig.cells, fig.rows, fig.cols = cells, #cells, #cells[1]
  fig.orig_rows, fig.orig_cols, fig.pooled = nr, nc, (fr > 1 or fc > 1)
  fig.vmin, fig.vmax = opts.vmin or lo, opts.vmax or hi
  return fig
end

function M.install(al)
  al.plot = M
end

return M
