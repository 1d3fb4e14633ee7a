-- bench_report_spec.lua — scripts/bench_report.lua (run with scripts/attnlab) on a synthetic pair of
-- JSON-lines files written the way the real writers write them: ours as bench/attention_gpu_bench.lua
-- (sorted keys, Lua %q strings, %.6g numbers) and bench/flash_bench.lua ("source" first, then sorted
-- pairs) do, the peer's as scripts/peer_torch_sdpa.py does (json.dumps(sort_keys=True); as captured from
-- its stdout, with "JSON " prefixes and table lines between). Random TFLOP/s values; the expected
-- curves (which backend has which points in which chart) are worked out here from the generated
-- records, independently of the script. Checks one polyline per backend with the right number of
-- points, plotted in sequence-length order at heights that follow the values, the legend's names,
-- the peer's curves dashed, the index's charts and numbers, PNGs, and the error paths.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."

package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local q, sh, read = shell.q, shell.sh, shell.read

local function report(args)
  return sh("cd " .. q(root) .. " && ATTNLAB_PROGRESS=plain " .. q(root .. "/scripts/attnlab") .. " scripts/bench_report.lua " .. args)
end

-- the writers' encodings ------------------------------------------------------------------------------
local function sorted_keys(rec)
  local keys = {}
  for k in pairs(rec) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- bench/attention_gpu_bench.lua's json()
local function ours_gpu_bench(rec)
  rec.source = "attnlab"
  local parts = {}
  for _, k in ipairs(sorted_keys(rec)) do
    local v = rec[k]
    local s
    if type(v) == "string" then s = string.format("%q", v):gsub("\\\n", "\\n")
    elseif type(v) == "number" then s = (v ~= v) and "null" or string.format("%.6g", v)
    else s = tostring(v) end
    parts[#parts + 1] = string.format("%q", k) .. ": " .. s
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- bench/flash_bench.lua's emit()
local function ours_flash_bench(rec)
  local parts = {}
  for k, v in pairs(rec) do
    local s = type(v) == "number" and string.format("%.6g", v) or string.format("%q", tostring(v))
    parts[#parts + 1] = string.format("%q: %s", k, s)
  end
  table.sort(parts)
  return "{\"source\": \"attnlab\", " .. table.concat(parts, ", ") .. "}"
end

-- scripts/peer_torch_sdpa.py's json.dumps(rec, sort_keys=True) (floats at full precision)
local function peer(rec)
  rec.source = "torch"
  local parts = {}
  for _, k in ipairs(sorted_keys(rec)) do
    local v = rec[k]
    local s
    if type(v) == "string" then s = '"' .. v:gsub('[\\"]', "\\%0") .. '"'
    -- math.type (Lua 5.3's integer subtype) where it exists: feature detection, LuaJIT has none
    elseif math.type and math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v) and k ~= "fwd_tflops" -- luacheck: ignore 143
      and k ~= "bwd_tflops") then s = string.format("%d", v)
    else s = string.format("%.17g", v) end
    parts[#parts + 1] = '"' .. k .. '": ' .. s
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- the synthetic measurement --------------------------------------------------------------------------
local SHAPES = { { 16, 16, 1024, 128 }, { 4, 16, 4096, 128 }, { 2, 16, 8192, 128 }, { 1, 16, 16384, 128 },
  { 4, 32, 4096, 64 } }
local MASKS, LAYOUTS = { "no_mask", "causal" }, { "separate", "bs3hd" }

-- which backend measures which shape (an entry false: the record is an error, left out of the chart)
local function plan(backend, s, d)
  if backend == "unfused" then return s <= 1024 end
  if backend == "flash" then return s >= 4096 and (d ~= 64 or "error") end
  if backend == "torch_efficient" then return s ~= 16384 or "error" end
  return true
end

local function make_inputs(dir)
  math.randomseed(20261203)
  local ours, peer_lines = {}, {}
  -- expected[layout][chart][label][s] = the value (chart = "fwd_causal_d128")
  local expected = { separate = {}, bs3hd = {} }
  local function expect(layout, dirn, mask, d, label, s, v)
    local chart = string.format("%s_%s_d%d", dirn, mask, d)
    local e = expected[layout]
    e[chart] = e[chart] or {}
    e[chart][label] = e[chart][label] or {}
    e[chart][label][s] = v
  end
  ours[#ours + 1] = ours_gpu_bench({ kind = "env", device = "NVIDIA H200", cudnn = "cuDNN 9.14.0" })
  peer_lines[#peer_lines + 1] = "JSON " .. peer({ kind = "env", device = "NVIDIA H200", torch = "2.11.0", cudnn = 91900 })
  peer_lines[#peer_lines + 1] = "shape (b,h,s,d)      mask    layout   backend       fwd ms  fwd TF/s"
  for _, sh_ in ipairs(SHAPES) do
    local b, h, s, d = sh_[1], sh_[2], sh_[3], sh_[4]
    for _, mask in ipairs(MASKS) do
      for _, layout in ipairs(LAYOUTS) do
        for _, be in ipairs({ "fused", "unfused", "flash", "torch_cudnn", "torch_flash", "torch_efficient" }) do
          local p = plan(be, s, d)
          if p then
            local rec = { kind = "attention", b = b, h = h, s = s, d = d, mask = mask, layout = layout, backend = be }
            if p == "error" then
              rec.error = "the flash kernels refuse this \"shape\""
            else
              -- 3 significant digits survive every writer's format exactly
              rec.fwd_tflops = math.floor(100 + 600 * math.random()) + 0.5
              rec.bwd_tflops = math.floor(50 + 500 * math.random()) + 0.25
              rec.fwd_ms, rec.bwd_ms = math.random(), math.random()
              local label = be:match("^torch_") and ("torch " .. be:sub(7)) or be
              expect(layout, "fwd", mask, d, label, s, rec.fwd_tflops)
              expect(layout, "bwd", mask, d, label, s, rec.bwd_tflops)
            end
            if be:match("^torch_") then
              peer_lines[#peer_lines + 1] = (#peer_lines % 2 == 0 and "JSON " or "") .. peer(rec)
            elseif be == "flash" then
              ours[#ours + 1] = ours_flash_bench(rec)
            else
              ours[#ours + 1] = ours_gpu_bench(rec)
            end
          end
        end
      end
    end
  end
  ours[#ours + 1] = ours_gpu_bench({ kind = "host_overhead", backend = "fused", us_per_call = 3.2, calls = 1000 })
  ours[#ours + 1] = ours_flash_bench({ kind = "host_phase", phase = "plan", us = 0 / 0 })   -- "nan": not JSON
  peer_lines[#peer_lines + 1] = '{"kind": "attention", "b": 1, "h'                         -- a cut-off last line
  local f = assert(io.open(dir .. "/al.jsonl", "w"))
  f:write(table.concat(ours, "\n"), "\n")
  f:close()
  f = assert(io.open(dir .. "/peer.jsonl", "w"))
  f:write(table.concat(peer_lines, "\n"), "\n")
  f:close()
  return expected
end

-- reading an SVG back ----------------------------------------------------------------------------------
local function polylines(svg)
  local out = {}
  for tag in svg:gmatch("<polyline [^>]*>") do
    local pts = {}
    for x, y in tag:match('points="([^"]*)"'):gmatch("([%d%.%-]+),([%d%.%-]+)") do pts[#pts + 1] = { tonumber(x), tonumber(y) } end
    out[#out + 1] = { label = tag:match('data%-label="([^"]*)"'), points = pts, dashed = tag:find("stroke-dasharray", 1, true) ~= nil }
  end
  return out
end

local function legend_labels(svg)
  local out = {}
  for l in svg:gmatch('<text [^>]*class="legend%-label"[^>]*>([^<]*)</text>') do out[#out + 1] = l end
  return out
end

local ORDER = { "fused", "flash", "unfused", "torch cudnn", "torch flash", "torch efficient" }

local function expected_labels(curves, suffixes)
  local out = {}
  for _, name in ipairs(ORDER) do
    for _, sfx in ipairs(suffixes or { "" }) do
      if curves[name .. sfx] then out[#out + 1] = name .. sfx end
    end
  end
  return out
end

describe("scripts/bench_report.lua", function()
  local tmp = os.tmpname()
  os.remove(tmp)
  assert(os.execute("mkdir -p " .. q(tmp)) == 0)
  teardown(function() os.execute("rm -rf " .. q(tmp)) end)
  local expected = make_inputs(tmp)
  local have_png = select(2, sh("command -v rsvg-convert >/dev/null || command -v gnuplot >/dev/null")) == 0

  describe("default layout (separate)", function()
    local out, rc
    setup(function()
      out, rc = report("--out " .. q(tmp .. "/r") .. " " .. q(tmp .. "/al.jsonl") .. " " .. q(tmp .. "/peer.jsonl"))
    end)

    it("runs, and says what it left out", function()
      assert(rc == 0, "bench_report failed (exit " .. tostring(rc) .. "):\n" .. out)
      assert.truthy(out:find("8 charts", 1, true), out)
      assert.truthy(out:find("peer.jsonl:%d+: not a JSON object"), out)     -- the cut-off line, named
      local idx = read(tmp .. "/r/index.md")
      -- errors: flash at d=64 (2 masks x 2 layouts), torch_efficient at s=16384 (2 x 2)
      assert.truthy(idx:find("8 measurement(s) with an error", 1, true), idx)
      assert.truthy(idx:find("- attnlab: NVIDIA H200, cuDNN 9.14.0\n", 1, true), idx)
      assert.truthy(idx:find("- torch: NVIDIA H200, cuDNN 91900, PyTorch 2.11.0\n", 1, true), idx)
    end)

    it("draws one polyline per backend, with one point per measured sequence length", function()
      assert(rc == 0, out)
      local n = 0
      for chart, curves in pairs(expected.separate) do
        n = n + 1
        local svg = read(tmp .. "/r/" .. chart .. ".svg")
        assert(svg, "no " .. chart .. ".svg")
        local want = expected_labels(curves)
        local lines = polylines(svg)
        assert.equals(#want, #lines, chart)
        for i, pl in ipairs(lines) do
          local label = want[i]
          assert.equals(label, pl.label, chart)
          local ss = {}
          for s in pairs(curves[label]) do ss[#ss + 1] = s end
          table.sort(ss)
          assert.equals(#ss, #pl.points, chart .. " " .. label)
          assert.equals(label:match("^torch ") ~= nil, pl.dashed, chart .. " " .. label .. ": only the peer's curves are dashed")
          for j = 2, #ss do
            -- x grows with s; a larger value sits higher (smaller y)
            assert.is_true(pl.points[j][1] > pl.points[j - 1][1], chart .. " " .. label)
            local dv = curves[label][ss[j]] - curves[label][ss[j - 1]]
            local dy = pl.points[j][2] - pl.points[j - 1][2]
            if dv == 0 then
              assert.is_true(math.abs(dy) < 0.2, chart .. " " .. label .. ": equal values at different heights")
            else
              assert.is_true(dv * dy < 0, chart .. " " .. label .. ": heights do not follow the values")
            end
          end
        end
        assert.same(want, legend_labels(svg), chart)
        local legend, peers = svg:match('<g class="legend">(.-)</g>'), 0
        for _, l in ipairs(want) do if l:match("^torch ") then peers = peers + 1 end end
        assert.equals(peers, select(2, legend:gsub("stroke%-dasharray", "")), chart .. ": dashed legend entries")
      end
      assert.equals(8, n)
    end)

    it("lists every chart in index.md with its numbers", function()
      assert(rc == 0, out)
      local idx = read(tmp .. "/r/index.md")
      local sections, cur = {}, nil
      for line in idx:gmatch("[^\n]*") do
        if line:match("^## ") then cur = line:sub(4); sections[cur] = ""
        elseif cur then sections[cur] = sections[cur] .. "\n" .. line end
      end
      local n = 0
      for chart, curves in pairs(expected.separate) do
        n = n + 1
        assert.truthy(idx:find("](" .. chart .. ".svg)", 1, true), chart)
        local dirn, mask, d = chart:match("^(%a+)_(.-)_d(%d+)$")
        local title = (dirn == "fwd" and "forward" or "backward") .. ", " .. mask .. ", head dim " .. d
        local body = sections[title]
        assert(body, "no section " .. title .. " in\n" .. idx)
        local cols = {}
        for c in body:match("\n(| s | shape |[^\n]*)"):gmatch("|%s*([^|]-)%s*%f[|]") do cols[#cols + 1] = c end
        assert.same({ "s", "shape", unpack(expected_labels(curves)) }, cols)
        local rows = {}
        for line in body:gmatch("\n(| %d+ |[^\n]*)") do
          local cells = {}
          for c in line:gmatch("|%s*([^|]-)%s*%f[|]") do cells[#cells + 1] = c end
          rows[tonumber(cells[1])] = cells
        end
        for j = 3, #cols do
          for s, row in pairs(rows) do
            local v = curves[cols[j]][s]
            assert.equals(v and string.format("%.1f", v) or "–", row[j], title .. ": " .. cols[j] .. " at s=" .. s)
          end
        end
      end
      assert.equals(8, n)
    end)

    it("writes PNGs when rsvg-convert or gnuplot is installed", function()
      assert(rc == 0, out)
      if not have_png then pending("neither rsvg-convert nor gnuplot is installed") return end
      for chart in pairs(expected.separate) do
        local png = read(tmp .. "/r/" .. chart .. ".png")
        assert(png and png:sub(1, 8) == "\137PNG\r\n\26\n", chart .. ".png missing or not a PNG")
      end
    end)
  end)

  it("--layout all: one curve per backend and layout; --no-png writes no PNG", function()
    local out, rc = report("--layout all --no-png --out " .. q(tmp .. "/all") .. " " .. q(tmp .. "/peer.jsonl") .. " "
      .. q(tmp .. "/al.jsonl"))
    assert(rc == 0, out)
    local curves = {}
    for _, layout in ipairs(LAYOUTS) do
      for label, pts in pairs(expected[layout].fwd_causal_d128) do curves[label .. " " .. layout] = pts end
    end
    local svg = read(tmp .. "/all/fwd_causal_d128_all.svg")
    assert(svg, out)
    local want = expected_labels(curves, { " separate", " bs3hd" })
    assert.equals(12, #want)
    assert.same(want, legend_labels(svg))
    for i, pl in ipairs(polylines(svg)) do
      local n = 0
      for _ in pairs(curves[want[i]]) do n = n + 1 end
      assert.equals(n, #pl.points, want[i])
    end
    assert.is_nil(read(tmp .. "/all/fwd_causal_d128_all.png"))
  end)

  it("fails clearly without inputs, without measurements, and on a bad option", function()
    local out, rc = report("")
    assert.equals(2, rc)
    assert.truthy(out:find("no input files", 1, true), out)
    local f = assert(io.open(tmp .. "/empty.jsonl", "w"))
    f:write('{"kind": "host_overhead", "backend": "fused", "us_per_call": 3}\n')
    f:close()
    out, rc = report("--out " .. q(tmp .. "/none") .. " " .. q(tmp .. "/empty.jsonl"))
    assert.equals(2, rc)
    assert.truthy(out:find("no attention measurements", 1, true), out)
    out, rc = report("--layout packed " .. q(tmp .. "/al.jsonl"))
    assert.equals(2, rc)
    assert.truthy(out:find("expected separate, bs3hd or all, got packed", 1, true), out)
    out, rc = report(q(tmp .. "/does_not_exist.jsonl"))
    assert.equals(2, rc)
    assert.truthy(out:find("cannot open", 1, true), out)
  end)
end)
