--[[
attnlab.warnings — Python-style warnings for the Lua front end (al.warnings).

  al.warnings.warn(category, msg, level)   -- level 1 = the function calling warn, 2 = its caller, ...
  al.warnings.filter("once")               -- the policy: "once" (default), "always", "ignore", "error";
                                           -- returns the previous one
  local list = al.warnings.capture(fn, ...) -- the warnings fn raised: { {message=, category=, where=}, ... }

A warning prints to stderr as "attnlab: DeprecationWarning: <msg> (at file:line)", where file:line is
the Lua source line `level` frames up (the user's call site when a library function passes the right
level). Under "once" a warning is shown once per (category, call site, message), like Python's
default action; "error" raises it at the call site instead.

capture(fn, ...) records instead of printing, with a fresh "once" registry for the duration of fn, so
a test sees exactly the warnings fn raises however often that code ran before; it returns the list
followed by fn's own results. Errors in fn propagate after the state is restored.
]]
local M = {}

local POLICIES = { once = true, always = true, ignore = true, error = true }
local policy = "once"
local seen = {}        -- category .. "\0" .. where .. "\0" .. message -> true
local recorder = nil   -- a list while capture() runs

local function where_of(level)
  -- level counts from the function that called warn: frame 1 of warn's caller is getinfo(3) here.
  local info = debug.getinfo(level + 2, "Sl")
  if not info then return "?" end
  local src = info.short_src or "?"
  return src .. ":" .. tostring(info.currentline or 0)
end

function M.warn(category, msg, level)
  if type(category) ~= "string" then
    error("warnings.warn: category: expected a string such as 'DeprecationWarning', got " .. type(category), 2)
  end
  if type(msg) ~= "string" then error("warnings.warn: msg: expected a string, got " .. type(msg), 2) end
  level = level or 1
  if policy == "ignore" then return end
  local where = where_of(level)
  if policy == "error" then
    error("attnlab: " .. category .. ": " .. msg, level + 1)
  end
  if policy == "once" then
    local key = category .. "\0" .. where .. "\0" .. msg
    if seen[key] then return end
    seen[key] = true
  end
  if recorder then
    recorder[#recorder + 1] = { message = msg, category = category, where = where }
  else
    io.stderr:write("attnlab: ", category, ": ", msg, " (at ", where, ")\n")
  end
end

function M.filter(p)
  if not POLICIES[p] then
    error("warnings.filter: policy: expected 'once', 'always', 'ignore' or 'error', got " .. tostring(p), 2)
  end
  local old = policy
  policy = p
  return old
end

function M.policy() return policy end

-- Forget which call sites have warned (the next warning from each shows again).
function M.reset() seen = {} end

function M.capture(fn, ...)
  if type(fn) ~= "function" then error("warnings.capture: fn: expected a function, got " .. type(fn), 2) end
  local saved_rec, saved_seen = recorder, seen
  local list = {}
  recorder, seen = list, {}
  local res = { pcall(fn, ...) }
  recorder, seen = saved_rec, saved_seen
  if not res[1] then error(res[2], 0) end
  return list, unpack(res, 2, table.maxn(res))
end

function M.install(al)
  al.warnings = M
end

return M
