-- scripts/bench_report.lua — the benchmark report: TFLOP/s against sequence length, one chart per
-- (direction, mask, head dim), one curve per backend, the peer's (PyTorch SDPA) curves dashed beside ours.
--
--   scripts/attnlab scripts/bench_report.lua [--out DIR] [--layout separate|bs3hd|all] [--no-png] FILE...
--
-- FILEs are JSON-lines files in either writer's format (mixed freely, in any number):
--   ours    bench/attention_gpu_bench.lua and bench/flash_bench.lua with ATTNLAB_BENCH_OUT=FILE:
--           {"source": "attnlab", "kind": "attention", "b", "h", "s", "d", "mask", "layout", "backend"
--           (fused, flash, unfused), "fwd_tflops", "bwd_tflops", ...}
--   peer    scripts/peer_torch_sdpa.py --out FILE (or its stdout: lines "JSON {...}"): the same fields with
--           "source": "torch" and backend torch_flash, torch_cudnn, torch_efficient.
-- Records with "error" (a backend refusing a shape), other kinds (env, host_overhead, host_phase) and
-- lines that are not JSON are left out of the curves (env records name the device in the index); a
-- later measurement of the same (backend, layout, direction, mask, d, s) replaces an earlier one.
--
-- Writes into DIR (default ./bench_report): <dir>_<mask>_d<d>.svg per chart (suffixed _bs3hd / _all for
-- the other layout choices), the same as .png when rsvg-convert or gnuplot is installed (not with
-- --no-png), and index.md listing the charts with their numbers as tables.
-- --layout: which input layout to chart: "separate" (default; q, k, v tensors), "bs3hd" (one packed
-- buffer), or "all" (one curve per backend and layout, labelled "fused bs3hd" etc.).
local plot = require "attnlab.plot"
local json = require "attnlab.json"

local USAGE = "usage: scripts/attnlab scripts/bench_report.lua [--out DIR] [--layout separate|bs3hd|all] [--no-png] FILE..."

local function die(msg)
  io.stderr:write("bench_report: ", msg, "\n")
  os.exit(2)
end

---------------------------------------------------------------------------------------------------
-- arguments
---------------------------------------------------------------------------------------------------
local out_dir, layout_sel, want_png, files = "bench_report", "separate", true, {}
do
  local i = 1
  while i <= #arg do
    local a = arg[i]
    if a == "--out" then
      out_dir = arg[i + 1] or die("--out: expected a folder name\n" .. USAGE)
      i = i + 1
    elseif a == "--layout" then
      layout_sel = arg[i + 1]
      if layout_sel ~= "separate" and layout_sel ~= "bs3hd" and layout_sel ~= "all" then
        die("--layout: expected separate, bs3hd or all, got " .. tostring(layout_sel))
      end
      i = i + 1
    elseif a == "--no-png" then
      want_png = false
    elseif a == "-h" or a == "--help" then
      print(USAGE)
      os.exit(0)
    elseif a:sub(1, 2) == "--" then
      die("unknown option " .. a .. "\n" .. USAGE)
    else
      files[#files + 1] = a
    end
    i = i + 1
  end
end
if #files == 0 then die("no input files\n" .. USAGE) end

---------------------------------------------------------------------------------------------------
-- reading
---------------------------------------------------------------------------------------------------
local records, envs, skipped, errors = {}, {}, 0, 0

-- One line of either writer -> a table, or nil (not a record). Our Lua writers print NaN/inf with
-- %.6g ("nan", "inf"), which is not JSON: those become null.
local function parse_line(line)
  line = line:match("^%s*(.-)%s*$"):gsub("^JSON ", "")
  if line:sub(1, 1) ~= "{" then return nil end
  line = line:gsub("(:%s*)%-?nan", "%1null"):gsub("(:%s*)%-?inf", "%1null")
  local ok, v = pcall(json.decode, line)
  if not ok or type(v) ~= "table" then return nil, true end
  for k, x in pairs(v) do if x == json.null then v[k] = nil end end
  return v
end

for _, path in ipairs(files) do
  local f, err = io.open(path, "r")
  if not f then die("cannot open " .. path .. ": " .. tostring(err)) end
  local n = 0
  for line in f:lines() do
    n = n + 1
    local rec, bad = parse_line(line)
    if bad then
      skipped = skipped + 1
      io.stderr:write(string.format("bench_report: %s:%d: not a JSON object, skipped\n", path, n))
    elseif rec then
      local source = rec.source or ((tostring(rec.backend or ""):match("^torch_")) and "torch" or "attnlab")
      rec.source = source
      if rec.kind == "env" then
        envs[#envs + 1] = rec
      elseif rec.kind == "attention" then
        if rec.error then errors = errors + 1
        elseif tonumber(rec.s) and tonumber(rec.d) and rec.mask and rec.backend then
          records[#records + 1] = rec
        end
      end
    end
  end
  f:close()
end
if #records == 0 then
  die("no attention measurements in " .. table.concat(files, ", ")
    .. " (records with kind = \"attention\" and fwd_tflops/bwd_tflops; see the writers named in this script)")
end

---------------------------------------------------------------------------------------------------
-- grouping: chart (direction, mask, d) -> curve (backend[, layout]) -> s -> record
---------------------------------------------------------------------------------------------------
local DIRS = { { "fwd", "fwd_tflops", "forward" }, { "bwd", "bwd_tflops", "backward" } }

-- curve order and colours: ours first (fused, flash, unfused), then the peer's; a peer backend shares
-- the colour of ours that runs the same kind of kernel (cuDNN: fused / torch_cudnn; FA2: flash / torch_flash)
local ORDER = { fused = 1, flash = 2, unfused = 3, torch_cudnn = 11, torch_flash = 12, torch_efficient = 13 }
local COLOUR = { fused = plot.PALETTE[1], torch_cudnn = plot.PALETTE[1], flash = plot.PALETTE[2],
  torch_flash = plot.PALETTE[2], unfused = plot.PALETTE[3], torch_efficient = plot.PALETTE[5] }
local EXTRA_COLOURS = { plot.PALETTE[4], plot.PALETTE[6], plot.PALETTE[7], plot.PALETTE[8], plot.PALETTE[9], plot.PALETTE[10] }

local function is_peer(backend) return backend:match("^torch_") ~= nil end
local function curve_label(backend, layout)
  local name = is_peer(backend) and ("torch " .. backend:sub(7)) or backend
  if layout_sel == "all" then name = name .. " " .. layout end
  return name
end

local charts, chart_order, replaced = {}, {}, 0
for _, r in ipairs(records) do
  local layout = r.layout or "separate"
  if layout_sel == "all" or layout == layout_sel then
    for _, dir in ipairs(DIRS) do
      local v = tonumber(r[dir[2]])
      if v and v == v and v > -math.huge and v < math.huge then
        local key = string.format("%s|%s|%d", dir[1], r.mask, r.d)
        local c = charts[key]
        if not c then
          c = { dir = dir, mask = r.mask, d = tonumber(r.d), curves = {}, shapes = {} }
          charts[key] = c
          chart_order[#chart_order + 1] = key
        end
        local ckey = r.backend .. (layout_sel == "all" and ("|" .. layout) or "")
        local cu = c.curves[ckey]
        if not cu then
          cu = { backend = r.backend, layout = layout, points = {} }
          c.curves[ckey] = cu
        end
        local s = tonumber(r.s)
        if cu.points[s] then replaced = replaced + 1 end
        cu.points[s] = v
        c.shapes[s] = string.format("b=%s h=%s", tostring(r.b or "?"), tostring(r.h or "?"))
      end
    end
  end
end
if #chart_order == 0 then die("no measurements for layout " .. layout_sel .. " (try --layout all)") end

local MASK_ORDER = { no_mask = 1, causal = 2 }
table.sort(chart_order, function(a, b)
  local ca, cb = charts[a], charts[b]
  if ca.dir[1] ~= cb.dir[1] then return ca.dir[1] == "fwd" end
  if ca.mask ~= cb.mask then
    local ma, mb = MASK_ORDER[ca.mask] or 99, MASK_ORDER[cb.mask] or 99
    if ma ~= mb then return ma < mb end
    return ca.mask < cb.mask
  end
  return ca.d < cb.d
end)

local LAYOUT_ORDER = { separate = 1, bs3hd = 2 }
local function sorted_curves(c)
  local list = {}
  for _, cu in pairs(c.curves) do list[#list + 1] = cu end
  table.sort(list, function(a, b)
    local oa = ORDER[a.backend] or (is_peer(a.backend) and 19 or 9)
    local ob = ORDER[b.backend] or (is_peer(b.backend) and 19 or 9)
    if oa ~= ob then return oa < ob end
    if a.backend ~= b.backend then return a.backend < b.backend end
    local la, lb = LAYOUT_ORDER[a.layout] or 9, LAYOUT_ORDER[b.layout] or 9
    if la ~= lb then return la < lb end
    return a.layout < b.layout
  end)
  return list
end

---------------------------------------------------------------------------------------------------
-- charts and index
---------------------------------------------------------------------------------------------------
if os.execute("mkdir -p '" .. out_dir:gsub("'", "'\\''") .. "'") ~= 0 then die("cannot create " .. out_dir) end

local png_ok = want_png
local png_note
local function fmt(v) return v and string.format("%.1f", v) or "–" end

local idx = { "# Attention benchmark report", "" }
idx[#idx + 1] = "TFLOP/s against sequence length (bf16; forward 4·b·h·s²·d FLOPs, halved when causal; backward 2.5× the"
  .. " forward), one curve per backend; the peer's (PyTorch SDPA) curves are dashed and labelled \"torch ...\"."
  .. " Layout: " .. (layout_sel == "all" and "every layout, one curve each" or layout_sel) .. "."
idx[#idx + 1] = ""
idx[#idx + 1] = "Inputs: " .. table.concat(files, ", ")
local seen_env = {}
for _, e in ipairs(envs) do
  local cudnn = e.cudnn and tostring(e.cudnn)
  if cudnn and not cudnn:match("^cuDNN") then cudnn = "cuDNN " .. cudnn end
  local desc = string.format("%s: %s%s%s", e.source, tostring(e.device or "?"), cudnn and (", " .. cudnn) or "",
    e.torch and (", PyTorch " .. tostring(e.torch)) or "")
  if not seen_env[desc] then
    seen_env[desc] = true
    idx[#idx + 1] = "- " .. desc
  end
end
idx[#idx + 1] = ""

local written = 0
for _, key in ipairs(chart_order) do
  local c = charts[key]
  local suffix = layout_sel == "separate" and "" or ("_" .. layout_sel)
  local base = string.format("%s_%s_d%d%s", c.dir[1], c.mask, c.d, suffix)
  local title = string.format("%s, %s, head dim %d", c.dir[3], c.mask, c.d)
  local fig = plot.figure({ title = title, xlabel = "sequence length", ylabel = "TFLOP/s", xlog = 2, ymin = 0 })
  local curves = sorted_curves(c)
  local xs_all, extra = {}, 0
  for _, cu in ipairs(curves) do
    local xs, ys = {}, {}
    for s in pairs(cu.points) do xs[#xs + 1] = s end
    table.sort(xs)
    for i, s in ipairs(xs) do
      ys[i] = cu.points[s]
      xs_all[s] = true
    end
    local colour = COLOUR[cu.backend]
    if not colour then
      extra = extra + 1
      colour = EXTRA_COLOURS[(extra - 1) % #EXTRA_COLOURS + 1]
    end
    cu.label = curve_label(cu.backend, cu.layout)
    fig:line(xs, ys, { label = cu.label, color = colour, dash = is_peer(cu.backend) or nil, marker = true })
  end
  fig:save(out_dir .. "/" .. base .. ".svg")
  local png_line = ""
  if png_ok then
    local ok, err = pcall(fig.save, fig, out_dir .. "/" .. base .. ".png")
    if ok then png_line = string.format(" ([PNG](%s.png))", base)
    else png_ok, png_note = false, tostring(err) end
  end
  written = written + 1

  idx[#idx + 1] = "## " .. title
  idx[#idx + 1] = ""
  idx[#idx + 1] = string.format("![%s](%s.svg)%s", title, base, png_line)
  idx[#idx + 1] = ""
  local head, rule = { "s", "shape" }, { "---:", "---" }
  for _, cu in ipairs(curves) do head[#head + 1] = cu.label; rule[#rule + 1] = "---:" end
  idx[#idx + 1] = "| " .. table.concat(head, " | ") .. " |"
  idx[#idx + 1] = "|" .. table.concat(rule, "|") .. "|"
  local ss = {}
  for s in pairs(xs_all) do ss[#ss + 1] = s end
  table.sort(ss)
  for _, s in ipairs(ss) do
    local row = { tostring(s), c.shapes[s] }
    for _, cu in ipairs(curves) do row[#row + 1] = fmt(cu.points[s]) end
    idx[#idx + 1] = "| " .. table.concat(row, " | ") .. " |"
  end
  idx[#idx + 1] = ""
end

local notes = {}
if errors > 0 then notes[#notes + 1] = errors .. " measurement(s) with an error (a backend refusing a shape) left out" end
if replaced > 0 then notes[#notes + 1] = replaced .. " repeated measurement(s) replaced by the later one" end
if skipped > 0 then notes[#notes + 1] = skipped .. " line(s) that were not JSON skipped" end
if want_png and not png_ok then notes[#notes + 1] = "no PNG: " .. tostring(png_note):gsub("\n", " ") end
if #notes > 0 then
  idx[#idx + 1] = "Notes: " .. table.concat(notes, "; ") .. "."
  idx[#idx + 1] = ""
end

local f = assert(io.open(out_dir .. "/index.md", "w"))
f:write(table.concat(idx, "\n"))
f:close()
print(string.format("bench_report: %d chart%s (%d measurements) in %s/, listed in %s/index.md%s", written,
  written == 1 and "" or "s", #records, out_dir, out_dir, #notes > 0 and ("; " .. table.concat(notes, "; ")) or ""))
