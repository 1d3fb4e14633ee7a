-- progress_spec.lua — al.progress (bar on a TTY, plain lines otherwise, ETA from a fake clock),
-- al.results (JSON lines written, read back, charted) and the JSON codec under them.
local al = require "attnlab"
local json = require "attnlab.json"

-- A file-like sink that records writes.
local function sink()
  local s = { buf = {} }
  function s:write(...) for _, v in ipairs({ ... }) do self.buf[#self.buf + 1] = v end return self end
  function s:flush() end
  function s:text() return table.concat(self.buf) end
  return s
end

describe("al.progress", function()
  it("plain mode: one line per step with counts, percent and ETA from the clock", function()
    local t = 0
    local out = sink()
    local p = al.progress(4, { label = "sweep", out = out, tty = false, clock = function() return t end })
    for i = 1, 4 do t = t + 2; p:step(1, "item " .. i) end
    local elapsed = p:done()
    assert.equal(8, elapsed)
    local lines = {}
    for l in out:text():gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(4, #lines)
    assert.equal("sweep 1/4  25% elapsed 0:02 eta 0:06 item 1", lines[1])
    assert.equal("sweep 4/4 100% elapsed 0:08 eta 0:00 item 4", lines[4])
  end)

  it("plain mode with many steps prints about one line per 5%", function()
    local out = sink()
    local p = al.progress(1000, { out = out, tty = false, clock = function() return 0 end })
    for _ = 1, 1000 do p:step() end
    p:done()
    local n = select(2, out:text():gsub("\n", ""))
    assert.is_true(n >= 20 and n <= 22, "lines: " .. n)
  end)

  it("tty mode: a bar redrawn in place, ending with a newline", function()
    local t = 0
    local out = sink()
    local p = al.progress(10, { label = "bench", out = out, tty = true, width = 10, clock = function() return t end })
    t = 1; p:update(5)
    t = 3; p:done()
    local s = out:text()
    assert.truthy(s:find("\r\27[K", 1, true))
    assert.truthy(s:find("bench [#####-----] 5/10  50% 0:01 < 0:01", 1, true), s)
    assert.truthy(s:find("bench [##########] 10/10 100% 0:03 < 0:00\n", 1, true), s)
  end)

  it("progress.ipairs visits every item once and finishes the bar", function()
    local out, seen = sink(), {}
    for i, v in al.progress.ipairs({ "a", "b", "c" }, { out = out, tty = false }) do seen[#seen + 1] = i .. v end
    assert.same({ "1a", "2b", "3c" }, seen)
    assert.truthy(out:text():find("3/3 100%", 1, true))
  end)

  it("rejects a bad total", function()
    assert.has_error(function() al.progress(-1) end)
  end)
end)

describe("al.results", function()
  it("bench_emit appends tagged JSON lines to $ATTNLAB_BENCH_OUT, and does nothing without it", function()
    local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
    local path = os.tmpname()
    local f = assert(io.open(path, "w")); f:write('{"kept": 1}\n'); f:close()
    local code = "al.results.bench_emit{kind = 'x', ms = 1.5, bad = 0/0}; al.results.bench_emit{kind = 'y'}"
    local launcher = root .. "/scripts/attnlab"
    assert.is_true(os.execute("ATTNLAB_BENCH_OUT='" .. path .. "' '" .. launcher .. "' -e \"" .. code .. "\"") == 0)
    assert.is_true(os.execute("ATTNLAB_BENCH_OUT= '" .. launcher .. "' -e \"" .. code .. "\"") == 0)
    local rows = al.results.read(path)
    os.remove(path)
    assert.equal(3, #rows)
    assert.equal(1, rows[1].kept)
    assert.same({ "x", "attnlab", 1.5 }, { rows[2].kind, rows[2].source, rows[2].ms })
    assert.is_nil(rows[2].bad)   -- NaN is written as null
    assert.same({ "y", "attnlab" }, { rows[3].kind, rows[3].source })
    assert.has_error(function() al.results.bench_emit(3) end, "results.bench_emit: row: expected a table, got number")
  end)

  it("median: one of the measurements, the list left as it was; bad lists are errors naming the argument", function()
    local t = { 3.5, 1.25, 9, 2 }
    assert.equal(2, al.results.median(t))            -- even count: the lower middle
    assert.same({ 3.5, 1.25, 9, 2 }, t)
    assert.equal(3.5, al.results.median({ 7, 3.5, 1 }))
    assert.equal(4, al.results.median({ 4 }))
    assert.has_error(function() al.results.median({}) end,
      "results.median: list: expected at least one number, got an empty table")
    assert.has_error(function() al.results.median(5) end, "results.median: list: expected a table of numbers, got number")
    assert.has_error(function() al.results.median({ 1, "x" }) end, "results.median: list[2]: expected a number, got x")
    assert.has_error(function() al.results.median({ 0 / 0 }) end, "results.median: list[1]: expected a number, got NaN")
  end)

  it("JSON lines round-trip: strings with quotes and newlines, floats, nested tables", function()
    local path = os.tmpname()
    local w = al.results.jsonl(path)
    local rows = {}
    math.randomseed(11)
    for i = 1, 20 do
      rows[i] = { backend = ({ "cpu", "fused" })[i % 2 + 1], seq = 2 ^ (6 + i % 5), tflops = math.random() * 100,
        note = 'a "quoted"\nline\t' .. i, shape = { 1, 16, 2 ^ (6 + i % 5), 128 }, ok = i % 3 == 0 }
      w:write(rows[i])
    end
    assert.equal(20, w:close())
    local back = al.results.read(path)
    assert.same(rows, back)
    local f = io.open(path)
    local n = 0
    for _ in f:lines() do n = n + 1 end
    f:close()
    assert.equal(20, n)
    -- chart: one series per backend, points sorted by x
    local fig = al.results.chart(path, { x = "seq", y = "tflops", series = "backend", xlog = 2 })
    assert.equal(2, #fig.series)
    for _, se in ipairs(fig.series) do
      for i = 2, #se.x do assert.is_true(se.x[i - 1] <= se.x[i]) end
    end
    assert.equal("seq", fig.xlabel)
    os.remove(path)
  end)

  it("read skips a half-written last line and fails on a bad middle line", function()
    local path = os.tmpname()
    local f = io.open(path, "w")
    f:write('{"a":1}\n{"a":2}\n{"a":')
    f:close()
    assert.same({ { a = 1 }, { a = 2 } }, al.results.read(path))
    f = io.open(path, "w")
    f:write('{"a":1}\n{oops}\n{"a":3}\n')
    f:close()
    local ok, err = pcall(al.results.read, path)
    assert.is_false(ok)
    assert.truthy(err:find(":2:", 1, true), err)
    os.remove(path)
  end)

  it("json: encodes deterministically and decodes escapes and unicode", function()
    assert.equal('{"a":[1,2.5,"x\\n"],"b":true,"c":null}', json.encode({ c = json.null, b = true, a = { 1, 2.5, "x\n" } }))
    assert.same({ s = "é€😀", n = -1.5e-3 }, json.decode('{"s":"\\u00e9\\u20ac\\ud83d\\ude00","n":-1.5e-3}'))
    assert.equal(0.1, json.decode(json.encode(0.1)))
    assert.equal("null", json.encode(0 / 0))
    assert.has_error(function() json.decode("[1,2") end)
  end)
end)
