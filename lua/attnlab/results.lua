--[[
attnlab.results — experiment results as JSON lines (one JSON object per line), read back, and
charted with al.plot.

  local w = al.results.jsonl("out/attn.jsonl")          -- opts: {append = true} keeps what is there
  w:write{backend = "cpu", seq = 1024, tflops = 0.12}    -- one line, keys sorted, flushed at once
  w:close()
  local rows = al.results.read("out/attn.jsonl")         -- a list of tables
  al.results.chart(rows, {x = "seq", y = "tflops", series = "backend", xlog = 2}):save("attn.svg")

A line that is not valid JSON makes read() fail with its line number (a half-written last line, from
a run that was killed, is skipped with a warning on stderr).
]]
local json = require "attnlab.json"

local M = {}
M.json = json

local Writer = {}
Writer.__index = Writer

-- al.results.jsonl(path, opts) -> a writer with w:write(row), w:close(); opts.append keeps the file.
function M.jsonl(path, opts)
  if type(path) ~= "string" then error("results.jsonl: path: expected a file name, got " .. type(path), 2) end
  opts = opts or {}
  local f, err = io.open(path, opts.append and "a" or "w")
  if not f then error("results.jsonl: cannot open " .. path .. ": " .. tostring(err), 2) end
  return setmetatable({ path = path, f = f, count = 0 }, Writer)
end

-- w:write(row): row is a table of plain values (numbers, strings, booleans, nested tables).
function Writer:write(row)
  if not self.f then error("results writer: write after close (" .. self.path .. ")", 2) end
  if type(row) ~= "table" then error("results writer: row: expected a table, got " .. type(row), 2) end
  local ok, line = pcall(json.encode, row)
  if not ok then error("results writer: " .. tostring(line), 2) end
  self.f:write(line, "\n")
  self.f:flush()
  self.count = self.count + 1
  return self
end

function Writer:close()
  if self.f then self.f:close(); self.f = nil end
  return self.count
end

-- al.results.read(path) -> list of rows (json null becomes nil inside objects).
function M.read(path)
  local f, err = io.open(path, "r")
  if not f then error("results.read: cannot open " .. tostring(path) .. ": " .. tostring(err), 2) end
  local lines = {}
  for line in f:lines() do lines[#lines + 1] = line end
  f:close()
  local rows = {}
  for i, line in ipairs(lines) do
    if line:match("%S") then
      local ok, v = pcall(json.decode, line)
      if not ok then
        if i == #lines then
          io.stderr:write(string.format("results.read: %s:%d: skipping an incomplete last line\n", path, i))
        else
          error(string.format("results.read: %s:%d: %s", path, i, tostring(v)), 2)
        end
      else
        if type(v) == "table" then
          for k, x in pairs(v) do if x == json.null then v[k] = nil end end
        end
        rows[#rows + 1] = v
      end
    end
  end
  return rows
end

-- al.results.chart(rows or path, opts) -> an al.plot line figure: opts.x and opts.y name the fields,
-- opts.series (optional) the field that splits rows into curves (one per distinct value, sorted by x);
-- opts.where (optional) a function(row) -> bool filter. Other opts go to al.plot.figure (title,
-- xlabel, ylabel, xlog, ylog, ...); xlabel/ylabel default to the field names.
function M.chart(rows, opts)
  if type(rows) == "string" then rows = M.read(rows) end
  opts = opts or {}
  if type(rows) ~= "table" then error("results.chart: rows: expected a list of rows or a path, got " .. type(rows), 2) end
  if type(opts.x) ~= "string" or type(opts.y) ~= "string" then
    error("results.chart: opts.x and opts.y: expected field names, got " .. tostring(opts.x) .. " and " .. tostring(opts.y), 2)
  end
  local plot = require "attnlab.plot"
  local groups, order = {}, {}
  for _, r in ipairs(rows) do
    local x, y = tonumber(r[opts.x]), tonumber(r[opts.y])
    if x and y and (not opts.where or opts.where(r)) then
      local key = opts.series and tostring(r[opts.series]) or opts.y
      if not groups[key] then groups[key] = {}; order[#order + 1] = key end
      table.insert(groups[key], { x, y })
    end
  end
  if #order == 0 then
    error("results.chart: no row has numeric '" .. opts.x .. "' and '" .. opts.y .. "' fields", 2)
  end
  local fopts = {}
  for k, v in pairs(opts) do fopts[k] = v end
  fopts.xlabel = opts.xlabel or opts.x
  fopts.ylabel = opts.ylabel or opts.y
  local fig = plot.figure(fopts)
  for _, key in ipairs(order) do
    local pts = groups[key]
    table.sort(pts, function(a, b) return a[1] < b[1] end)
    local xs, ys = {}, {}
    for i, p in ipairs(pts) do xs[i], ys[i] = p[1], p[2] end
    fig:line(xs, ys, { label = opts.series and key or nil })
  end
  return fig
end

-- al.results.bench_emit(row): appends row, with source = "attnlab", as one JSON line to the file named
-- by $ATTNLAB_BENCH_OUT (the benchmarks' common output, read by scripts/bench_report.lua and
-- scripts/bench_compare.py beside the peer's); does nothing when the variable is unset.
local bench_out   -- the open writer, or false when $ATTNLAB_BENCH_OUT is unset
function M.bench_emit(row)
  if type(row) ~= "table" then error("results.bench_emit: row: expected a table, got " .. type(row), 2) end
  if bench_out == nil then
    local path = os.getenv("ATTNLAB_BENCH_OUT")
    bench_out = path and path ~= "" and M.jsonl(path, { append = true }) or false
  end
  if not bench_out then return end
  local rec = { source = "attnlab" }
  for k, v in pairs(row) do rec[k] = v end
  bench_out:write(rec)
end

-- al.results.median(list) -> the median of a list of numbers (the lower of the middle two for an even
-- count, so always one of the measurements); the list is not reordered. The benchmarks' interleaved rounds
-- report it (a single round of a 0.5 ms kernel can be 10-15% off).
function M.median(list)
  if type(list) ~= "table" then error("results.median: list: expected a table of numbers, got " .. type(list), 2) end
  if #list == 0 then error("results.median: list: expected at least one number, got an empty table", 2) end
  local c = {}
  for i, x in ipairs(list) do
    if type(x) ~= "number" or x ~= x then
      error(string.format("results.median: list[%d]: expected a number, got %s", i, x ~= x and "NaN" or tostring(x)), 2)
    end
    c[i] = x
  end
  table.sort(c)
  return c[math.floor((#c + 1) / 2)]
end

function M.install(al)
  al.results = M
end

return M
