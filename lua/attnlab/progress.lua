--[[
attnlab.progress — progress for long work (benchmarks, sweeps): a bar with an ETA on a terminal,
plain lines otherwise (logs, CI, notebooks). Output goes to stderr by default, so a benchmark's
stdout (its numbers) is unchanged.

  local p = al.progress(#shapes, {label = "bench"})   -- total steps; opts: label, out, tty, width
  for i, s in ipairs(shapes) do run(s); p:step(1, "b=" .. s[1]) end
  p:done()
  for i, s in al.progress.ipairs(shapes, {label = "sweep"}) do ... end     -- the same, as an iterator

On a TTY the bar redraws in place (at most 10 times a second): `bench [#####-----] 3/6 50% 0:04 < 0:04 msg`.
Otherwise each step prints one line when there are at most 50 steps, else one line per 5%.
ATTNLAB_PROGRESS=0 silences it; ATTNLAB_PROGRESS=plain forces plain lines.
]]
local ffi = require "ffi"

local M = {}
local format, floor = string.format, math.floor

pcall(ffi.cdef, "int isatty(int fd);")
-- Declared under a name of our own (an asm label for the real symbol), so the REPL, benchmarks and
-- scripts can keep declaring clock_gettime with their own timespec structs. struct timespec is two
-- longs on LP64 Linux.
pcall(ffi.cdef, 'int al_progress_clock_gettime(int clk_id, int64_t *tp) __asm__("clock_gettime");')
local clock_gettime = ffi.C.al_progress_clock_gettime
local ts = ffi.new("int64_t[2]")
-- M.clock(): monotonic seconds (CLOCK_MONOTONIC).
function M.clock()
  clock_gettime(1, ts)
  return tonumber(ts[0]) + tonumber(ts[1]) * 1e-9
end

local function hms(s)
  if s ~= s or s == math.huge then return "?" end
  s = floor(s + 0.5)
  if s >= 3600 then return format("%d:%02d:%02d", floor(s / 3600), floor(s / 60) % 60, s % 60) end
  return format("%d:%02d", floor(s / 60), s % 60)
end
M.hms = hms

local Bar = {}
Bar.__index = Bar

-- al.progress(total, opts) -> a progress object. opts: label, out (a file, default io.stderr),
-- tty (force the bar on or off), width (bar characters, default 30), clock (a function, for tests).
function M.new(total, opts)
  opts = opts or {}
  if type(total) ~= "number" or total < 0 then
    error("progress: total: expected a non-negative number of steps, got " .. tostring(total), 2)
  end
  local out = opts.out or io.stderr
  local mode = os.getenv("ATTNLAB_PROGRESS")
  local tty = opts.tty
  if tty == nil then
    tty = false
    if out == io.stderr or out == io.stdout then
      local ok, r = pcall(ffi.C.isatty, out == io.stderr and 2 or 1)
      tty = ok and r == 1
    end
  end
  if mode == "plain" then tty = false end
  local clock = opts.clock or M.clock
  return setmetatable({ total = total, n = 0, label = opts.label or "progress", out = out, tty = tty,
    width = opts.width or 30, clock = clock, t0 = clock(), last_draw = -1, last_pct = -1,
    silent = (mode == "0") or opts.silent, lines = 0 }, Bar)
end

-- The status text for the current count: "label 3/6 50% elapsed 0:04 eta 0:04 msg".
function Bar:text(msg)
  local el = self.clock() - self.t0
  local frac = self.total > 0 and self.n / self.total or 1
  local eta = (self.n > 0 and self.total > 0) and el / self.n * (self.total - self.n) or math.huge
  local s = format("%s %d/%d %3d%% elapsed %s eta %s", self.label, self.n, self.total, floor(frac * 100 + 1e-9), hms(el),
    self.n >= self.total and "0:00" or hms(eta))
  if msg and msg ~= "" then s = s .. " " .. msg end
  return s, frac, el, eta
end

function Bar:draw(msg, final)
  if self.silent then return end
  local s, frac, el, eta = self:text(msg)
  if self.tty then
    local now = self.clock()
    if not final and now - self.last_draw < 0.1 then return end
    self.last_draw = now
    local full = floor(frac * self.width + 1e-9)
    local bar = string.rep("#", full) .. string.rep("-", self.width - full)
    local line = format("%s [%s] %d/%d %3d%% %s < %s", self.label, bar, self.n, self.total, floor(frac * 100 + 1e-9),
      hms(el), self.n >= self.total and "0:00" or hms(eta))
    if msg and msg ~= "" then line = line .. " " .. msg end
    self.out:write("\r\27[K", line, final and "\n" or "")
  else
    local pct = self.total > 0 and floor(frac * 20 + 1e-9) or 20   -- 5% steps
    if self.total > 50 and pct == self.last_pct and not final then return end
    self.last_pct = pct
    self.out:write(s, "\n")
    self.lines = self.lines + 1
  end
  self.out:flush()
end

-- p:step(k, msg): k more steps done (default 1); msg is shown after the counts.
function Bar:step(k, msg)
  if type(k) == "string" then k, msg = 1, k end
  self.n = math.min(self.n + (k or 1), self.total)
  self:draw(msg, false)
  return self
end

-- p:update(n, msg): n steps done in all.
function Bar:update(n, msg)
  self.n = math.min(n, self.total)
  self:draw(msg, false)
  return self
end

-- p:done(msg): finish (the bar's line ends; in plain mode a final line if the last was skipped).
-- Returns the elapsed seconds.
function Bar:done(msg)
  if self.finished then return self.elapsed end
  self.finished = true
  self.n = self.total
  if self.tty or self.last_pct ~= 20 or msg then self:draw(msg, true) end
  self.elapsed = self.clock() - self.t0
  return self.elapsed
end

-- al.progress.ipairs(list, opts): ipairs with a progress step after each item.
function M.ipairs(list, opts)
  local p = M.new(#list, opts)
  local i = 0
  return function()
    if i > 0 then p:step(1) end
    i = i + 1
    if list[i] == nil then p:done(); return nil end
    return i, list[i]
  end
end

function M.install(al)
  al.clock = M.clock -- monotonic seconds, for scripts and benchmarks
  al.progress = setmetatable({ new = M.new, ipairs = M.ipairs, clock = M.clock, Bar = Bar },
    { __call = function(_, total, opts) return M.new(total, opts) end })
end

return M
